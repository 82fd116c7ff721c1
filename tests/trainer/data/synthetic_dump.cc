// Helper for synthetic_learnable.py: writes samples of the synthetic task as raw little-endian
// float32 pixels (N, C, H, W) followed by int32 labels (N).
// Usage: synthetic_dump C H W CLASSES SAMPLES SEED OUT
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <vector>

#include "common/error.h"
#include "trainer/data/dataset.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::cerr << "usage: synthetic_dump C H W CLASSES SAMPLES SEED OUT\n";
    return 2;
  }
  try {
    const ferry::Shape chw{std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3])};
    const int64_t samples = std::atoll(argv[5]);
    auto ds = ferry::make_synthetic_dataset(chw, std::atoll(argv[4]), samples,
                                            std::strtoull(argv[6], nullptr, 10));
    std::vector<float> pixels(static_cast<size_t>(chw.numel() * samples));
    std::vector<int32_t> labels(static_cast<size_t>(samples));
    for (int64_t i = 0; i < samples; ++i) labels[i] = ds->get(i, pixels.data() + i * chw.numel());
    std::ofstream out(argv[7], std::ios::binary);
    out.write(reinterpret_cast<const char*>(pixels.data()), pixels.size() * 4);
    out.write(reinterpret_cast<const char*>(labels.data()), labels.size() * 4);
    return out ? 0 : 1;
  } catch (const ferry::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
