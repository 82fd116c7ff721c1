// main() of the tests that run under mpirun: discovers the ranks before any test, lets rank 0
// print gtest's usual report and the other ranks only their failures (prefixed with the rank),
// and finalises MPI after the last test. Every rank returns its own result; mpirun fails the
// job when any rank fails.
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/ranks.h"
#include "tests/comm/mpi_test_env.h"

namespace ferry::mpitest {
namespace {

RankInfo g_ranks;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

const RankInfo& test_ranks() { return g_ranks; }

}  // namespace ferry::mpitest

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ferry::mpitest::g_ranks = ferry::init_ranks();
  const int rank = ferry::mpitest::g_ranks.rank;
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ferry::mpitest::RankFailurePrinter(rank));
  }
  const int result = RUN_ALL_TESTS();
  ferry::finalize_ranks();
  return result;
}
