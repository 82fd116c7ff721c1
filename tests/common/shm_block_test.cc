// The one checked open of a shared block (Note [A block is input]), through both ledgers: a
// foreign file or a block of right magic and version with a random or damaged body never crashes
// and is replaced when no process maps it, and a bad block a live process maps is refused in one
// line naming it (exit code 2).
#include "common/shm_block.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/shm_names.h"
#include "jobs/job_ledger.h"
#include "jobs/job_ledger_impl.h"
#include "links/link_ledger.h"
#include "links/link_ledger_impl.h"

namespace ferry {
namespace {

// Writes `bytes` at the shm name `name`, replacing what is there.
void write_block(const std::string& name, const std::vector<unsigned char>& bytes) {
  shm_unlink(name.c_str());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
}

bool exists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

// A body of `size` random bytes under the right magic and version; with `keep_mutex`, a freshly
// initialised mutex too (so the check reaches the fields behind it).
std::vector<unsigned char> random_block(std::mt19937_64& rng, size_t size, uint64_t magic,
                                        uint32_t version, size_t mutex_offset, bool keep_mutex) {
  std::vector<unsigned char> b(size);
  for (unsigned char& c : b) c = static_cast<unsigned char>(rng());
  std::memcpy(b.data(), &magic, sizeof(magic));
  std::memcpy(b.data() + sizeof(magic), &version, sizeof(version));
  if (keep_mutex) {
    pthread_mutex_t mu;
    shm_block::init_robust_mutex(&mu);
    std::memcpy(b.data() + mutex_offset, &mu, sizeof(mu));
  }
  return b;
}

const std::vector<unsigned char> kJunk = {'j', 'u', 'n', 'k', '\n'};

JobRequest request() {
  JobRequest r;
  r.device = "cpu:0";
  r.capacity = 1000;
  r.curve = {100, 200, {{100, 2.0}, {200, 1.0}}};
  return r;
}

class SharedBlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    jobs_ = "/ferry-jobs-test-" + shm_names::job_token();
    links_ = "/ferry-links-test-" + shm_names::job_token();
  }
  void TearDown() override {
    JobLedger::unlink(jobs_);
    LinkLedger::unlink(links_);
  }
  std::string jobs_, links_;
  const std::vector<NamedLink> topology_ = {{"gpu0", {1, 1, 1}}, {"sw0", {2, 2, 1}}};
};

TEST_F(SharedBlockTest, AJunkFileAtTheJobLedgersNameIsReplacedWhenNobodyMapsIt) {
  write_block(jobs_, kJunk);
  EXPECT_EQ(JobLedger::open_existing(jobs_), nullptr);  // `trainer jobs`: nothing there
  EXPECT_FALSE(exists(jobs_));
  write_block(jobs_, kJunk);
  auto ledger = JobLedger::attach(jobs_);
  const JobGrant g = ledger->join(request());
  EXPECT_FALSE(g.waiting);
  EXPECT_EQ(ledger->snapshot().size(), 1u);
}

TEST_F(SharedBlockTest, AJunkFileAtTheLinkLedgersNameIsReplacedWhenNobodyMapsIt) {
  write_block(links_, kJunk);
  EXPECT_EQ(LinkLedger::open_existing(links_), nullptr);
  write_block(links_, kJunk);
  auto ledger = LinkLedger::attach(links_, topology_, LedgerUser{"job", 0, "runs/x"});
  EXPECT_EQ(ledger->link_count(), 2);
  EXPECT_EQ(ledger->snapshot().users.size(), 1u);
}

