// The communicator of a single rank: the mean over one rank is the data itself and a broadcast
// from rank 0 to rank 0 moves nothing, so every collective is complete when issued and costs
// nothing. Lets the trainer use one code path with and without mpirun.
#include <fmt/format.h>

#include "comm/backends.h"
#include "common/error.h"

namespace ferry::detail {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(const RankInfo& ranks) : ranks_(ranks) {}

  const RankInfo& ranks() const override { return ranks_; }
  std::string_view backend_name() const override { return "local"; }

  CommWork all_reduce_mean(float* data, int64_t count, Stream& after) override {
    FERRY_ASSERT(count >= 0, "all_reduce_mean: negative count");
    return CommWork();
  }

  // Nothing crosses a wire, so nothing is narrowed (Note [A bf16 all-reduce]).
  CommWork all_reduce_mean_bf16(float*, int64_t count, Stream&) override {
    FERRY_ASSERT(count >= 0, "all_reduce_mean_bf16: negative count");
    return CommWork();
  }

  CommWork broadcast(void* data, uint64_t bytes, int root, Stream& after) override {
    check_root(root);
    return CommWork();
  }

  // One rank's part is the whole mean already, and there is nobody to gather from.
  CommWork reduce_scatter_mean(float*, std::span<const Part> parts, Stream&) override {
    FERRY_ASSERT(parts.size() == 1, "reduce_scatter_mean: one part per rank");
    return CommWork();
  }
  CommWork all_gather(float*, std::span<const Part> parts, Stream&) override {
    FERRY_ASSERT(parts.size() == 1, "all_gather: one part per rank");
    return CommWork();
  }

  void broadcast_host(void* data, uint64_t bytes, int root) override { check_root(root); }

  void barrier() override {}

 private:
  static void check_root(int root) {
    if (root != 0) {
      throw UnsupportedError(fmt::format("broadcast from rank {} in a job of one rank", root),
                             "broadcast from rank 0");
    }
  }

  RankInfo ranks_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(const RankInfo& ranks) {
  return std::make_unique<LocalCommunicator>(ranks);
}

}  // namespace ferry::detail
