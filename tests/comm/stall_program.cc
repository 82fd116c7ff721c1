// A 2-rank job in which rank 1 stops itself (SIGSTOP) while rank 0 waits in an all-reduce that
// rank 1 never joins, with a 2 s watchdog. The test (expect_abort.cmake) checks that the job
// ends by itself, soon, non-zero, with one message from rank 0 naming rank 1.
// Usage: comm_stall_program [blocking|nonblocking|creation|inside|late]; creation: rank 1 stops
// before the communicator exists, so rank 0 waits in its creation; inside: rank 1 enters the
// all-reduce first and stops inside it; late: rank 1 keeps running (sleeps) instead of stopping.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "comm/backends.h"
#include "comm/communicator.h"
#include "comm/fault.h"
#include "comm/ranks.h"
#include "device/device.h"

int main(int argc, char** argv) {
  using namespace ferry;
  const bool nonblocking = argc > 1 && std::strcmp(argv[1], "nonblocking") == 0;
  RankInfo ranks;
  std::unique_ptr<Device> device;  // outside the try: see Note [Ending a job on one rank's failure]
  std::unique_ptr<Communicator> comm;
  try {
    ranks = init_ranks();
    if (argc > 1 && std::strcmp(argv[1], "creation") == 0 && ranks.rank == 1) raise(SIGSTOP);
    device = create_device({.backend = Backend::kCpu, .memory = 64 << 20, .cpu = {.threads = 1}});
    comm = detail::make_mpi_communicator(
        *device, ranks, nonblocking ? detail::MpiWait::kNonblocking : detail::MpiWait::kBlocking,
        /*timeout_s=*/2);
    DeviceBuffer buffer(device->memory(), 1 << 20, "gradients");
    auto* data = static_cast<float*>(buffer.data());
    Stream& compute = device->stream(StreamKind::kCompute);
    comm->all_reduce_mean(data, 1 << 18, compute).wait();  // a healthy collective first
    comm->barrier();
    if (argc > 1 && std::strcmp(argv[1], "inside") == 0) {
      if (ranks.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      CommWork work = comm->all_reduce_mean(data, 1 << 18, compute);
      if (ranks.rank == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its comm thread is in
        raise(SIGSTOP);
      }
      work.wait();  // never completes on rank 0
    } else if (argc > 1 && std::strcmp(argv[1], "late") == 0) {
      if (ranks.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(120));
      comm->all_reduce_mean(data, 1 << 18, compute).wait();  // never completes on rank 0
    } else {
      if (ranks.rank == 1) raise(SIGSTOP);                   // stopped until the job is killed
      comm->all_reduce_mean(data, 1 << 18, compute).wait();  // never completes on rank 0
    }
    std::fprintf(stderr, "rank %d: the all-reduce completed without rank 1\n", ranks.rank);
    return 3;
  } catch (const std::exception& e) {
    return fail_job(ranks, e, 7);
  }
}
