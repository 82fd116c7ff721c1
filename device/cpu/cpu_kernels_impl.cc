// The oneDNN engine, per-thread streams and primitive plans shared by the CPU kernel families.
// Invariant: a plan's workspace_bytes() is exactly what execute() reads from the workspace.
#include "device/cpu/cpu_kernels_impl.h"

#include <omp.h>

#include <algorithm>

#include <fmt/format.h>

#include "device/kernel_checks.h"

namespace ferry::cpu {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine = DNNL_CHECK(dnnl::engine(dnnl::engine::kind::cpu, 0));
  return engine;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream = DNNL_CHECK(dnnl::stream(cpu_engine()));
  return stream;
}

OmpThreadsScope::OmpThreadsScope(int threads) : saved_(omp_get_max_threads()) {
  if (threads > 0 && threads != saved_) {
    omp_set_num_threads(threads);
  } else {
    saved_ = 0;  // nothing to restore
  }
}

OmpThreadsScope::~OmpThreadsScope() {
  if (saved_ > 0) omp_set_num_threads(saved_);
}

dnnl::memory::desc plain_desc(const dnnl::memory::dims& dims, dnnl::memory::data_type type) {
  dnnl::memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strided_desc(dims, strides, type);
}

dnnl::memory::desc strided_desc(const dnnl::memory::dims& dims, const dnnl::memory::dims& strides,
                                dnnl::memory::data_type type) {
  return DNNL_CHECK(dnnl::memory::desc(dims, type, strides));
}

dnnl::memory::data_type dnnl_type(DType dtype) {
  FERRY_ASSERT(dtype == DType::kF32 || dtype == DType::kBF16, "a kernel stores fp32 or bf16");
  return dtype == DType::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

bool cpu_has_bf16() {
  static const bool has = [] {
    const auto isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return has;
}

bool cpu_has_amx() {
  static const bool has = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  return has;
}

std::shared_ptr<const PrimitivePlan> matmul_plan(PlanCache& plans, const PlanKey& key,
                                                 const dnnl::memory::desc& src,
                                                 const dnnl::memory::desc& weights,
                                                 const dnnl::memory::desc* bias,
                                                 const dnnl::memory::desc& dst) {
  return plans.plan<PrimitivePlan>(key, [&] {
    PrimitivePlan plan(/*user_scratchpad=*/true);
    const auto desc =
        bias ? dnnl::matmul::desc(src, weights, *bias, dst) : dnnl::matmul::desc(src, weights, dst);
    auto pd = DNNL_CHECK(dnnl::matmul::primitive_desc(desc, plan.attr(), cpu_engine()));
    plan.add(DNNL_ARG_SRC, false, src, src);
    plan.add(DNNL_ARG_WEIGHTS, false, weights, weights);
    if (bias) plan.add(DNNL_ARG_BIAS, false, *bias, *bias);
    plan.add(DNNL_ARG_DST, true, dst, dst);
    plan.finish(DNNL_CHECK(dnnl::matmul(pd)), pd.scratchpad_desc());
    return plan;
  });
}

dnnl::primitive_attr PrimitivePlan::attr() const {
  dnnl::primitive_attr attr;
  DNNL_CHECK(attr.set_scratchpad_mode(user_scratchpad_ ? dnnl::scratchpad_mode::user
                                                       : dnnl::scratchpad_mode::library));
  return attr;
}

void PrimitivePlan::add(int arg, bool output, const dnnl::memory::desc& user,
                        const dnnl::memory::desc& inner) {
  Operand op;
  op.arg = arg;
  op.output = output;
  op.user = user;
  op.inner = inner;
  if (user != inner) {
    const auto& from = output ? inner : user;
    const auto& to = output ? user : inner;
    auto pd =
        DNNL_CHECK(dnnl::reorder::primitive_desc(cpu_engine(), from, cpu_engine(), to, attr()));
    if (user_scratchpad_) {
      scratchpad_bytes_ = std::max<uint64_t>(scratchpad_bytes_, pd.scratchpad_desc().get_size());
    }
    op.reorder = DNNL_CHECK(dnnl::reorder(pd));
  }
  operands_.push_back(std::move(op));
}

void PrimitivePlan::finish(dnnl::primitive prim, const dnnl::memory::desc& scratchpad) {
  prim_ = std::move(prim);
  if (user_scratchpad_) {
    scratchpad_bytes_ = std::max<uint64_t>(scratchpad_bytes_, scratchpad.get_size());
  }
  uint64_t offset = align_up(scratchpad_bytes_, kWorkspaceAlign);
  for (auto& op : operands_) {
    if (!op.reorder) continue;
    op.offset = offset;
    offset += align_up(op.inner.get_size(), kWorkspaceAlign);
  }
  workspace_bytes_ = offset;
}

bool PrimitivePlan::has(int arg) const {
  return std::any_of(operands_.begin(), operands_.end(),
                     [arg](const Operand& op) { return op.arg == arg; });
}

void PrimitivePlan::execute(const std::vector<std::pair<int, const void*>>& ptrs,
                            const Workspace& ws, std::string_view what) const {
  check_workspace(ws, workspace_bytes_, what);
  dnnl::engine& engine = cpu_engine();
  dnnl::stream& stream = thread_stream();
  auto* base = static_cast<char*>(ws.ptr);
  std::unordered_map<int, dnnl::memory> args;
  auto reorder_args = [&](const dnnl::memory& from, const dnnl::memory& to) {
    std::unordered_map<int, dnnl::memory> r{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    if (auto it = args.find(DNNL_ARG_SCRATCHPAD); it != args.end()) {
      r[DNNL_ARG_SCRATCHPAD] = it->second;
    }
    return r;
  };
  std::vector<std::pair<const Operand*, dnnl::memory>> staged_outputs;
  try {
    if (user_scratchpad_ && scratchpad_bytes_ > 0) {
      const dnnl::memory::desc desc({static_cast<dnnl::memory::dim>(scratchpad_bytes_)},
                                    dnnl::memory::data_type::u8, dnnl::memory::format_tag::x);
      args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(desc, engine, base);
    }
    for (const Operand& op : operands_) {
      auto it =
          std::find_if(ptrs.begin(), ptrs.end(), [&](const auto& p) { return p.first == op.arg; });
      FERRY_ASSERT(it != ptrs.end() && it->second != nullptr,
                   fmt::format("{}: no pointer for oneDNN argument {}", what, op.arg));
      dnnl::memory user(op.user, engine, const_cast<void*>(it->second));
      if (!op.reorder) {
        args[op.arg] = user;
        continue;
      }
      dnnl::memory inner(op.inner, engine, base + op.offset);
      args[op.arg] = inner;
      if (op.output) {
        staged_outputs.emplace_back(&op, user);
      } else {
        op.reorder->execute(stream, reorder_args(user, inner));
      }
    }
    prim_.execute(stream, args);
    for (auto& [op, user] : staged_outputs) {
      op->reorder->execute(stream, reorder_args(args.at(op->arg), user));
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    throw LibraryError("oneDNN", fmt::format("executing the {} primitive", what), e.what(),
                       __FILE__, __LINE__);
  }
}

}  // namespace ferry::cpu
