// Transformer kernels on the CPU: embedding, layer norm, GELU, the attention core, and the
// gradient-clipping reductions. (Being written: until then each refuses to run.)
#include "common/error.h"
#include "device/cpu/cpu_kernels_impl.h"

namespace ferry::cpu {
namespace {

template <typename Args>
[[noreturn]] void not_yet(const Args& a) {
  throw UnsupportedError(std::string(kernel_name(KernelArgs(a))) + " is not written yet on the CPU",
                         "use a model without transformer layers");
}

}  // namespace

void run(PlanCache&, const EmbeddingForward& a) { not_yet(a); }
void run(PlanCache&, const EmbeddingBackward& a) { not_yet(a); }
void run(PlanCache&, const LayerNormForward& a) { not_yet(a); }
void run(PlanCache&, const LayerNormBackward& a) { not_yet(a); }
void run(PlanCache&, const GeluForward& a) { not_yet(a); }
void run(PlanCache&, const GeluBackward& a) { not_yet(a); }
uint64_t workspace(PlanCache&, const AttentionForward&) { return 0; }
uint64_t workspace(PlanCache&, const AttentionBackward&) { return 0; }
void run(PlanCache&, const AttentionForward& a) { not_yet(a); }
void run(PlanCache&, const AttentionBackward& a) { not_yet(a); }

}  // namespace ferry::cpu