// A bad block that a live process maps (here: a descriptor holding the shared flock, as every
// ledger user does) is refused in one line naming it and saying what to do.
TEST_F(SharedBlockTest, ABadBlockThatALiveProcessMapsIsRefusedInOneLine) {
  for (const std::string& name : {jobs_, links_}) {
    write_block(name, kJunk);
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(flock(fd, LOCK_SH), 0);
    try {
      if (name == jobs_) {
        JobLedger::attach(jobs_);
      } else {
        LinkLedger::attach(links_, topology_, LedgerUser{});
      }
      ADD_FAILURE() << "a bad block in use was attached";
    } catch (const DataError& e) {
      EXPECT_EQ(exit_code_for(e), 2);
      const std::string what = e.what();
      EXPECT_NE(what.find("/dev/shm" + name), std::string::npos) << what;
      EXPECT_NE(what.find("it is 5 bytes"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_EQ(e.hint(), "remove /dev/shm" + name + " once no ferry job runs");
    }
    EXPECT_TRUE(exists(name));  // not removed under its user
    close(fd);                  // the user went away: recovered now
    if (name == jobs_) {
      EXPECT_NO_THROW(JobLedger::attach(jobs_)->join(request()));
    } else {
      EXPECT_NO_THROW(LinkLedger::attach(links_, topology_, LedgerUser{}));
    }
  }
}

// A sound ledger in use is never taken for a bad one: its users' flocks are shared.
TEST_F(SharedBlockTest, ASoundLedgerInUseIsAttachedByTheNext) {
  auto first = JobLedger::attach(jobs_);
  const JobGrant a = first->join(request());
  auto second = JobLedger::attach(jobs_);
  EXPECT_EQ(second->poll(a.id).granted, a.granted);
  EXPECT_NE(JobLedger::open_existing(jobs_), nullptr);
}

// Right magic and version, random bodies (with a random mutex, and with a sound one so that the
// fields behind it are checked): no crash, and each is replaced by a working ledger.
TEST_F(SharedBlockTest, RandomBodiesUnderTheRightHeaderNeverCrashAJobLedger) {
  std::mt19937_64 rng(27);
  using Shared = JobLedger::Shared;
  for (int trial = 0; trial < 300; ++trial) {
    write_block(
        jobs_, random_block(rng, sizeof(Shared), job_ledger_impl::kMagic, job_ledger_impl::kVersion,
                            offsetof(Shared, mu), trial % 2 == 1));
    if (trial % 3 == 0) {
      EXPECT_EQ(JobLedger::open_existing(jobs_), nullptr) << trial;
      continue;
    }
    auto ledger = JobLedger::attach(jobs_);
    const JobGrant g = ledger->join(request());
    EXPECT_FALSE(g.waiting) << trial;
    EXPECT_EQ(ledger->snapshot().size(), 1u) << trial;
    EXPECT_TRUE(ledger->history().size() >= 1u) << trial;
  }
}

TEST_F(SharedBlockTest, RandomBodiesUnderTheRightHeaderNeverCrashALinkLedger) {
  std::mt19937_64 rng(26);
  using Shared = LinkLedger::Shared;
  for (int trial = 0; trial < 200; ++trial) {
    write_block(links_,
                random_block(rng, sizeof(Shared), link_ledger_impl::kMagic,
                             link_ledger_impl::kVersion, offsetof(Shared, mu), trial % 2 == 1));
    auto ledger = LinkLedger::attach(links_, topology_, LedgerUser{"job", 0, ""});
    EXPECT_EQ(ledger->snapshot().links.size(), 2u) << trial;
    EXPECT_EQ(ledger->usage().size(), 2u) << trial;
  }
}

// A sound job ledger with jobs on it, then one field damaged: the check finds it bad and it is
// replaced (every operation works); never a crash.
TEST_F(SharedBlockTest, DamagedFieldsOfASoundJobLedgerNeverCrashIt) {
  std::mt19937_64 rng(11);
  using Shared = JobLedger::Shared;
  for (int trial = 0; trial < 300; ++trial) {
    JobLedger::unlink(jobs_);
    {
      auto ledger = JobLedger::attach(jobs_);
      for (int k = 0; k < 3; ++k) ledger->report(ledger->join(request()).id, 100);
      // Leaves the entries behind, as a job killed at this instant would (this pid lives on).
    }
    const int fd = shm_open(jobs_.c_str(), O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    auto* bytes = static_cast<unsigned char*>(
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    ASSERT_NE(bytes, MAP_FAILED);
    // One field a reader indexes or reads through, set to a random value (or a text left
    // unterminated): not the mutex, a random one is the case above.
    auto* s = reinterpret_cast<Shared*>(bytes);
    job_ledger_impl::JobSlot& j = s->jobs[rng() % 3];
    const auto value = static_cast<int32_t>(rng());
    switch (trial % 7) {
      case 0:
        j.gpu = value;
        break;
      case 1:
        j.curve.n_ladder = value;
        break;
      case 2:
        j.used = value;
        break;
      case 3:
        s->gpus[0].used = value;
        break;
      case 4:
        std::memset(s->gpus[0].device, 'x', sizeof(s->gpus[0].device));
        break;
      case 5:
        std::memset(j.config, 'x', sizeof(j.config));
        break;
      default:
        std::memset(s->history[0].device, 'x', sizeof(s->history[0].device));
        break;
    }
    munmap(bytes, sizeof(Shared));
    auto ledger = JobLedger::attach(jobs_);
    EXPECT_LE(ledger->snapshot().size(), 1u) << trial;
    ledger->history();
    const JobGrant g = ledger->join(request());
    EXPECT_FALSE(ledger->poll(g.id).gone) << trial;
    ledger->leave(g.id);
  }
}

}  // namespace
}  // namespace ferry
