// What a hostile but fair user tries (issue 15), through the trainer binary: every mistake is
// one "error:" line, a "hint:" line and exit 2, before any training time is spent; run
// directories are owned (one job at a time, a fresh run never mixes with another run's
// checkpoints); checkpoint metadata is validated; nothing hangs or allocates without bound.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

namespace fs = std::filesystem;

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }

// A short quickstart run into `dir`, checkpointing every 5 steps into dir/ckpt.
std::string train_into(const std::string& dir, int steps, const std::string& more = "") {
  return trainer() + " train " + quickstart() + " run.dir=" + dir +
         " run.steps=" + std::to_string(steps) +
         " data.samples=160 data.batch_size=16 checkpoint.every=5 checkpoint.keep=3 "
         "memory.measure=false checkpoint.dir=" +
         dir + "/ckpt " + more;
}

std::vector<std::string> checkpoint_names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) out.push_back(entry.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// A pid that no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

TEST(HostileInput, CommandLineMistakesAreOneErrorWithAHintAndExit2) {
  const std::vector<std::string> mistakes = {" frobnicate",
                                             " plan " + quickstart() + " --gpus abc",
                                             " train " + quickstart() + " --bogus",
                                             " plan " + quickstart() + " --gpus 0",
                                             " info --model lenet5 --classes 0",
                                             " simulate " + quickstart() + " --chunk-mb -1",
                                             ""};
  for (const std::string& args : mistakes) {
    const Exit e = run(trainer() + args);
    EXPECT_EQ(e.code, 2) << args << "\n" << e.output;
    EXPECT_EQ(e.output.rfind("error: ", 0), 0u) << args << "\n" << e.output;
    EXPECT_NE(e.output.find("\nhint: "), std::string::npos) << args << "\n" << e.output;
  }
  EXPECT_EQ(run(trainer() + " --help").code, 0);
}

TEST(HostileInput, ValuesOutsideTheTestedEnvelopeAreRefusedAtLoad) {
  const std::string base = trainer() + " train " + quickstart() + " ";
  expect_user_error(run(base + "comm.bucket_mb=1e-9"), "comm.bucket_mb: must be in");
  expect_user_error(run(base + "comm.bucket_mb=1e300"), "comm.bucket_mb: must be in");
  expect_user_error(run(base + "data.workers=100000"), "data.workers: must be in [1, 256]");
  expect_user_error(run(base + "data.resize=3000000000"), "data.resize: must be in");
  expect_user_error(run(base + "topology.chunk_mb=1e-9"), "topology.chunk_mb: must be in");
  expect_user_error(run(base + "data.batch_size=9223372036854775807"),
                    "holds more than 2^48 values");
  expect_user_error(run(base + "comm.backend=nccl"), "NCCL needs CUDA device memory");
  expect_user_error(run(base + "model.input=[3,30000,30000]"), "out of device memory");
  expect_user_error(run(base + "memory.policy=vdnn-all memory.host_limit=1"),
                    "out of pinned host pool");
  expect_user_error(run(base + "run.trace=true run.trace_steps=[500,600]"),
                    "run.trace_steps: starts at step 500, after the last step");
}

// Token data and GPT sizes (issue 17): a bad file, tokens beyond the vocabulary, heads that do
// not divide the width, a window longer than the context, a model for the other kind of data.
TEST(HostileInput, TokenFilesAndTransformerSizesAreCheckedBeforeTraining) {
  const std::string dir = scratch("hostile_tokens");
  const auto tokens = [&](const std::string& name, std::vector<int32_t> header,
                          const std::vector<uint16_t>& body) {
    const std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary);
    header.resize(header.empty() ? 0 : 256, 0);
    out.write(reinterpret_cast<const char*>(header.data()),
              static_cast<std::streamsize>(header.size() * sizeof(int32_t)));
    out.write(reinterpret_cast<const char*>(body.data()),
              static_cast<std::streamsize>(body.size() * sizeof(uint16_t)));
    return path;
  };
  std::vector<uint16_t> body(4096);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint16_t>(i % 200);
  const std::string good = tokens("good.bin", {20240520, 1, 4096}, body);
  const std::string base = trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
                           "/configs/gpt_text.yaml run.steps=1 run.dir=" + dir +
                           "/run run.overwrite=true memory.measure=false data.val_path= ";
  expect_user_error(run(base + "data.path=" + tokens("version.bin", {20240520, 7, 4096}, body)),
                    "version.bin");
  expect_user_error(run(base + "data.path=" + tokens("short.bin", {20240520, 1, 9999}, body)),
                    "short.bin");
  expect_user_error(run(base + "data.path=" + good + " model.vocab=100"),
                    "outside the vocabulary of 100 (model.vocab)");
  expect_user_error(run(base + "data.path=" + good + " model.heads=3"),
                    "model.heads (3) must divide model.width (128)");
  expect_user_error(run(base + "data.path=" + good + " data.seq_len=129"),
                    "data.seq_len: must be <= model.context (128)");
  expect_user_error(run(base + "data.path=" + good + " model.name=resnet18_cifar"),
                    "reads images, but data.source is tokens");
  expect_user_error(run(base + "data.path=" + good + " data.source=synthetic"),
                    "reads tokens, but data.source is synthetic");
}

