// The bf16 matrix products of the linear kernels as fp32 oneDNN matmuls on widened operands, in
// row chunks through the workspace (Note [bf16 products in fp32]). Invariant: each row of C is
// the fp32 matmul's row on the widened inputs, rounded once, whatever the chunking.
#include <algorithm>

#include <fmt/format.h>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {

// Note [bf16 products in fp32]
// On a CPU without AMX, oneDNN's bf16 convolution and matmul run on VDPBF16PS, which on this
// project's machine (an avx512_bf16 Xeon, oneDNN 2.6) issues one 512-bit instruction every two
// cycles against two FMAs a cycle: 32 against 64 flops per cycle, so the native bf16 primitives
// ran 1.3-1.8x slower than fp32 (bench_bf16_kernel_timing; docs/benchmarks.md). Repacking the
// weights was not the cost: oneDNN's bf16 matmul took as long on weights reordered once into
// its own layout. So by default (Bf16Products::kAuto, native only where oneDNN uses AMX) the
// bf16 kernels run oneDNN's fp32 primitives on the bf16 values widened (exact):
//  - Convolution: the primitive's layouts are fp32, and the plan's reorders between the plain
//    bf16 tensors and those layouts widen and narrow (PrimitivePlan; the fp32 kernel reorders
//    its activations anyway), staged in the workspace as the fp32 kernel's are.
//  - Linear: WidenedMatmul widens B (the weights, or an activation in backward weights) whole,
//    then A's rows in chunks of about kWidenedChunkBytes, and narrows C's rows from a chunk-sized
//    fp32 buffer: the workspace stays bounded by about twice B's fp32 bytes (a GPT-2 LM head at
//    8 x 1024 tokens stages 0.3 GB, not 1.6 GB of logits) whatever the row count.
// Each output is then the fp32 kernel's result on the bf16 inputs rounded once to bf16, bitwise
// (widened_matmul_test.cc checks it, chunked and whole): the widened kernels' rule (Note
// [Widened bf16 kernels] in kernels_bf16.cc). oneDNN's narrowing treats fp32 subnormal results
// as zero (float_to_bf16_daz), as its native bf16 primitives do.
// The weights are widened on every call, not cached per update: the widening is one pass over
// the bf16 weights (0.1-0.2 ms for a 384x1536 layer against 13-18 ms of product), and a cache
// would hold an fp32 copy of every weight outside the planned budget.

namespace {

using dnnl::memory;

const dnnl_dims_t& strides_of(const memory::desc& d) { return d.data.format_desc.blocking.strides; }

// The fp32 staging of `rows` rows of `user` (rows, cols), densely packed in the order of the
// user's layout: row-major, or column-major for a transposed view.
memory::desc dense_f32(const memory::desc& user, int64_t rows) {
  const auto& s = strides_of(user);
  const int64_t cols = user.dims()[1];
  return s[0] < s[1] ? strided_desc({rows, cols}, {1, rows}) : plain_desc({rows, cols});
}

// `user` (rows, cols) restricted to its first `rows` rows, the strides kept.
memory::desc first_rows(const memory::desc& user, int64_t rows) {
  const auto& s = strides_of(user);
  return strided_desc({rows, user.dims()[1]}, {s[0], s[1]}, user.data_type());
}

int64_t row_stride(const memory::desc& user) { return strides_of(user)[0]; }

}  // namespace

int64_t widened_chunk_rows(int64_t rows, int64_t inner, int64_t cols, int64_t b_bytes) {
  const int64_t row_bytes = 4 * (inner + cols);
  if (row_bytes == 0) return rows;
  // Every chunk reads all of B: chunks staging at least B's bytes keep those reads a fraction
  // of the work (a GPT LM head's 77 MB of widened weights read 6 times, not 32).
  const int64_t target = std::max(kWidenedChunkBytes, b_bytes);
  int64_t r = std::max<int64_t>(target / row_bytes, 64);
  r = r / 32 * 32;
  return std::min(rows, r);
}

