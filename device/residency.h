// A tensor's residency as an explicit state machine: on device, offloading, on host, prefetching.
// Nothing copies implicitly; a state leaves a copy state only once the copy's event completed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "device/device.h"

// Note [Residency states]
// A tensor's residency, as Caffe's SyncedMemory with in-flight states and without its silent
// copies:
//
//   on_device --offload--> offloading --(copy event observed)--> on_host
//   on_host --prefetch--> prefetching --(copy event observed)--> on_device
//   prefetching --offload (its copy ordered after the fetch's event)--> offloading
//
// Nothing copies implicitly. A state leaves offloading/prefetching only when poll() or
// synchronize() has seen the copy's event complete, or by a new copy that the device orders
// after the in-flight one (a prefetch of an offloading tensor, an offload of a prefetching one:
// the next step's copy of a tensor, issued without the host waiting for the last step's). Streams
// that must not run ahead of a copy are ordered after it with order_after_offload() /
// order_after_prefetch(), which enqueue a wait on the copy's event and never block the host.
// Note [Life of an offloaded activation] (trainer/exec/executor.h), steps 6-8, follows one
// tensor through these states.

namespace ferry {

enum class ResidencyState : uint8_t { kOnDevice, kOffloading, kOnHost, kPrefetching };
std::string_view residency_name(ResidencyState s);

class ResidentTensor {
 public:
  ResidentTensor(Device& device, std::string name, uint64_t bytes);

  ResidencyState state() const { return state_; }
  const std::string& name() const { return name_; }
  uint64_t bytes() const { return bytes_; }

  // on_device, or prefetching (the copy then waits for the fetch) -> offloading. Copies `bytes`
  // from `device_ptr` to `host_ptr` on `d2h`, after `ready` (the event of the last work that
  // wrote or read the tensor). `deadline` goes with the copy to the device (Device::copy_async).
  void offload(const void* device_ptr, void* host_ptr, Stream& d2h, Event& ready,
               const CopyDeadline& deadline = {});
  // on_host, or offloading (the fetch then waits for the offload) -> prefetching. Copies back
  // from the host copy to `device_ptr` on `h2d`, after `ready` (the event of the last work that
  // used `device_ptr`'s space for something else), with `deadline` as offload() does.
  void prefetch(void* device_ptr, Stream& h2d, Event& ready, const CopyDeadline& deadline = {});

  // Orders work enqueued on `stream` from now on after the offload's copy (the device space may
  // then be reused). Valid in offloading and on_host.
  void order_after_offload(Stream& stream);
  // Orders work enqueued on `stream` from now on after the prefetch's copy (the tensor may then
  // be read). Valid in prefetching and on_device.
  void order_after_prefetch(Stream& stream);

  // Advances offloading/prefetching when the copy's event has completed; never blocks.
  ResidencyState poll();
  // Blocks until the in-flight copy (if any) has completed, then advances.
  ResidencyState synchronize();

 private:
  void expect(bool ok, std::string_view action) const;

  Device& device_;
  std::string name_;
  uint64_t bytes_;
  ResidencyState state_ = ResidencyState::kOnDevice;
  void* host_ = nullptr;
  std::unique_ptr<Event> offloaded_;
  std::unique_ptr<Event> prefetched_;
};

}  // namespace ferry
