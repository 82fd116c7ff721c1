// torchvision's AlexNet (torchvision/models/alexnet.py, 0.14) and a CIFAR variant that keeps
// its module paths (features.0..12, classifier.0..6) so the two read alike. Default nn.Conv2d /
// nn.Linear initialisation, as torchvision's AlexNet has no init of its own.
#include "trainer/model/zoo/models.h"

namespace ferry::zoo {
namespace {

// classifier: Dropout -> Linear(hidden) -> ReLU -> Dropout -> Linear(hidden) -> ReLU -> Linear.
TensorId classifier(GraphBuilder& b, TensorId x, int64_t hidden) {
  x = b.dropout(x, 0.5f, "classifier.0");
  x = b.linear(x, "classifier.1", hidden);
  x = b.relu(x, "classifier.2");
  x = b.dropout(x, 0.5f, "classifier.3");
  x = b.linear(x, "classifier.4", hidden);
  x = b.relu(x, "classifier.5");
  return b.linear(x, "classifier.6", b.classes());  // (N, classes)
}

// features.6 to features.11: the three 3x3 convolutions both variants share.
TensorId three_convs(GraphBuilder& b, TensorId x) {
  x = b.conv2d(x, "features.6", 384, 3, 1, 1);
  x = b.relu(x, "features.7");
  x = b.conv2d(x, "features.8", 256, 3, 1, 1);
  x = b.relu(x, "features.9");
  x = b.conv2d(x, "features.10", 256, 3, 1, 1);
  return b.relu(x, "features.11");
}

}  // namespace

TensorId build_alexnet(GraphBuilder& b, bool cifar) {
  b.set_conv_init(InitRule::kTorchDefault, InitRule::kTorchDefault);
  b.set_linear_init(InitRule::kTorchDefault, InitRule::kTorchDefault);
  TensorId x = b.input();  // (N, 3, H, W)
  if (!cifar) {
    x = b.conv2d(x, "features.0", 64, 11, 4, 2);  // (N, 64, 55, 55) at 224
    x = b.relu(x, "features.1");
    x = b.max_pool(x, 3, 2, 0, false, "features.2");  // (N, 64, 27, 27)
    x = b.conv2d(x, "features.3", 192, 5, 1, 2);
    x = b.relu(x, "features.4");
    x = b.max_pool(x, 3, 2, 0, false, "features.5");  // (N, 192, 13, 13)
    x = three_convs(b, x);
    x = b.max_pool(x, 3, 2, 0, false, "features.12");  // (N, 256, 6, 6)
    x = b.adaptive_avg_pool(x, 6, 6, "avgpool");       // (N, 256, 6, 6)
    x = b.flatten(x, "flatten");                       // (N, 9216)
    return classifier(b, x, 4096);
  }
  // CIFAR: 3x3 convs, the first with stride 2, and 2x2 pools: 32 -> 16 -> 8 -> 4 -> 2.
  x = b.conv2d(x, "features.0", 64, 3, 2, 1);  // (N, 64, 16, 16)
  x = b.relu(x, "features.1");
  x = b.max_pool(x, 2, 2, 0, false, "features.2");  // (N, 64, 8, 8)
  x = b.conv2d(x, "features.3", 192, 3, 1, 1);
  x = b.relu(x, "features.4");
  x = b.max_pool(x, 2, 2, 0, false, "features.5");  // (N, 192, 4, 4)
  x = three_convs(b, x);
  x = b.max_pool(x, 2, 2, 0, false, "features.12");  // (N, 256, 2, 2)
  x = b.flatten(x, "flatten");                       // (N, 1024)
  return classifier(b, x, 1024);
}

}  // namespace ferry::zoo
