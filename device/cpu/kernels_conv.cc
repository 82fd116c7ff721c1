// Convolutions on oneDNN: forward, backward data, backward weights (with bias). Each primitive is
// created once per geometry with format_tag::any, and the plain NCHW / (K, C/g, R, S) tensors
// are reordered through the workspace when the chosen layout differs. In bf16 storage (Note
// [Storage dtype of a kernel]) x, w, y, dx and dy are bf16 and bias, dw and dbias fp32,
// multiplied in fp32 (Note [bf16 products in fp32] in widened_matmul.cc).
#include "device/cpu/cpu_kernels_impl.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum ConvPass : int64_t { kForward = 1, kBackwardData, kBackwardWeights };

struct ConvDescs {
  memory::desc src, weights, bias, dst;        // plain, the caller's layouts
  memory::desc diff_weights;                   // plain, fp32 (the weight gradient)
  memory::desc src_any, weights_any, dst_any;  // format_tag::any
  memory::dims strides, pad_l, pad_r;
};

// `widened`: the primitive's own layouts fp32 (Note [bf16 products in fp32] in
// widened_matmul.cc), the plan's reorders widening and narrowing.
ConvDescs conv_descs(const ConvGeom& g, DType dtype, bool widened) {
  ConvDescs d;
  const memory::dims src{g.n, g.c, g.h, g.w};
  const memory::dims dst{g.n, g.k, g.out_h(), g.out_w()};
  const memory::dims weights =
      g.groups == 1 ? memory::dims{g.k, g.c, g.r, g.s}
                    : memory::dims{g.groups, g.k / g.groups, g.c / g.groups, g.r, g.s};
  const auto type = dnnl_type(dtype);
  d.src = plain_desc(src, type);
  d.dst = plain_desc(dst, type);
  d.weights = plain_desc(weights, type);
  d.diff_weights = plain_desc(weights);
  d.bias = plain_desc({g.k});
  const auto inner = widened ? memory::data_type::f32 : type;
  d.src_any = memory::desc(src, inner, Tag::any);
  d.dst_any = memory::desc(dst, inner, Tag::any);
  d.weights_any = memory::desc(weights, inner, Tag::any);
  d.strides = {g.stride_h, g.stride_w};
  d.pad_l = {g.pad_h, g.pad_w};
  // oneDNN checks (h + pad_l + pad_r - r) / stride + 1 == out_h, which the symmetric padding of
  // ConvGeom satisfies with its floor division.
  d.pad_r = {g.pad_h, g.pad_w};
  return d;
}

// The forward primitive descriptor; also the hint for the backward passes.
dnnl::convolution_forward::primitive_desc forward_pd(const ConvDescs& d, bool bias,
                                                     const dnnl::primitive_attr& attr) {
  using Fwd = dnnl::convolution_forward;
  const auto desc =
      bias ? Fwd::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                       d.src_any, d.weights_any, d.bias, d.dst_any, d.strides, d.pad_l, d.pad_r)
           : Fwd::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                       d.src_any, d.weights_any, d.dst_any, d.strides, d.pad_l, d.pad_r);
  return Fwd::primitive_desc(desc, attr, cpu_engine());
}

bool widened(const PlanCache& plans, DType dtype) {
  return dtype == DType::kBF16 && plans.widen_bf16_products();
}

// The dtype and whether widened share the key's last integer (16 at most).
PlanKey key(ConvPass pass, const ConvGeom& g, bool bias, DType dtype, bool widened) {
  return make_key({kernel_kind<ConvForward>(), pass, g.n, g.c, g.h, g.w, g.k, g.r, g.s, g.stride_h,
                   g.stride_w, g.pad_h, g.pad_w, g.groups, bias,
                   static_cast<int64_t>(dtype) * 2 + widened});
}

std::shared_ptr<const PrimitivePlan> forward_plan(PlanCache& plans, const ConvGeom& g, bool bias,
                                                  DType dtype) {
  check_conv_geom(g, "conv_forward");
  return plans.plan<PrimitivePlan>(key(kForward, g, bias, dtype, widened(plans, dtype)), [&] {
    const ConvDescs d = conv_descs(g, dtype, widened(plans, dtype));
    PrimitivePlan plan(/*user_scratchpad=*/true);
    auto pd = DNNL_CHECK(forward_pd(d, bias, plan.attr()));
    plan.add(DNNL_ARG_SRC, false, d.src, pd.src_desc());
    plan.add(DNNL_ARG_WEIGHTS, false, d.weights, pd.weights_desc());
    if (bias) plan.add(DNNL_ARG_BIAS, false, d.bias, pd.bias_desc());
    plan.add(DNNL_ARG_DST, true, d.dst, pd.dst_desc());
    plan.finish(DNNL_CHECK(dnnl::convolution_forward(pd)), pd.scratchpad_desc());
    return plan;
  });
}

