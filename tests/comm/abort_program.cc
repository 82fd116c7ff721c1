// A 2-rank job in which rank 1 fails while rank 0 waits in an all-reduce that rank 1 will
// never join. main() ends the job with fail_job, as the trainer's main does; the test
// (expect_abort.cmake) checks that mpirun exits non-zero, soon, with rank 1's message.
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "comm/communicator.h"
#include "comm/fault.h"
#include "comm/ranks.h"
#include "common/error.h"
#include "device/device.h"

int main() {
  using namespace ferry;
  RankInfo ranks;
  std::unique_ptr<Device> device;  // outside the try: see Note [Ending a job on one rank's failure]
  std::unique_ptr<Communicator> comm;
  try {
    ranks = init_ranks();
    device = create_device({.backend = Backend::kCpu, .memory = 64 << 20, .cpu = {.threads = 1}});
    comm = create_communicator(CommBackendChoice::kAuto, *device, ranks);
    DeviceBuffer buffer(device->memory(), 1 << 20, "gradients");
    auto* data = static_cast<float*>(buffer.data());
    Stream& compute = device->stream(StreamKind::kCompute);
    comm->all_reduce_mean(data, 1 << 18, compute).wait();  // a healthy step first
    if (ranks.rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 is now waiting
      throw Error("injected failure on rank 1 at step 2", "this is what the abort test expects");
    }
    comm->all_reduce_mean(data, 1 << 18, compute).wait();  // never completes
    std::fprintf(stderr, "rank %d: the all-reduce completed without rank 1\n", ranks.rank);
    return 3;
  } catch (const std::exception& e) {
    const int code = fail_job(ranks, e, 7);
    // Under MPI fail_job does not return. If it did, this rank would now stand for one whose
    // cleanup blocks (a destructor draining a comm stream): the job would hang and the test
    // would fail on its timeout rather than pass because this process exited.
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return code;
  }
}
