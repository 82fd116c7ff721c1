// No leak window (issue 15, item 17): a link ledger block whose creator was killed (kill -9)
// before it removed the name is removed by the next job's create(); blocks of live processes
// and names of other forms are left alone; a pid reused by another process does not keep a
// stale block alive; the job's other ranks find the block by the job's token.
#include "common/shm_names.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "links/link_ledger.h"

namespace ferry {
namespace {

bool in_dev_shm(const std::string& name) {
  return std::filesystem::exists("/dev/shm" + name);  // name starts with '/'
}

std::vector<NamedLink> one_link() { return {{"gpu0", {10, 10, 1}}}; }

// A child process creates a ledger block for a job, reports its name, and is killed (SIGKILL)
// before it can remove it, as a rank killed between the ledger's creation and its unlink.
std::string block_of_a_killed_creator(const std::string& token) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    close(fds[0]);
    const std::string name = LinkLedger::name_for(token);
    LinkLedger::create(name, one_link());
    (void)!write(fds[1], name.c_str(), name.size() + 1);
    close(fds[1]);
    for (;;) pause();  // killed here
  }
  close(fds[1]);
  char buffer[256] = {};
  size_t got = 0;
  ssize_t n;
  while (got < sizeof(buffer) - 1 && (n = read(fds[0], buffer + got, sizeof(buffer) - 1 - got)) > 0)
    got += static_cast<size_t>(n);
  close(fds[0]);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  return std::string(buffer);
}

TEST(ShmNames, TheNextJobRemovesTheBlockOfAKilledCreator) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "needs /dev/shm";
  const std::string token = shm_names::job_token();
  const std::string stale = block_of_a_killed_creator(token);
  ASSERT_FALSE(stale.empty());
  EXPECT_EQ(stale.rfind("/ferry-links-", 0), 0u) << stale;
  ASSERT_TRUE(in_dev_shm(stale)) << "the killed creator left its block behind";
  EXPECT_EQ(LinkLedger::find(token), stale);  // the job's other ranks would find it

  // The next job on the machine creates its own ledger: the stale block goes, its own stays.
  const std::string next = LinkLedger::unique_name();
  auto ledger = LinkLedger::create(next, one_link());
  EXPECT_FALSE(in_dev_shm(stale)) << stale << " survived the next job's start";
  EXPECT_TRUE(in_dev_shm(next));
  EXPECT_EQ(LinkLedger::find(token), "");
  // A sweep leaves a live creator's block (this process's) alone.
  shm_names::remove_stale_blocks("ferry-links");
  EXPECT_TRUE(in_dev_shm(next));
  LinkLedger::unlink(next);
  EXPECT_FALSE(in_dev_shm(next));
}

TEST(ShmNames, AReusedPidDoesNotKeepAStaleBlockAlive) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "needs /dev/shm";
  const shm_names::ProcessId me = shm_names::self();
  ASSERT_GT(me.start, 0u);
  EXPECT_TRUE(shm_names::alive(me));
  EXPECT_FALSE(shm_names::alive({me.pid, me.start + 1}));  // same pid, another process
  // Blocks named for this pid but another start time (a creator whose pid was reused), and a
  // name of another form, which is never touched.
  const std::string reused =
      "/ferry-links-" + std::to_string(me.pid) + "." + std::to_string(me.start + 1) + "-test";
  const std::string foreign = "/ferry-links-not-ours-" + std::to_string(me.pid);
  for (const std::string& name : {reused, foreign}) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << name;
    close(fd);
  }
  const std::vector<std::string> removed = shm_names::remove_stale_blocks("ferry-links");
  EXPECT_NE(std::find(removed.begin(), removed.end(), reused), removed.end());
  EXPECT_FALSE(in_dev_shm(reused));
  EXPECT_TRUE(in_dev_shm(foreign));
  shm_unlink(foreign.c_str());
}

TEST(ShmNames, NamesCarryTheCreatorAndTheToken) {
  const shm_names::ProcessId me = shm_names::self();
  const std::string name = shm_names::block_name("ferry-links", "tok-1");
  EXPECT_EQ(name,
            "/ferry-links-" + std::to_string(me.pid) + "." + std::to_string(me.start) + "-tok-1");
  EXPECT_NE(shm_names::job_token(), shm_names::job_token());
}

}  // namespace
}  // namespace ferry
