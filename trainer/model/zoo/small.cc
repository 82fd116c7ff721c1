// The small models: `mlp` for any input and `lenet5` for MNIST/CIFAR-sized images. Their
// PyTorch twins (same tensor names and layer order) are in scripts/zoo_reference.py.
// Default nn.Conv2d / nn.Linear initialisation.
#include "trainer/model/zoo/models.h"

namespace ferry::zoo {

TensorId build_mlp(GraphBuilder& b) {
  b.set_linear_init(InitRule::kTorchDefault, InitRule::kTorchDefault);
  TensorId x = b.flatten(b.input(), "flatten");  // (N, C*H*W)
  x = b.linear(x, "fc1", 512);
  x = b.relu(x, "relu1");
  x = b.linear(x, "fc2", 256);
  x = b.relu(x, "relu2");
  return b.linear(x, "fc3", b.classes());  // (N, classes)
}

// LeNet-5 (LeCun et al. 1998) with ReLU and max-pooling in place of tanh and subsampling:
// conv1 6@5x5 -> relu1 -> pool1 2x2 -> conv2 16@5x5 -> relu2 -> pool2 2x2 -> flatten ->
// fc1 120 -> relu3 -> fc2 84 -> relu4 -> fc3 classes. conv1 is padded by 2 when the input is
// smaller than 32x32, so MNIST's 28x28 maps like the classic 32x32 input: both reach
// (16, 5, 5) at the flatten and have the same parameters (61,706 for 1 channel, 10 classes).
TensorId build_lenet5(GraphBuilder& b) {
  b.set_conv_init(InitRule::kTorchDefault, InitRule::kTorchDefault);
  b.set_linear_init(InitRule::kTorchDefault, InitRule::kTorchDefault);
  const Shape& in = b.shape(b.input());
  const int64_t pad = (in[2] < 32 || in[3] < 32) ? 2 : 0;
  TensorId x = b.conv2d(b.input(), "conv1", 6, 5, 1, pad);  // (N, 6, 28, 28)
  x = b.relu(x, "relu1");
  x = b.max_pool(x, 2, 2, 0, false, "pool1");  // (N, 6, 14, 14)
  x = b.conv2d(x, "conv2", 16, 5);             // (N, 16, 10, 10)
  x = b.relu(x, "relu2");
  x = b.max_pool(x, 2, 2, 0, false, "pool2");  // (N, 16, 5, 5)
  x = b.flatten(x, "flatten");                 // (N, 400)
  x = b.linear(x, "fc1", 120);
  x = b.relu(x, "relu3");
  x = b.linear(x, "fc2", 84);
  x = b.relu(x, "relu4");
  return b.linear(x, "fc3", b.classes());  // (N, classes)
}

}  // namespace ferry::zoo