std::shared_ptr<const PrimitivePlan> backward_data_plan(PlanCache& plans, const ConvGeom& g,
                                                        DType dtype) {
  check_conv_geom(g, "conv_backward_data");
  return plans.plan<PrimitivePlan>(key(kBackwardData, g, false, dtype, widened(plans, dtype)), [&] {
    using Bwd = dnnl::convolution_backward_data;
    const ConvDescs d = conv_descs(g, dtype, widened(plans, dtype));
    PrimitivePlan plan(/*user_scratchpad=*/true);
    auto hint = DNNL_CHECK(forward_pd(d, false, plan.attr()));
    const Bwd::desc desc(dnnl::algorithm::convolution_direct, d.src_any, d.weights_any, d.dst_any,
                         d.strides, d.pad_l, d.pad_r);
    auto pd = DNNL_CHECK(Bwd::primitive_desc(desc, plan.attr(), cpu_engine(), hint));
    plan.add(DNNL_ARG_DIFF_DST, false, d.dst, pd.diff_dst_desc());
    plan.add(DNNL_ARG_WEIGHTS, false, d.weights, pd.weights_desc());
    plan.add(DNNL_ARG_DIFF_SRC, true, d.src, pd.diff_src_desc());
    plan.finish(DNNL_CHECK(Bwd(pd)), pd.scratchpad_desc());
    return plan;
  });
}

std::shared_ptr<const PrimitivePlan> backward_weights_plan(PlanCache& plans, const ConvGeom& g,
                                                           bool bias, DType dtype) {
  check_conv_geom(g, "conv_backward_weights");
  return plans.plan<PrimitivePlan>(
      key(kBackwardWeights, g, bias, dtype, widened(plans, dtype)), [&] {
        using Bwd = dnnl::convolution_backward_weights;
        const ConvDescs d = conv_descs(g, dtype, widened(plans, dtype));
        // The gradient is fp32 in either storage (its weights' layout chosen by oneDNN).
        const memory::desc diff_weights_any(d.weights.dims(), memory::data_type::f32, Tag::any);
        PrimitivePlan plan(/*user_scratchpad=*/true);
        auto hint = DNNL_CHECK(forward_pd(d, bias, plan.attr()));
        const auto desc =
            bias ? Bwd::desc(dnnl::algorithm::convolution_direct, d.src_any, diff_weights_any,
                             d.bias, d.dst_any, d.strides, d.pad_l, d.pad_r)
                 : Bwd::desc(dnnl::algorithm::convolution_direct, d.src_any, diff_weights_any,
                             d.dst_any, d.strides, d.pad_l, d.pad_r);
        auto pd = DNNL_CHECK(Bwd::primitive_desc(desc, plan.attr(), cpu_engine(), hint));
        plan.add(DNNL_ARG_SRC, false, d.src, pd.src_desc());
        plan.add(DNNL_ARG_DIFF_DST, false, d.dst, pd.diff_dst_desc());
        plan.add(DNNL_ARG_DIFF_WEIGHTS, true, d.diff_weights, pd.diff_weights_desc());
        if (bias) plan.add(DNNL_ARG_DIFF_BIAS, true, d.bias, pd.diff_bias_desc());
        plan.finish(DNNL_CHECK(Bwd(pd)), pd.scratchpad_desc());
        return plan;
      });
}

}  // namespace

uint64_t workspace(PlanCache& plans, const ConvForward& a) {
  return forward_plan(plans, a.g, a.bias != nullptr, a.dtype)->workspace_bytes();
}

uint64_t workspace(PlanCache& plans, const ConvBackwardData& a) {
  return backward_data_plan(plans, a.g, a.dtype)->workspace_bytes();
}

uint64_t workspace(PlanCache& plans, const ConvBackwardWeights& a) {
  return backward_weights_plan(plans, a.g, a.dbias != nullptr, a.dtype)->workspace_bytes();
}

void run(PlanCache& plans, const ConvForward& a) {
  const bool bias = a.bias != nullptr;
  forward_plan(plans, a.g, bias, a.dtype)
      ->execute({{DNNL_ARG_SRC, a.x},
                 {DNNL_ARG_WEIGHTS, a.w},
                 {DNNL_ARG_BIAS, a.bias},
                 {DNNL_ARG_DST, a.y}},
                a.ws, "conv_forward");
}

void run(PlanCache& plans, const ConvBackwardData& a) {
  backward_data_plan(plans, a.g, a.dtype)
      ->execute({{DNNL_ARG_DIFF_DST, a.dy}, {DNNL_ARG_WEIGHTS, a.w}, {DNNL_ARG_DIFF_SRC, a.dx}},
                a.ws, "conv_backward_data");
}

void run(PlanCache& plans, const ConvBackwardWeights& a) {
  backward_weights_plan(plans, a.g, a.dbias != nullptr, a.dtype)
      ->execute({{DNNL_ARG_SRC, a.x},
                 {DNNL_ARG_DIFF_DST, a.dy},
                 {DNNL_ARG_DIFF_WEIGHTS, a.dw},
                 {DNNL_ARG_DIFF_BIAS, a.dbias}},
                a.ws, "conv_backward_weights");
}

}  // namespace ferry::cpu
