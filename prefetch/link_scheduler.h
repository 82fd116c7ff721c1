// When each offload or prefetch may start. The transfer engine asks its LinkScheduler around
// every copy it issues; the scheduler may order the copy stream after other work (a link
// token, another rank's transfer) before the copy and release what it took after it.
// `fifo` issues every copy at once in request order: the copy streams alone serialise them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "device/stream.h"
#include "prefetch/transfer_direction.h"

namespace ferry {

struct TransferRequest {
  TransferDirection direction = TransferDirection::kToHost;
  std::string tensor;
  uint64_t bytes = 0;
  int deadline_step = -1;  // the step that waits for it (release or first use)
};

class LinkScheduler {
 public:
  virtual ~LinkScheduler() = default;
  virtual std::string_view name() const = 0;
  // Called before the copy is enqueued on `copy_stream`; may enqueue waits on it.
  virtual void before_copy(const TransferRequest& request, Stream& copy_stream) = 0;
  // Called after the copy is enqueued on `copy_stream`.
  virtual void after_copy(const TransferRequest& request, Stream& copy_stream) = 0;
};

// Oblivious: no ordering beyond the copy streams' own.
class FifoLinkScheduler : public LinkScheduler {
 public:
  std::string_view name() const override { return "fifo"; }
  void before_copy(const TransferRequest&, Stream&) override {}
  void after_copy(const TransferRequest&, Stream&) override {}
};

}  // namespace ferry
