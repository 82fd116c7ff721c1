// The golden network of scripts/golden_reference.py, built with GraphBuilder: the same layers
// and the same names as the PyTorch module, so the fixture's state_dict keys apply directly.
#pragma once

#include "trainer/model/graph.h"

namespace ferry {

constexpr int64_t kGoldenBatch = 8, kGoldenChannels = 3, kGoldenSize = 16, kGoldenClasses = 5;

inline Graph build_golden_net(int64_t batch) {
  GraphBuilder b(Shape{batch, kGoldenChannels, kGoldenSize, kGoldenSize}, kGoldenClasses);
  TensorId x = b.relu(b.batch_norm(b.conv2d(b.input(), "conv1", 8, 3, 1, 1, 1, false), "bn1"));
  TensorId y = b.relu(b.batch_norm(b.conv2d(x, "conv2", 8, 3, 1, 1, 1, false), "bn2"));
  y = b.batch_norm(b.conv2d(y, "conv3", 8, 3, 1, 1, 1, false), "bn3");
  x = b.relu(b.add(x, y, "add"), "relu_out");
  x = b.max_pool(x, 2, 2);
  x = b.relu(b.conv2d(x, "conv4", 16, 3, 2, 1, 1, true));
  x = b.flatten(b.adaptive_avg_pool(x, 1, 1));
  b.loss(b.linear(x, "fc", kGoldenClasses));
  return b.finish();
}

}  // namespace ferry
