// Internal to the zoo: the architecture builders behind build_model. Each adds its layers to a
// GraphBuilder (input already set) with torchvision's module paths as node names and returns
// the logits (N, classes); zoo.cc adds the loss. Each builder sets its own initialisers.
#pragma once

#include <string>

#include "trainer/model/graph.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry::zoo {

// torchvision.models.resnet{18,34,50,101,152} (v1.5: Bottleneck strides in its 3x3 conv).
// cifar: 3x3 stride-1 stem `conv1` and no `maxpool`, same names otherwise.
TensorId build_resnet(GraphBuilder& b, int depth, bool cifar);

// torchvision.models.vgg{11,13,16,19}[_bn]. cifar: the same `features`, no `avgpool`, and a
// one-layer classifier `classifier.0` Linear(features' flattened size, classes).
TensorId build_vgg(GraphBuilder& b, int depth, bool batch_norm, bool cifar);

// torchvision.models.alexnet. cifar: 3x3 convs and 2x2 pools under the same module paths, no
// `avgpool`, and a 1024-wide classifier (see alexnet.cc).
TensorId build_alexnet(GraphBuilder& b, bool cifar);

// flatten -> fc1 Linear(C*H*W, 512) -> relu1 -> fc2 Linear(512, 256) -> relu2 -> fc3.
TensorId build_mlp(GraphBuilder& b);

// LeNet-5 with ReLU and max-pooling (see small.cc for the padding rule).
TensorId build_lenet5(GraphBuilder& b);

// Hugging Face's GPT2LMHeadModel of the given sizes (all resolved, none 0) on a token input.
TensorId build_gpt2(GraphBuilder& b, const TransformerSizes& sizes);

// Hugging Face's LlamaForCausalLM of the given sizes (all resolved) on a token input.
TensorId build_llama(GraphBuilder& b, const TransformerSizes& sizes);

}  // namespace ferry::zoo
