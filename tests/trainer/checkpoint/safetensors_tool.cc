// Helper for safetensors_interop.py: `write OUT` writes a fixed set of tensors with ferry's
// writer; `dump IN` reads a file with ferry's reader and prints it as JSON on stdout.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "trainer/checkpoint/safetensors.h"

namespace {

using ferry::DType;
using ferry::SafetensorsTensor;
using ferry::Shape;

// The values are formulas the Python side recomputes.
int write_fixture(const std::string& path) {
  std::vector<float> weight(4 * 3 * 3 * 3);  // (4, 3, 3, 3): conv.weight[i] = i * 0.25 - 3
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = static_cast<float>(i) * 0.25f - 3.0f;
  std::vector<float> bias = {0.5f, -0.5f, 1.0f, -1.0f};
  std::vector<double> f64 = {0.1, -2.5, 1e-300};
  std::vector<int32_t> i32 = {-7, 0, 2147483647, -2147483647 - 1, 5, 6};
  int64_t step = 1234567890123;  // scalar
  std::vector<uint8_t> u8 = {0, 17, 255};
  ferry::write_safetensors(path,
                           {
                               {"conv.weight", DType::kF32, Shape{4, 3, 3, 3}, weight.data()},
                               {"conv.bias", DType::kF32, Shape{4}, bias.data()},
                               {"extra.f64", DType::kF64, Shape{3}, f64.data()},
                               {"extra.i32", DType::kI32, Shape{2, 3}, i32.data()},
                               {"extra.step", DType::kI64, Shape{}, &step},
                               {"extra.u8", DType::kU8, Shape{3}, u8.data()},
                               {"extra.empty", DType::kF32, Shape{0}, nullptr},
                           },
                           {{"format", "pt"}});
  return 0;
}

template <typename T>
nlohmann::json values(const ferry::SafetensorsEntry& e) {
  std::vector<T> v(e.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
  return v;
}

int dump(const std::string& path) {
  const ferry::SafetensorsFile f = ferry::read_safetensors(path);
  nlohmann::json out;
  out["metadata"] = f.metadata();
  out["tensors"] = nlohmann::json::array();
  for (const auto& e : f.entries()) {
    nlohmann::json t;
    t["name"] = e.name;
    t["dtype"] = std::string(ferry::dtype_name(e.dtype));
    t["shape"] = e.shape.dims();
    switch (e.dtype) {
      case DType::kF32:
        t["values"] = values<float>(e);
        break;
      case DType::kF64:
        t["values"] = values<double>(e);
        break;
      case DType::kI32:
        t["values"] = values<int32_t>(e);
        break;
      case DType::kI64:
        t["values"] = values<int64_t>(e);
        break;
      case DType::kU8:
        t["values"] = values<uint8_t>(e);
        break;
      case DType::kBF16:  // the reader widens BF16 to F32: never an entry's dtype
        t["values"] = nullptr;
        break;
    }
    out["tensors"].push_back(t);
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: safetensors_tool write OUT | dump IN\n";
    return 2;
  }
  try {
    const std::string cmd = argv[1];
    if (cmd == "write") return write_fixture(argv[2]);
    if (cmd == "dump") return dump(argv[2]);
    std::cerr << "unknown command " << cmd << "\n";
    return 2;
  } catch (const ferry::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
