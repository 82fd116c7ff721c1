// torchvision's VGG (torchvision/models/vgg.py, 0.14), configurations A/B/D/E with and without
// batch norm, and its CIFAR variant. Every module of `features` and `classifier` is a node
// named by its Sequential index, so the indices count ReLU and pooling modules as torch does.
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/model/zoo/models.h"

namespace ferry::zoo {
namespace {

constexpr int kPool = 0;  // "M" in torchvision's cfgs

std::vector<int> config_for(int depth) {
  switch (depth) {
    case 11:
      return {64, kPool, 128, kPool, 256, 256, kPool, 512, 512, kPool, 512, 512, kPool};
    case 13:
      return {64, 64, kPool, 128, 128, kPool, 256, 256, kPool, 512, 512, kPool, 512, 512, kPool};
    case 16:
      return {64,    64,  kPool, 128, 128,   kPool, 256, 256, 256,
              kPool, 512, 512,   512, kPool, 512,   512, 512, kPool};
    case 19:
      return {64,  64,  kPool, 128, 128,   kPool, 256, 256, 256, 256,  kPool,
              512, 512, 512,   512, kPool, 512,   512, 512, 512, kPool};
    default:
      break;
  }
  FERRY_ASSERT(false, fmt::format("no VGG of depth {}", depth));
  return {};
}

// `features`: conv3x3 p1 [-> BatchNorm2d] -> ReLU per entry, MaxPool2d(2, 2) per "M".
TensorId features(GraphBuilder& b, TensorId x, int depth, bool batch_norm) {
  int index = 0;
  auto next = [&index] { return fmt::format("features.{}", index++); };
  for (int v : config_for(depth)) {
    if (v == kPool) {
      x = b.max_pool(x, 2, 2, 0, false, next());  // (N, C, H/2, W/2)
      continue;
    }
    x = b.conv2d(x, next(), v, 3, 1, 1);  // (N, v, H, W)
    if (batch_norm) x = b.batch_norm(x, next());
    x = b.relu(x, next());
  }
  return x;  // (N, 512, H/32, W/32)
}

}  // namespace

TensorId build_vgg(GraphBuilder& b, int depth, bool batch_norm, bool cifar) {
  // torchvision: convs kaiming_normal_(fan_out, relu) with zero bias, BN 1/0, Linear N(0, 0.01)
  // with zero bias. The CIFAR classifier keeps the Linear rule.
  b.set_conv_init(InitRule::kKaimingNormalFanOut, InitRule::kZeros);
  b.set_linear_init(InitRule::kNormal001, InitRule::kZeros);

  TensorId x = features(b, b.input(), depth, batch_norm);
  if (cifar) {
    x = b.flatten(x, "flatten");                      // (N, 512) at 32x32
    return b.linear(x, "classifier.0", b.classes());  // (N, classes)
  }
  x = b.adaptive_avg_pool(x, 7, 7, "avgpool");  // (N, 512, 7, 7)
  x = b.flatten(x, "flatten");                  // (N, 25088)
  x = b.linear(x, "classifier.0", 4096);
  x = b.relu(x, "classifier.1");
  x = b.dropout(x, 0.5f, "classifier.2");
  x = b.linear(x, "classifier.3", 4096);
  x = b.relu(x, "classifier.4");
  x = b.dropout(x, 0.5f, "classifier.5");
  return b.linear(x, "classifier.6", b.classes());  // (N, classes)
}

}  // namespace ferry::zoo