WidenedMatmul::WidenedMatmul(const memory::desc& a, const memory::desc& b, const memory::desc* bias,
                             const memory::desc& c, const dnnl::primitive_attr& attr)
    : a_(a), b_(b), c_(c), has_bias_(bias != nullptr) {
  using dt = memory::data_type;
  const int64_t rows = a.dims()[0], inner = a.dims()[1], cols = b.dims()[1];
  // Only staged rows count: an fp32 C (backward weights' dw) is written in place.
  chunk_rows_ = widened_chunk_rows(rows, a.data_type() == dt::f32 ? 0 : inner,
                                   c.data_type() == dt::f32 ? 0 : cols, 4 * inner * cols);
  a_elem_ = static_cast<int64_t>(memory::data_type_size(a.data_type()));
  c_elem_ = static_cast<int64_t>(memory::data_type_size(c.data_type()));
  // B whole, fp32 with the user's strides.
  b32_ = strided_desc(b.dims(), {strides_of(b)[0], strides_of(b)[1]});
  if (bias != nullptr) bias_ = *bias;
  uint64_t scratch = 0;
  auto reorder = [&](const memory::desc& from, const memory::desc& to) {
    auto pd = DNNL_CHECK(dnnl::reorder::primitive_desc(cpu_engine(), from, cpu_engine(), to, attr));
    scratch = std::max<uint64_t>(scratch, pd.scratchpad_desc().get_size());
    return DNNL_CHECK(dnnl::reorder(pd));
  };
  if (b.data_type() != dt::f32) b_widen_ = reorder(b, b32_);
  for (int64_t len : {chunk_rows_, rows % chunk_rows_}) {
    if (len == 0) continue;
    Chunk ch;
    ch.rows = len;
    ch.a_user = first_rows(a, len);
    ch.c_user = first_rows(c, len);
    ch.a32 = a.data_type() == dt::f32 ? ch.a_user : dense_f32(a, len);
    ch.c32 = c.data_type() == dt::f32 ? ch.c_user : plain_desc({len, cols});
    if (a.data_type() != dt::f32) ch.a_widen = reorder(ch.a_user, ch.a32);
    if (c.data_type() != dt::f32) ch.c_narrow = reorder(ch.c32, ch.c_user);
    const auto desc = bias ? dnnl::matmul::desc(ch.a32, b32_, *bias, ch.c32)
                           : dnnl::matmul::desc(ch.a32, b32_, ch.c32);
    auto pd = DNNL_CHECK(dnnl::matmul::primitive_desc(desc, attr, cpu_engine()));
    scratch = std::max<uint64_t>(scratch, pd.scratchpad_desc().get_size());
    ch.matmul = DNNL_CHECK(dnnl::matmul(pd));
    chunks_.push_back(std::move(ch));
  }
  // Workspace: [scratchpad | B fp32 | A chunk fp32 | C chunk fp32], each 64-byte aligned.
  scratchpad_bytes_ = scratch;
  uint64_t offset = align_up(scratch, kWorkspaceAlign);
  b_offset_ = offset;
  if (b_widen_) offset += align_up(b32_.get_size(), kWorkspaceAlign);
  a_offset_ = offset;
  uint64_t a_bytes = 0, c_bytes = 0;
  for (const Chunk& ch : chunks_) {
    if (ch.a_widen) a_bytes = std::max(a_bytes, align_up(ch.a32.get_size(), kWorkspaceAlign));
    if (ch.c_narrow) c_bytes = std::max(c_bytes, align_up(ch.c32.get_size(), kWorkspaceAlign));
  }
  c_offset_ = a_offset_ + a_bytes;
  workspace_bytes_ = c_offset_ + c_bytes;
}

void WidenedMatmul::execute(const void* a, const void* b, const void* bias, void* c,
                            const Workspace& ws, std::string_view what) const {
  check_workspace(ws, workspace_bytes_, what);
  FERRY_ASSERT(a != nullptr && b != nullptr && c != nullptr && (bias != nullptr) == has_bias_,
               fmt::format("{}: an operand pointer is missing", what));
  dnnl::engine& engine = cpu_engine();
  dnnl::stream& stream = thread_stream();
  auto* base = static_cast<char*>(ws.ptr);
  try {
    std::unordered_map<int, dnnl::memory> common;
    if (scratchpad_bytes_ > 0) {
      const memory::desc desc({static_cast<memory::dim>(scratchpad_bytes_)}, memory::data_type::u8,
                              memory::format_tag::x);
      common[DNNL_ARG_SCRATCHPAD] = memory(desc, engine, base);
    }
    auto with_scratch = [&](std::unordered_map<int, memory> args) {
      if (auto it = common.find(DNNL_ARG_SCRATCHPAD); it != common.end()) {
        args[DNNL_ARG_SCRATCHPAD] = it->second;
      }
      return args;
    };
    memory b_user(b_, engine, const_cast<void*>(b));
    memory b32 = b_user;
    if (b_widen_) {
      b32 = memory(b32_, engine, base + b_offset_);
      b_widen_->execute(stream, with_scratch({{DNNL_ARG_FROM, b_user}, {DNNL_ARG_TO, b32}}));
    }
    const int64_t rows = a_.dims()[0];
    for (int64_t r0 = 0; r0 < rows;) {
      const Chunk& ch = rows - r0 >= chunk_rows_ ? chunks_.front() : chunks_.back();
      auto* a_ptr = static_cast<const char*>(a) + r0 * row_stride(a_) * a_elem_;
      auto* c_ptr = static_cast<char*>(c) + r0 * row_stride(c_) * c_elem_;
      memory a_user(ch.a_user, engine, const_cast<char*>(a_ptr));
      memory c_user(ch.c_user, engine, c_ptr);
      memory a32 = a_user, c32 = c_user;
      if (ch.a_widen) {
        a32 = memory(ch.a32, engine, base + a_offset_);
        ch.a_widen->execute(stream, with_scratch({{DNNL_ARG_FROM, a_user}, {DNNL_ARG_TO, a32}}));
      }
      if (ch.c_narrow) c32 = memory(ch.c32, engine, base + c_offset_);
      auto args = with_scratch({{DNNL_ARG_SRC, a32}, {DNNL_ARG_WEIGHTS, b32}, {DNNL_ARG_DST, c32}});
      if (has_bias_) {
        args[DNNL_ARG_BIAS] = memory(bias_, engine, const_cast<void*>(bias));
      }
      ch.matmul.execute(stream, args);
      if (ch.c_narrow) {
        ch.c_narrow->execute(stream, with_scratch({{DNNL_ARG_FROM, c32}, {DNNL_ARG_TO, c_user}}));
      }
      r0 += ch.rows;
    }
    stream.wait();
  } catch (const dnnl::error& e) {
    throw LibraryError("oneDNN", fmt::format("executing the {} matmul in fp32", what), e.what(),
                       __FILE__, __LINE__);
  }
}

std::shared_ptr<const WidenedMatmul> widened_matmul_plan(PlanCache& plans, const PlanKey& key,
                                                         const memory::desc& a,
                                                         const memory::desc& b,
                                                         const memory::desc* bias,
                                                         const memory::desc& c) {
  return plans.plan<WidenedMatmul>(key, [&] {
    dnnl::primitive_attr attr;
    DNNL_CHECK(attr.set_scratchpad_mode(dnnl::scratchpad_mode::user));
    return WidenedMatmul(a, b, bias, c, attr);
  });
}

}  // namespace ferry::cpu
