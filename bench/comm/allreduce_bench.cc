// All-reduce bandwidth of the MPI backend over message sizes, next to Open MPI's own all-reduce,
// in nccl-tests' algbw/busbw terms (Note [What the all-reduce bench measures]).
// Invariant: printed, never asserted.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/backends.h"
#include "comm/communicator.h"
#include "comm/fault.h"
#include "comm/ranks.h"
#include "device/device.h"

// Note [What the all-reduce bench measures]
// nccl-tests' definitions: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (the bytes each
// rank's link carries in a ring all-reduce, comparable across rank counts). Run under mpirun:
//   mpirun -np 2 build/bench/comm_allreduce_bench [--max-mib 64] [--seconds 0.3]
// Columns: the backend as the trainer uses it (blocking MPI_Allreduce on the comm stream's
// thread, then the division), its non-blocking variant (MPI_Iallreduce polled with MPI_Test),
// and the peer in the same run: Open MPI's own MPI_Allreduce on MPI_COMM_WORLD from the main
// thread (no comm stream, no division). The last column is peer time / default time.

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  uint64_t min_bytes = 4 << 10;
  uint64_t max_bytes = 64 << 20;
  double seconds = 0.3;  // target time per size and variant
};

// The slowest rank's time: a collective is done when the last rank is done.
double max_over_ranks(double t) {
  double out = t;
  MPI_Allreduce(&t, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// Iterations for one size: enough for `seconds` at a guessed 1 GB/s, between 5 and 1000.
int iterations(uint64_t bytes, double seconds) {
  const double guess = seconds * 1e9 / static_cast<double>(bytes);
  return static_cast<int>(std::clamp(guess, 5.0, 1000.0));
}

// Seconds per all-reduce through a communicator: `iters` issued back to back on the comm
// stream, then one wait (the stream runs them in order).
double time_communicator(Communicator& comm, Stream& after, float* data, int64_t count, int iters) {
  for (int i = 0; i < 2; ++i) comm.all_reduce_mean(data, count, after).wait();  // warm up
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  CommWork last;
  for (int i = 0; i < iters; ++i) last = comm.all_reduce_mean(data, count, after);
  last.wait();
  return max_over_ranks(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
}

double time_raw_mpi(float* data, int64_t count, int iters) {
  for (int i = 0; i < 2; ++i) {
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  return max_over_ranks(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--max-mib") {
      o.max_bytes = std::strtoull(argv[i + 1], nullptr, 10) << 20;
    } else if (key == "--seconds") {
      o.seconds = std::strtod(argv[i + 1], nullptr);
    } else {
      std::fprintf(stderr, "usage: comm_allreduce_bench [--max-mib N] [--seconds S]\n");
      std::exit(2);
    }
  }
  return o;
}

int run(const RankInfo& ranks, const Options& o) {
  auto device = create_device(
      {.backend = Backend::kCpu, .memory = o.max_bytes + (64 << 20), .cpu = {.threads = 1}});
  auto blocking = detail::make_mpi_communicator(*device, ranks, detail::MpiWait::kBlocking);
  auto nonblocking = detail::make_mpi_communicator(*device, ranks, detail::MpiWait::kNonblocking);
  DeviceBuffer buffer(device->memory(), o.max_bytes, "bench buffer");
  auto* data = static_cast<float*>(buffer.data());
  std::fill(data, data + o.max_bytes / sizeof(float), 1.0f);
  Stream& compute = device->stream(StreamKind::kCompute);
  const double bus = 2.0 * (ranks.size - 1) / ranks.size;

  if (ranks.is_root()) {
    std::printf(
        "all-reduce mean of float32 in place, %d ranks (%d on this machine), nccl-tests "
        "bandwidths in GB/s (1e9 B/s)\n",
        ranks.size, ranks.local_size);
    std::printf("%10s %10s | %30s | %30s | %30s | %8s\n", "", "", "ferry mpi (default: blocking)",
                "ferry mpi: Iallreduce + Test", "peer: MPI_Allreduce, main thr.", "speed");
    std::printf("%10s %10s | %10s %9s %9s | %10s %9s %9s | %10s %9s %9s | %8s\n", "bytes", "count",
                "time us", "algbw", "busbw", "time us", "algbw", "busbw", "time us", "algbw",
                "busbw", "vs peer");
  }
  for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    const auto count = static_cast<int64_t>(bytes / sizeof(float));
    const int iters = iterations(bytes, o.seconds);
    const double t_b = time_communicator(*blocking, compute, data, count, iters);
    const double t_nb = time_communicator(*nonblocking, compute, data, count, iters);
    const double t_raw = time_raw_mpi(data, count, iters);
    if (ranks.is_root()) {
      auto cols = [&](double t) {
        const double algbw = static_cast<double>(bytes) / t / 1e9;
        std::printf(" %10.1f %9.3f %9.3f |", t * 1e6, algbw, algbw * bus);
      };
      std::printf("%10llu %10lld |", static_cast<unsigned long long>(bytes),
                  static_cast<long long>(count));
      cols(t_b);
      cols(t_nb);
      cols(t_raw);
      std::printf(" %8.2f\n", t_raw / t_b);  // > 1: the default backend is faster than the peer
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;
  const Options options = parse(argc, argv);
  RankInfo ranks;
  try {
    ranks = init_ranks();
    if (ranks.size < 2) {
      std::fprintf(stderr, "run under mpirun with 2 or more ranks: mpirun -np 2 %s\n", argv[0]);
      finalize_ranks();
      return 2;
    }
    run(ranks, options);
  } catch (const std::exception& e) {
    return fail_job(ranks, e, 1);
  }
  finalize_ranks();
  return 0;
}
