// Kernel names, for messages and traces.
#include "device/kernels.h"

namespace ferry {

std::string_view kernel_name(KernelKind kind) {
  static constexpr std::string_view kNames[] = {"conv_forward",
                                                "conv_backward_data",
                                                "conv_backward_weights",
                                                "linear_forward",
                                                "linear_backward_data",
                                                "linear_backward_weights",
                                                "pool_forward",
                                                "pool_backward",
                                                "adaptive_avg_pool_forward",
                                                "adaptive_avg_pool_backward",
                                                "batch_norm_forward_training",
                                                "batch_norm_forward_inference",
                                                "batch_norm_backward",
                                                "relu_forward",
                                                "relu_backward",
                                                "add_forward",
                                                "accumulate",
                                                "copy_device",
                                                "fill",
                                                "scale",
                                                "dropout_forward",
                                                "dropout_backward",
                                                "softmax_cross_entropy_forward",
                                                "softmax_cross_entropy_backward",
                                                "sgd_update",
                                                "adamw_update",
                                                "embedding_forward",
                                                "embedding_backward",
                                                "layer_norm_forward",
                                                "layer_norm_backward",
                                                "gelu_forward",
                                                "gelu_backward",
                                                "attention_forward",
                                                "attention_backward",
                                                "sum_of_squares",
                                                "clip_by_norm",
                                                "flash_attention_forward",
                                                "flash_attention_backward",
                                                "rms_norm_forward",
                                                "rms_norm_backward",
                                                "rope_qkv_forward",
                                                "rope_qkv_backward",
                                                "swiglu_forward",
                                                "swiglu_backward",
                                                "convert_floats"};
  static_assert(std::size(kNames) == std::variant_size_v<KernelArgs>);
  return kind < std::size(kNames) ? kNames[kind] : "unknown";
}

}  // namespace ferry
