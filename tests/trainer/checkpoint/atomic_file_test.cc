// Atomic replacement: after success no temp file remains; a failed or killed write leaves the
// previous file byte-for-byte intact and loadable.
#include "trainer/checkpoint/atomic_file.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/temp_dir.h"
#include "trainer/checkpoint/safetensors.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }
  // Names of the files in the test directory.
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_.path()))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  testing::TempDir dir_;
};

std::vector<float> ramp(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

void write_ramp(const std::string& path, size_t n, float start) {
  const std::vector<float> v = ramp(n, start);
  write_safetensors(path, {{"w", DType::kF32, Shape{static_cast<int64_t>(n)}, v.data()}},
                    {{"start", std::to_string(start)}});
}

void expect_ramp(const std::string& path, size_t n, float start) {
  const SafetensorsFile f = read_safetensors(path);
  ASSERT_EQ(f.at("w").shape, (Shape{static_cast<int64_t>(n)}));
  std::vector<float> back(n);
  std::memcpy(back.data(), f.at("w").bytes.data(), n * 4);
  EXPECT_EQ(back, ramp(n, start));
}

TEST_F(AtomicFileTest, SuccessLeavesNoTempFile) {
  write_ramp(path("ck.safetensors"), 100, 1.0f);
  EXPECT_EQ(listing(), std::vector<std::string>{"ck.safetensors"});
  write_ramp(path("ck.safetensors"), 50, 7.0f);  // replaces
  EXPECT_EQ(listing(), std::vector<std::string>{"ck.safetensors"});
  expect_ramp(path("ck.safetensors"), 50, 7.0f);
}

TEST_F(AtomicFileTest, WriterWithoutCommitRemovesTemp) {
  {
    AtomicFileWriter w(path("f"));
    w.write("abc", 3);
    EXPECT_TRUE(fs::exists(w.temp_path()));
    EXPECT_EQ(w.temp_path(), path("f") + ".tmp." + std::to_string(::getpid()));
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(AtomicFileTest, MissingDirectoryIsDataError) {
  EXPECT_THROW(write_ramp(path("no/such/dir/ck.safetensors"), 4, 0.0f), DataError);
  EXPECT_TRUE(listing().empty());
}

TEST_F(AtomicFileTest, FailedRenameKeepsTargetAndRemovesTemp) {
  fs::create_directories(path("ck.safetensors"));  // a directory where the file should go
  fs::create_directories(path("ck.safetensors/inner"));
  EXPECT_THROW(write_ramp(path("ck.safetensors"), 10, 0.0f), DataError);
  EXPECT_EQ(listing(), std::vector<std::string>{"ck.safetensors"});
  EXPECT_TRUE(fs::is_directory(path("ck.safetensors/inner")));
}

// Runs `body` in a child whose files may not grow past `limit` bytes; returns the wait status.
template <typename F>
int run_with_file_size_limit(rlim_t limit, bool ignore_sigxfsz, F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit core{0, 0};
    ::setrlimit(RLIMIT_CORE, &core);
    rlimit fsize{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &fsize);
    if (ignore_sigxfsz) ::signal(SIGXFSZ, SIG_IGN);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST_F(AtomicFileTest, FailingWriteKeepsPreviousFile) {
  write_ramp(path("ck.safetensors"), 1000, 3.0f);
  // The write fails with EFBIG after 64 KiB of a 4 MB tensor: DataError, temp removed.
  const int status = run_with_file_size_limit(64 << 10, /*ignore_sigxfsz=*/true, [&] {
    try {
      write_ramp(path("ck.safetensors"), 1 << 20, 9.0f);
    } catch (const DataError& e) {
      return std::string(e.what()).find("File too large") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1 = no error raised, 2 = unexpected message";
  EXPECT_EQ(listing(), std::vector<std::string>{"ck.safetensors"});
  expect_ramp(path("ck.safetensors"), 1000, 3.0f);
}

TEST_F(AtomicFileTest, WriterKilledMidWriteKeepsPreviousFile) {
  write_ramp(path("ck.safetensors"), 1000, 3.0f);
  // SIGXFSZ kills the child in the middle of the data: a crash, no cleanup code runs.
  const int status = run_with_file_size_limit(64 << 10, /*ignore_sigxfsz=*/false, [&] {
    write_ramp(path("ck.safetensors"), 1 << 20, 9.0f);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGXFSZ);
  // The previous checkpoint loads unchanged; the stale temp file is the only other file.
  expect_ramp(path("ck.safetensors"), 1000, 3.0f);
  const std::vector<std::string> files = listing();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[1].rfind("ck.safetensors.tmp.", 0), 0u) << files[1];
  EXPECT_EQ(fs::file_size(path(files[1])), 64u << 10);
  // The writer is dead: its temp file is stale and goes; a live writer's stays.
  const std::string live = path("other.safetensors.tmp." + std::to_string(::getpid()));
  std::ofstream(live) << "in progress";
  const std::vector<std::string> removed = remove_stale_temp_files(dir_.str());
  EXPECT_EQ(removed, std::vector<std::string>{path(files[1])});
  EXPECT_EQ(listing(), (std::vector<std::string>{"ck.safetensors", fs::path(live).filename()}));
}

}  // namespace
}  // namespace ferry
