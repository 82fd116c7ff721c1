// torchvision's ResNet (torchvision/models/resnet.py, 0.14): BasicBlock and Bottleneck (v1.5,
// stride in the 3x3 conv), built in forward order, which is also module registration order, so
// parameters come out in state_dict order. Node names are torchvision's module paths.
#include <array>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/model/zoo/models.h"

namespace ferry::zoo {
namespace {

struct ResNetSpec {
  bool bottleneck;
  std::array<int, 4> blocks;
};

ResNetSpec spec_for(int depth) {
  switch (depth) {
    case 18:
      return {false, {2, 2, 2, 2}};
    case 34:
      return {false, {3, 4, 6, 3}};
    case 50:
      return {true, {3, 4, 6, 3}};
    case 101:
      return {true, {3, 4, 23, 3}};
    case 152:
      return {true, {3, 8, 36, 3}};
    default:
      break;
  }
  FERRY_ASSERT(false, fmt::format("no ResNet of depth {}", depth));
  return {};
}

// `downsample` = Sequential(conv1x1(stride), BatchNorm2d) when the block changes the shape.
TensorId shortcut(GraphBuilder& b, TensorId x, const std::string& block, int64_t out_channels,
                  int64_t stride) {
  if (stride == 1 && b.shape(x)[1] == out_channels) return x;
  TensorId s = b.conv2d(x, block + ".downsample.0", out_channels, 1, stride, 0, 1, false);
  return b.batch_norm(s, block + ".downsample.1");
}

// BasicBlock (expansion 1). torchvision reuses one `relu` module twice: the second call is
// named "<block>.relu_1"; the functional `out += identity` is "<block>.add".
TensorId basic_block(GraphBuilder& b, TensorId x, const std::string& block, int64_t planes,
                     int64_t stride) {
  TensorId y = b.conv2d(x, block + ".conv1", planes, 3, stride, 1, 1, false);  // (N, P, H/s, W/s)
  y = b.batch_norm(y, block + ".bn1");
  y = b.relu(y, block + ".relu");
  y = b.conv2d(y, block + ".conv2", planes, 3, 1, 1, 1, false);
  y = b.batch_norm(y, block + ".bn2");
  const TensorId identity = shortcut(b, x, block, planes, stride);
  y = b.add(y, identity, block + ".add");
  return b.relu(y, block + ".relu_1");
}

// Bottleneck (expansion 4, width = planes): 1x1 -> 3x3 (stride) -> 1x1, `relu` called 3 times.
TensorId bottleneck(GraphBuilder& b, TensorId x, const std::string& block, int64_t planes,
                    int64_t stride) {
  TensorId y = b.conv2d(x, block + ".conv1", planes, 1, 1, 0, 1, false);
  y = b.batch_norm(y, block + ".bn1");
  y = b.relu(y, block + ".relu");
  y = b.conv2d(y, block + ".conv2", planes, 3, stride, 1, 1, false);  // (N, P, H/s, W/s)
  y = b.batch_norm(y, block + ".bn2");
  y = b.relu(y, block + ".relu_1");
  y = b.conv2d(y, block + ".conv3", planes * 4, 1, 1, 0, 1, false);
  y = b.batch_norm(y, block + ".bn3");
  const TensorId identity = shortcut(b, x, block, planes * 4, stride);
  y = b.add(y, identity, block + ".add");
  return b.relu(y, block + ".relu_2");
}

}  // namespace

TensorId build_resnet(GraphBuilder& b, int depth, bool cifar) {
  const ResNetSpec spec = spec_for(depth);
  // torchvision: kaiming_normal_(fan_out, relu) for every conv, BN weight 1 / bias 0 (the
  // builder's BN default), and nn.Linear's default for `fc`.
  b.set_conv_init(InitRule::kKaimingNormalFanOut, InitRule::kZeros);
  b.set_linear_init(InitRule::kTorchDefault, InitRule::kTorchDefault);

  TensorId x = b.input();  // (N, 3, H, W)
  if (cifar) {
    x = b.conv2d(x, "conv1", 64, 3, 1, 1, 1, false);  // (N, 64, H, W)
    x = b.batch_norm(x, "bn1");
    x = b.relu(x, "relu");
  } else {
    x = b.conv2d(x, "conv1", 64, 7, 2, 3, 1, false);  // (N, 64, H/2, W/2)
    x = b.batch_norm(x, "bn1");
    x = b.relu(x, "relu");
    x = b.max_pool(x, 3, 2, 1, false, "maxpool");  // (N, 64, H/4, W/4)
  }
  constexpr std::array<int64_t, 4> kPlanes{64, 128, 256, 512};
  for (int layer = 0; layer < 4; ++layer) {
    for (int i = 0; i < spec.blocks[layer]; ++i) {
      const std::string block = fmt::format("layer{}.{}", layer + 1, i);
      const int64_t stride = (layer > 0 && i == 0) ? 2 : 1;
      x = spec.bottleneck ? bottleneck(b, x, block, kPlanes[layer], stride)
                          : basic_block(b, x, block, kPlanes[layer], stride);
    }
  }
  x = b.adaptive_avg_pool(x, 1, 1, "avgpool");  // (N, 512 * expansion, 1, 1)
  x = b.flatten(x, "flatten");                  // (N, 512 * expansion)
  return b.linear(x, "fc", b.classes());        // (N, classes)
}

}  // namespace ferry::zoo