// A token at or above model.vocab (issue 29), in llm.c's uint32 files: train and eval refuse the
// file before the first step, one error line naming the file, the first bad position, the token,
// the vocabulary and the file's largest token, and exit 2.
TEST(HostileInput, ATokenOutsideTheVocabularyIsRefusedBeforeTheFirstStep) {
  const std::string dir = scratch("hostile_vocab");
  const auto file = [&](const std::string& name, int32_t magic, int32_t version,
                        const std::vector<uint32_t>& body, int width) {
    const std::string path = dir + "/" + name;
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(body.size());
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    for (uint32_t t : body) out.write(reinterpret_cast<const char*>(&t), width);  // little-endian
    return path;
  };
  std::vector<uint32_t> body(4096);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint32_t>(i % 300);
  body[1000] = 70000;
  body[3000] = 80000;
  const std::string train = file("train.bin", 20240801, 7, body, 4);
  const std::string base = trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
                           "/configs/gpt_text.yaml run.steps=1 run.dir=" + dir +
                           "/run run.overwrite=true memory.measure=false data.val_path= "
                           "data.batch_size=2 model.layers=1 model.width=32 model.heads=2 "
                           "model.context=16 data.path=" +
                           train;
  const auto one_error = [](const Exit& e, const std::string& line) {
    expect_user_error(e, line);
    EXPECT_EQ(e.output.find("error: "), e.output.rfind("error: ")) << "one error:\n" << e.output;
    EXPECT_NE(("\n" + e.output).find("\n" + line + "\n"), std::string::npos) << e.output;
  };
  one_error(run(base + " model.vocab=70000"),
            "error: token file '" + train +
                "': token 70000 at position 1000 is outside the vocabulary of 70000 "
                "(model.vocab); the file's largest token is 80000");
  const Exit ok = run(base + " model.vocab=80001");
  ASSERT_EQ(ok.code, 0) << ok.output;
  // Evaluation reads data.val_path: a file whose sixth token is 80001.
  std::vector<uint32_t> val(64, 7);
  val[5] = 80001;
  const std::string val_path = file("val.bin", 20240801, 7, val, 4);
  one_error(run(trainer() + " eval " + std::string(FERRY_SOURCE_DIR) +
                "/configs/gpt_text.yaml run.dir=" + dir +
                "/run memory.measure=false data.batch_size=2 model.layers=1 model.width=32 "
                "model.heads=2 model.context=16 model.vocab=80001 data.path=" +
                train + " data.val_path=" + val_path),
            "error: token file '" + val_path +
                "': token 80001 at position 5 is outside the vocabulary of 80001 (model.vocab); "
                "the file's largest token is 80001");
}

TEST(HostileInput, AConfigThatIsNotAConfigFileIsRefusedWithoutReadingItAll) {
  const Exit e = run(trainer() + " config /dev/zero");
  expect_user_error(e, "config file '/dev/zero' is larger than 1 MiB");
  EXPECT_LT(e.seconds, 10.0);
  // yaml-cpp calls its nesting limit "bad file"; the message says what it is.
  const std::string deep = scratch("hostile_deep") + "/deep.yaml";
  std::ofstream(deep) << "run: " << std::string(3000, '[') << std::string(3000, ']') << "\n";
  expect_user_error(run(trainer() + " config " + deep), "malformed YAML: nested more than");
}

TEST(HostileInput, AFileNameWithANewlineStaysOnTheErrorLine) {
  const std::string dir = scratch("hostile_newline");
  const Exit e = run(trainer() + " config '" + dir + "/bad\nname.yaml'");
  expect_user_error(e, "cannot read config file '" + dir + "/bad\\nname.yaml'");
  EXPECT_EQ(e.output.rfind("error: ", 0), 0u) << e.output;
  EXPECT_EQ(e.output.find("\nhint: "), e.output.find('\n')) << "two lines:\n" << e.output;
}

TEST(HostileInput, UnwritableRunAndCheckpointFoldersFailBeforeTraining) {
  const std::string dir = scratch("hostile_unwritable");
  { std::ofstream(dir + "/a_file") << "x"; }
  expect_user_error(run(train_into(dir + "/a_file/run", 10)), "run.dir: cannot create");
  expect_user_error(run(train_into(dir + "/ok", 10, "checkpoint.dir=" + dir + "/a_file/ckpt")),
                    "checkpoint.dir: cannot create");
}

TEST(HostileInput, ASecondJobIntoABusyRunDirIsRefusedNamingTheFirst) {
  const std::string dir = scratch("hostile_busy");
  const int fd = ::open((dir + "/.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string pid = std::to_string(::getpid()) + "\n";
  ASSERT_EQ(::write(fd, pid.data(), pid.size()), static_cast<ssize_t>(pid.size()));
  expect_user_error(run(train_into(dir, 10)),
                    "is in use by another job (pid " + std::to_string(::getpid()) + ")");
  ::close(fd);  // the lock goes with it
  const Exit e = run(train_into(dir, 5));
  EXPECT_EQ(e.code, 0) << e.output;
}

TEST(HostileInput, AFreshRunNeverMixesWithAnotherRunsCheckpoints) {
  const std::string dir = scratch("hostile_fresh");
  Exit e = run(train_into(dir, 20));
  ASSERT_EQ(e.code, 0) << e.output;
  const auto first = checkpoint_names(dir + "/ckpt");
  ASSERT_EQ(first, (std::vector<std::string>{"step_10.safetensors", "step_15.safetensors",
                                             "step_20.safetensors"}));
  // A second fresh run into it is refused and deletes nothing.
  expect_user_error(run(train_into(dir, 10)),
                    "holds another run's checkpoints (3 of them, steps "
                    "10 to 20)");
  EXPECT_EQ(checkpoint_names(dir + "/ckpt"), first);
  // run.overwrite starts over: only the new run's checkpoints and metrics remain.
  e = run(train_into(dir, 10, "run.overwrite=true"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("deleted 3 checkpoints of an earlier run"), std::string::npos)
      << e.output;
  EXPECT_EQ(checkpoint_names(dir + "/ckpt"),
            (std::vector<std::string>{"step_10.safetensors", "step_5.safetensors"}));
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::string line, last;
  int lines = 0;
  while (std::getline(metrics, line)) ++lines, last = line;
  EXPECT_EQ(lines, 1) << "run.log_every=25: one record, at the last step (10)";
  EXPECT_NE(last.find("\"step\":10"), std::string::npos) << last;
  // Resuming continues it; overwrite together with resume is a contradiction.
  expect_user_error(run(train_into(dir, 15, "run.overwrite=true checkpoint.resume=latest")),
                    "run.overwrite=true starts over");
  e = run(train_into(dir, 15, "checkpoint.resume=latest"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("at step 10"), std::string::npos) << e.output;
}

TEST(HostileInput, StaleTempFilesOfDeadWritersAreRemovedAndOddNamesIgnored) {
  const std::string dir = scratch("hostile_stale");
  fs::create_directories(dir + "/ckpt");
  const std::string stale = dir + "/ckpt/step_5.safetensors.tmp." + std::to_string(dead_pid());
  const std::string live = dir + "/ckpt/step_6.safetensors.tmp." + std::to_string(::getpid());
  { std::ofstream(stale) << "half a checkpoint"; }
  { std::ofstream(live) << "being written"; }
  { std::ofstream(dir + "/ckpt/step_99999999999999999999.safetensors") << "not ours"; }
  { std::ofstream(dir + "/ckpt/step_-5.safetensors") << "not ours either"; }
  Exit e = run(train_into(dir, 5, "checkpoint.resume=latest"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live)) << "a live writer's file stays";
  EXPECT_NE(e.output.find("removed  " + stale), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("no checkpoint in '" + dir + "/ckpt' yet, starting fresh"),
            std::string::npos)
      << e.output;
  EXPECT_TRUE(fs::exists(dir + "/ckpt/step_5.safetensors"));
}

// Rewrites the metadata key `key` of checkpoint `from` into `to`.
void rewrite_metadata(const std::string& from, const std::string& to, const std::string& key,
                      const std::string& value) {
  const SafetensorsFile file = read_safetensors(from);
  SafetensorsMetadata metadata = file.metadata();
  metadata[key] = value;
  std::vector<SafetensorsTensor> tensors;
  for (const auto& e : file.entries())
    tensors.push_back({e.name, e.dtype, e.shape, e.bytes.data()});
  write_safetensors(to, tensors, metadata);
}

TEST(HostileInput, CheckpointStepsAndFormatAreValidatedAtResume) {
  const std::string dir = scratch("hostile_meta");
  ASSERT_EQ(run(train_into(dir, 5)).code, 0);
  const std::string good = dir + "/ckpt/step_5.safetensors";
  const std::string bad = dir + "/bad.safetensors";
  for (const auto& [key, value, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"step", "-5", "metadata 'step' is -5, outside [0, 2^53]"},
           {"step", "9223372036854775807", "outside [0, 2^53]"},
           {"step", "99999999999999999999", "metadata 'step' is not an integer"},
           {"format", "ferry-checkpoint-99", "checkpoint format 'ferry-checkpoint-99'"}}) {
    rewrite_metadata(good, bad, key, value);
    expect_user_error(run(train_into(dir + "/r", 10, "checkpoint.resume=" + bad)), message);
  }
  expect_user_error(run(train_into(dir, 3, "checkpoint.resume=" + good)),
                    "is at step 5, past run.steps=3");
}

}  // namespace
}  // namespace ferry::testing
