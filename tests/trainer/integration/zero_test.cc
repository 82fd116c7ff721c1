// memory.zero and memory.optimizer change where the model state lives, never the run: under
// mpirun, a CNN (quickstart's) and a small GPT (AdamW) train with zero 1, zero 2 and the host
// optimizer to the same losses and parameters as zero 0 (bitwise on 2 ranks, where the sum of two
// is the same either way; on 4 ranks within the tolerance printed), the measured device peak is
// the planned one, and a zero 2 + host run checkpointed on 4 ranks resumes on 2 ranks with zero 0
// and on 1 rank to the parameters the uninterrupted run had (and on 4 ranks bitwise). Under bf16
// the same with the fp32 master weights sharded, or on the host (Note [Sharded master weights]).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "device/cpu/bf16_support.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

// Every F32 tensor of a checkpoint, optimizer state included.
std::map<std::string, std::vector<float>> all_tensors(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  const SafetensorsFile file = read_safetensors(path);
  for (const auto& e : file.entries()) {
    if (e.dtype != DType::kF32) continue;
    std::vector<float> v(e.bytes.size() / sizeof(float));
    std::memcpy(v.data(), e.bytes.data(), e.bytes.size());
    out[e.name] = std::move(v);
  }
  return out;
}

// Loss per logged step from <dir>/metrics.jsonl.
std::map<int64_t, double> losses(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::map<int64_t, double> out;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// The largest relative difference of the losses both runs logged (over `from`..).
double loss_gap(const std::string& a, const std::string& b, int64_t from = 0) {
  const auto la = losses(a), lb = losses(b);
  double gap = 0;
  int compared = 0;
  for (const auto& [step, v] : la) {
    if (step < from || !lb.count(step)) continue;
    gap = std::max(gap, std::fabs(v - lb.at(step)) / std::max(1e-12, std::fabs(lb.at(step))));
    ++compared;
  }
  EXPECT_GT(compared, 0) << a << " vs " << b;
  return gap;
}

nlohmann::json summary(const std::string& dir) {
  std::ifstream in(dir + "/summary.json");
  return nlohmann::json::parse(in);
}

std::string tokens_file() {
  static const std::string path = [] {
    const std::string dir = scratch("zero_tokens");
    std::ofstream out(dir + "/train.bin", std::ios::binary);
    uint32_t x = 4242;
    for (int i = 0; i < 40000; ++i) {
      x = x * 1664525u + 1013904223u;
      const uint16_t token = static_cast<uint16_t>((x >> 16) % 256);
      out.write(reinterpret_cast<const char*>(&token), sizeof(token));
    }
    return dir + "/train.bin";
  }();
  return path;
}

std::string cnn(const std::string& dir, int steps) {
  return " train " + std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml run.dir=" + dir +
         " run.steps=" + std::to_string(steps) +
         " run.log_every=1 data.samples=1024 memory.measure=false comm.bucket_mb=0.05 "
         "checkpoint.every=" +
         std::to_string(steps) + " checkpoint.dir=" + dir + "/ckpt";
}

std::string gpt(const std::string& dir, int steps, int every) {
  return " train " + std::string(FERRY_SOURCE_DIR) + "/configs/gpt_text.yaml run.dir=" + dir +
         " run.steps=" + std::to_string(steps) + " run.log_every=1 data.path=" + tokens_file() +
         " data.val_path= optim.clip_norm=1.0 model.context=32 model.layers=2 model.width=64 "
         "memory.measure=false comm.bucket_mb=0.02 checkpoint.every=" +
         std::to_string(every) + " checkpoint.dir=" + dir + "/ckpt";
}

class Zero : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  }
};

const char* kStates[] = {"memory.zero=1", "memory.zero=2", "memory.zero=2 memory.optimizer=host",
                         "memory.optimizer=host"};

TEST_F(Zero, TwoRanksCnnBitwiseEqualZeroZero) {
  const std::string base = scratch("zero_cnn_0");
  Exit e = run(mpirun(2) + trainer() + cnn(base, 20) + " data.batch_size=8");
  ASSERT_EQ(e.code, 0) << e.output;
  const auto want = all_tensors(base + "/ckpt/step_20.safetensors");
  for (const char* state : kStates) {
    const std::string dir =
        scratch(std::string("zero_cnn_") + std::to_string(std::hash<std::string>{}(state) % 1000));
    e = run(mpirun(2) + trainer() + cnn(dir, 20) + " data.batch_size=8 " + state);
    ASSERT_EQ(e.code, 0) << state << "\n" << e.output;
    EXPECT_NE(e.output.find("state    zero"), std::string::npos) << e.output;
    EXPECT_EQ(loss_gap(dir, base), 0.0) << state;
    const auto got = all_tensors(dir + "/ckpt/step_20.safetensors");
    ASSERT_EQ(got.size(), want.size()) << state;
    for (const auto& [name, v] : want) {
      ASSERT_EQ(got.at(name).size(), v.size()) << name;
      EXPECT_EQ(std::memcmp(got.at(name).data(), v.data(), v.size() * sizeof(float)), 0)
          << state << ": " << name;
    }
    const nlohmann::json s = summary(dir);
    EXPECT_EQ(s["device_peak_bytes"], s["planned_peak_bytes"]) << state;
    EXPECT_LT(s["device_peak_bytes"].get<uint64_t>(),
              summary(base)["device_peak_bytes"].get<uint64_t>())
        << state << ": less model state on the device";
  }
}

// comm.dtype bf16 all-reduces in bf16; zero 1 and 2 reduce-scatter in fp32: refused in one line
// (exit 2), never run with the wire dtype ignored.
TEST_F(Zero, ABf16WireWithShardedGradientsIsRefused) {
  if (!cpu::bf16_gap_here().empty()) GTEST_SKIP() << cpu::bf16_gap_here();
  const std::string dir = scratch("zero_bf16_wire");
  const Exit e = run(mpirun(2) + trainer() + cnn(dir, 2) +
                     " data.batch_size=8 memory.zero=1 device.precision=bf16 comm.dtype=bf16");
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("comm.dtype: bf16 all-reduces in bf16, but memory.zero 1 "
                          "reduce-scatters the gradients, which runs in fp32 only"),
            std::string::npos)
      << e.output;
}

TEST_F(Zero, GptAtTwoAndFourRanksEqualZeroZero) {
  for (int ranks : {2, 4}) {
    const std::string batch = " data.batch_size=" + std::to_string(16 / ranks);
    const std::string base = scratch("zero_gpt_0_" + std::to_string(ranks));
    Exit e = run(mpirun(ranks) + trainer() + gpt(base, 20, 20) + batch);
    ASSERT_EQ(e.code, 0) << e.output;
    for (const char* state : kStates) {
      const std::string dir = scratch("zero_gpt_" + std::to_string(ranks) + "_" +
                                      std::to_string(std::hash<std::string>{}(state) % 1000));
      e = run(mpirun(ranks) + trainer() + gpt(dir, 20, 20) + batch + " " + state);
      ASSERT_EQ(e.code, 0) << state << "\n" << e.output;
      const double gap = loss_gap(dir, base);
      std::printf(
          "gpt, %d ranks, %s: largest relative loss difference to zero 0 over 20 steps "
          "%.3g\n",
          ranks, state, gap);
      // Clipping's norm is summed by shard (another order): within 1e-6, bitwise otherwise.
      EXPECT_LE(gap, 1e-6) << state;
      const nlohmann::json s = summary(dir);
      EXPECT_EQ(s["device_peak_bytes"], s["planned_peak_bytes"]) << state;
    }
  }
}

// Zero 2 keeps no whole gradient block (Note [Gradients through a staging ring]): rank 0's gradient
// bytes are the plan's formula (`trainer plan --ranks N`: the shard and two buckets plus the tied
// embedding's gradient), less than zero 1's whole block, and the measured peak is the planned one.
TEST_F(Zero, ZeroTwoGradientBytesAreTheFormulasAtTwoAndFourRanks) {
  const std::string model =
      " optim.clip_norm=1.0 model.context=32 model.layers=2 model.width=64 memory.measure=false "
      "comm.bucket_mb=0.02 data.val_path= data.path=" +
      tokens_file();
  for (int ranks : {2, 4}) {
    const auto plan = [&](const std::string& zero) {
      const Exit e = run(trainer() + " plan " + std::string(FERRY_SOURCE_DIR) +
                         "/configs/gpt_text.yaml --json --ranks " + std::to_string(ranks) +
                         " memory.zero=" + zero + " run.dir=" + scratch("zero2_plan") + model);
      EXPECT_EQ(e.code, 0) << e.output;
      return nlohmann::json::parse(e.output.substr(e.output.find('{')))["policies"][0];
    };
    const nlohmann::json p1 = plan("1"), p2 = plan("2");
    const std::string dir = scratch("zero2_bytes_" + std::to_string(ranks));
    const Exit e =
        run(mpirun(ranks) + trainer() + gpt(dir, 3, 3) + " data.batch_size=4 memory.zero=2");
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_NE(e.output.find("of staging"), std::string::npos) << e.output;
    const nlohmann::json s = summary(dir);
    std::printf("zero 2, %d ranks: gradients %llu bytes per rank (zero 1: %llu), weights %llu\n",
                ranks, static_cast<unsigned long long>(s["gradients_bytes"].get<uint64_t>()),
                static_cast<unsigned long long>(p1["gradients_bytes"].get<uint64_t>()),
                static_cast<unsigned long long>(s["weights_bytes"].get<uint64_t>()));
    EXPECT_EQ(s["gradients_bytes"], p2["gradients_bytes"]) << ranks << " ranks";
    EXPECT_EQ(s["weights_bytes"], p2["weights_bytes"]) << ranks << " ranks";
    EXPECT_EQ(s["optimizer_bytes"], p2["optimizer_bytes"]) << ranks << " ranks";
    EXPECT_LT(s["gradients_bytes"].get<uint64_t>(), p1["gradients_bytes"].get<uint64_t>());
    EXPECT_EQ(s["device_peak_bytes"], s["planned_peak_bytes"]);
  }
}

TEST_F(Zero, FourRankZeroTwoHostCheckpointResumesOnTwoAndOneRank) {
  const std::string whole = scratch("zero_resume_whole");
  Exit e = run(mpirun(4) + trainer() + gpt(whole, 20, 10) +
               " data.batch_size=4 memory.zero=2 memory.optimizer=host");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string ckpt = whole + "/ckpt/step_10.safetensors";
  ASSERT_TRUE(std::filesystem::exists(ckpt));
  {
    // One consolidated file with today's names: every parameter's exp_avg and exp_avg_sq.
    const auto t = all_tensors(ckpt);
    EXPECT_TRUE(t.count("optimizer.exp_avg.transformer.wte.weight"));
    EXPECT_TRUE(t.count("optimizer.exp_avg_sq.transformer.wte.weight"));
  }
  // The same job resumed: bitwise the uninterrupted run (the shards went into the file and came
  // back whole).
  {
    const std::string dir = scratch("zero_resume_same");
    e = run(mpirun(4) + trainer() + gpt(dir, 20, 10) +
            " data.batch_size=4 memory.zero=2 memory.optimizer=host checkpoint.resume=" + ckpt);
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_EQ(loss_gap(dir, whole, 11), 0.0);
    expect_same_parameters(dir + "/ckpt/step_20.safetensors", whole + "/ckpt/step_20.safetensors",
                           0);
  }
  // Another rank count, stage and placement: the logged loss is rank 0's share of the batch, so
  // the parameters at step 20 are compared; the global batch is the same, summed in another
  // order, which AdamW's 1/sqrt(v) amplifies (1.3e-4 and 1.4e-4 measured; 5e-4 allowed, as a
  // 1-rank against 2-rank AdamW run differs).
  struct Resume {
    std::string name, launch, args;
  };
  for (const Resume& r : {Resume{"two_ranks_zero0", mpirun(2), " data.batch_size=8"},
                          Resume{"one_rank", "", " data.batch_size=16 memory.zero=1"}}) {
    const std::string dir = scratch("zero_resume_" + r.name);
    e = run(r.launch + trainer() + gpt(dir, 20, 10) + r.args + " checkpoint.resume=" + ckpt);
    ASSERT_EQ(e.code, 0) << r.name << "\n" << e.output;
    EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
    EXPECT_EQ(losses(dir).begin()->first, 11) << r.name;
    if (r.launch.empty()) {
      EXPECT_NE(e.output.find("changes nothing"), std::string::npos) << "zero on one rank says so";
    }
    expect_same_parameters(dir + "/ckpt/step_20.safetensors", whole + "/ckpt/step_20.safetensors",
                           5e-4);
  }
}

// The loss of the global batch at each logged step: the mean of every rank's logged loss (equal
// shares of the batch), read from each rank's log ("step 11/20  loss 5.5432  ...", 4 decimals).
std::map<int64_t, double> global_losses(const std::string& dir, int ranks) {
  std::map<int64_t, double> out;
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(dir + "/rank" + std::to_string(r) + ".log");
    EXPECT_TRUE(in) << dir << " rank " << r;
    for (std::string line; std::getline(in, line);) {
      const size_t step = line.find("step "), slash = line.find('/'), at = line.find("  loss ");
      if (step == std::string::npos || slash == std::string::npos || at == std::string::npos ||
          !(step < slash && slash < at))
        continue;
      out[std::stoll(line.substr(step + 5, slash - step - 5))] +=
          std::stod(line.substr(at + 7)) / ranks;
    }
  }
  return out;
}

// Issue 30, Checkpoints: a zero-2, 4-rank, host-optimizer run checkpointed at step 10 resumes on
// 2 ranks with zero 0 and on 1 rank, and the next 10 global-batch losses equal the uninterrupted
// run's within 2e-4 absolute (the logs' 4 decimals, averaged over ranks, plus AdamW's
// amplification of the sums' other order: measured below); the file loads in PyTorch.
TEST_F(Zero, HostCheckpointResumesWithTheUninterruptedLossesAndLoadsInTorch) {
  const std::string whole = scratch("zero_ckpt_whole");
  Exit e = run(mpirun(4) + trainer() + gpt(whole, 20, 10) +
               " data.batch_size=4 memory.zero=2 memory.optimizer=host");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string ckpt = whole + "/ckpt/step_10.safetensors";
  const auto want = global_losses(whole, 4);
  ASSERT_EQ(want.size(), 20u);
  struct Resume {
    std::string name, launch, args;
    int ranks;
  };
  for (const Resume& r :
       {Resume{"two_ranks_zero0", mpirun(2), " data.batch_size=8", 2},
        Resume{"one_rank_host", "", " data.batch_size=16 memory.optimizer=host", 1}}) {
    const std::string dir = scratch("zero_ckpt_" + r.name);
    e = run(r.launch + trainer() + gpt(dir, 20, 10) + r.args + " checkpoint.resume=" + ckpt);
    ASSERT_EQ(e.code, 0) << r.name << "\n" << e.output;
    const auto got = global_losses(dir, r.ranks);
    ASSERT_EQ(got.size(), 10u) << r.name << ": steps 11-20";
    EXPECT_EQ(got.begin()->first, 11) << r.name;
    double gap = 0;
    for (const auto& [step, loss] : got) {
      ASSERT_TRUE(want.count(step)) << step;
      gap = std::max(gap, std::fabs(loss - want.at(step)));
    }
    std::printf(
        "resumed %s: largest global-loss difference to the uninterrupted run over steps "
        "11-20 %.3g (loss %.4f at 20)\n",
        r.name.c_str(), gap, got.rbegin()->second);
    EXPECT_LE(gap, 2e-4) << r.name;
  }
  const Exit py =
      run("/usr/bin/python3 " + std::string(FERRY_SOURCE_DIR) +
          "/tests/trainer/integration/zero_checkpoint_torch.py " + ckpt + " 2 4 64 257 32");
  std::printf("%s", py.output.c_str());  // "... load in torch ..." or "SKIP: ..."
  if (py.code != 77) EXPECT_EQ(py.code, 0) << py.output;
}

// The ids of the processes of session `sid` (the job started by start_session).
std::vector<pid_t> session_pids(pid_t sid) {
  std::vector<pid_t> out;
  const Exit e = run("ps -o pid= --sid " + std::to_string(sid));
  std::istringstream in(e.output);
  for (pid_t p; in >> p;) out.push_back(p);
  return out;
}

// Starts `command` in a session of its own (mpirun and its ranks), output to `log`.
pid_t start_session(const std::string& command, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    setsid();
    const std::string line = "exec " + command + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Every complete-named checkpoint of `dir` loads whole (model and optimizer state); returns the
// newest step, 0 when none.
int64_t newest_loadable(const std::string& dir) {
  int64_t newest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) continue;
    std::map<std::string, std::vector<float>> t;
    EXPECT_NO_THROW(t = all_tensors(entry.path().string())) << name;
    EXPECT_TRUE(t.count("optimizer.exp_avg.transformer.wte.weight")) << name;
    newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
  }
  return newest;
}

// A zero-2, 4-rank, host-optimizer job dying while rank 0 writes a checkpoint leaves the previous
// checkpoint loadable and resumable: (1) rank 0 killed by SIGXFSZ halfway through step 20's file
// (bash's ulimit -f; the temp file stays, no cleanup runs), then resumed to step 20 bitwise equal
// to the uninterrupted run; (2) the whole job killed with SIGKILL the moment a temp file appears
// (checkpoint.every 1; mid-write or just after, as timing has it), three times, then resumed for
// one more step from the newest checkpoint, which loads whole.
TEST_F(Zero, AHostRunKilledWhileWritingACheckpointLeavesThePreviousOneLoadable) {
  const std::string state = " data.batch_size=4 memory.zero=2 memory.optimizer=host";
  const std::string whole = scratch("zero_killed_whole");
  Exit e = run(mpirun(4) + trainer() + gpt(whole, 20, 10) + state);
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string dir = scratch("zero_killed");
  e = run(mpirun(4) + trainer() + gpt(dir, 10, 10) + state);
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string ten = dir + "/ckpt/step_10.safetensors";
  const auto before = all_tensors(ten);
  const uintmax_t half_kib = std::filesystem::file_size(ten) / 2048;
  // The limit inside each rank only, and no shared-memory files in MPI's start-up (the vader
  // BTL's and PMIx's segments would meet it first).
  e = run("env PMIX_MCA_gds=hash " + mpirun(4) + "--mca btl self,tcp -x PMIX_MCA_gds bash -c '" +
          "ulimit -f " + std::to_string(half_kib) + "; exec " + trainer() + gpt(dir, 20, 10) +
          state + " checkpoint.resume=latest'");
  EXPECT_NE(e.code, 0) << "rank 0 dies writing step 20\n" << e.output;
  EXPECT_NE(e.output.find("File size limit exceeded"), std::string::npos) << e.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt/step_20.safetensors"));
  bool temp_left = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt"))
    temp_left |= entry.path().filename().string().rfind("step_20.safetensors.tmp.", 0) == 0;
  EXPECT_TRUE(temp_left) << "killed in the middle of the write";
  EXPECT_EQ(newest_loadable(dir + "/ckpt"), 10);
  EXPECT_EQ(all_tensors(ten), before) << "the previous checkpoint is untouched";
  e = run(mpirun(4) + trainer() + gpt(dir, 20, 10) + state + " checkpoint.resume=latest");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
  expect_same_parameters(dir + "/ckpt/step_20.safetensors", whole + "/ckpt/step_20.safetensors", 0);

  // SIGKILL to every process of the job as soon as a checkpoint's temp file shows.
  const std::string every = scratch("zero_killed_every");
  int mid_write = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const pid_t sid = start_session(mpirun(4) + trainer() + gpt(every, 100000, 1) + state +
                                        " checkpoint.keep=2 checkpoint.resume=latest",
                                    every + "/attempt" + std::to_string(attempt) + ".log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int seen = 0;             // temp files seen: kill at the (attempt + 1)-th
    std::vector<pid_t> pids;  // the job's processes, listed once every rank runs (ps is slow)
    while (std::chrono::steady_clock::now() < deadline) {
      bool temp = false, complete = false;
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(every + "/ckpt", ec)) {
        const bool t = entry.path().filename().string().find(".tmp.") != std::string::npos;
        temp |= t;
        complete |= !t;
      }
      if (complete && pids.empty()) pids = session_pids(sid);
      if (temp && !pids.empty() && ++seen > attempt) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (pid_t p : session_pids(sid)) ::kill(p, SIGKILL);  // the deadline passed: stop it
    int status = 0;
    waitpid(sid, &status, 0);
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(every + "/ckpt", ec))
      mid_write += entry.path().filename().string().find(".tmp.") != std::string::npos;
  }
  // Where a kill lands is up to the machine's timing (3 of 3 mid-write at load 11, 0 of 3 once
  // at load 9), so this part asserts what holds wherever it lands; the SIGXFSZ part above is the
  // death mid-write that is certain.
  std::printf("SIGKILL: %d of 3 kills left a temp file (killed mid-write)\n", mid_write);
  const int64_t newest = newest_loadable(every + "/ckpt");
  ASSERT_GT(newest, 0);
  e = run(mpirun(4) + trainer() + gpt(every, static_cast<int>(newest) + 1, 1) + state +
          " checkpoint.resume=latest");
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
}

// `trainer plan --ranks N --json`: the device bytes of one rank, the host bytes beside them.
// Note [Sharded master weights]: under bf16, zero 1/2 keep the fp32 masters by shard and the host
// optimizer keeps them on the host. At 2 and 4 ranks every state gives zero 0's losses (bitwise
// at 2 ranks, parameters too; at 4 within 1e-4: the reduce-scatter's order, printed), rank 0's
// weights and working-copy bytes are `trainer plan --json`'s, the measured peak is the planned one,
// and the all-gather moves half of fp32's bytes plus the fp32 weights read whole (embeddings,
// norms, biases).
TEST_F(Zero, Bf16MastersShardedAtTwoAndFourRanksEqualZeroZero) {
  if (!cpu::bf16_gap_here().empty()) GTEST_SKIP() << cpu::bf16_gap_here();
  const std::string model =
      " optim.clip_norm=1.0 model.context=32 model.layers=2 model.width=64 memory.measure=false "
      "comm.bucket_mb=0.02 data.val_path= data.path=" +
      tokens_file();
  for (int ranks : {2, 4}) {
    const std::string batch = " data.batch_size=" + std::to_string(16 / ranks);
    const auto plan = [&](const std::string& state) {
      const Exit e =
          run(trainer() + " plan " + std::string(FERRY_SOURCE_DIR) +
              "/configs/gpt_text.yaml --json --ranks " + std::to_string(ranks) + " " + state +
              " device.precision=bf16 run.dir=" + scratch("zero_bf16_plan") + model + batch);
      EXPECT_EQ(e.code, 0) << e.output;
      return nlohmann::json::parse(e.output.substr(e.output.find('{')))["policies"][0];
    };
    const std::string base = scratch("zero_bf16_0_" + std::to_string(ranks));
    Exit e = run(mpirun(ranks) + trainer() + gpt(base, 12, 12) + batch + " device.precision=bf16");
    ASSERT_EQ(e.code, 0) << e.output;
    const auto want = all_tensors(base + "/ckpt/step_12.safetensors");
    const uint64_t base_weights = summary(base)["weights_bytes"];
    for (const char* state : kStates) {
      const std::string dir = scratch("zero_bf16_" + std::to_string(ranks) + "_" +
                                      std::to_string(std::hash<std::string>{}(state) % 1000));
      e = run(mpirun(ranks) + trainer() + gpt(dir, 12, 12) + batch + " device.precision=bf16 " +
              state);
      ASSERT_EQ(e.code, 0) << state << "\n" << e.output;
      const double gap = loss_gap(dir, base);
      const nlohmann::json s = summary(dir), p = plan(state);
      std::printf(
          "gpt bf16, %d ranks, %s: loss difference to zero 0 %.3g; weights %llu bytes (zero 0 "
          "%llu), working copy %llu\n",
          ranks, state, gap, static_cast<unsigned long long>(s["weights_bytes"].get<uint64_t>()),
          static_cast<unsigned long long>(base_weights),
          static_cast<unsigned long long>(s["working_weights_bytes"].get<uint64_t>()));
      if (ranks == 2) {
        EXPECT_EQ(gap, 0.0) << state;
        const auto got = all_tensors(dir + "/ckpt/step_12.safetensors");
        ASSERT_EQ(got.size(), want.size()) << state;
        for (const auto& [name, v] : want) {
          ASSERT_EQ(got.at(name).size(), v.size()) << name;
          EXPECT_EQ(std::memcmp(got.at(name).data(), v.data(), v.size() * sizeof(float)), 0)
              << state << ": " << name;
        }
      } else {
        // 4 ranks: MPI's reduce-scatter sums the four gradients in another order than its
        // all-reduce (fp32 zero 1 against zero 0 differs in the optimizer state's last bits
        // too); a last-bit change of a master can flip its bf16 rounding, 2^-8 of the weight.
        // 1.6e-5 measured over 12 steps; the host optimizer alone (no sharding) stays bitwise.
        EXPECT_LE(gap, std::string(state) == "memory.optimizer=host" ? 0.0 : 1e-4) << state;
      }
      EXPECT_EQ(s["weights_bytes"], p["weights_bytes"]) << state;
      EXPECT_EQ(s["working_weights_bytes"], p["working_weights_bytes"]) << state;
      EXPECT_EQ(s["device_peak_bytes"], s["planned_peak_bytes"]) << state;
      EXPECT_LT(s["weights_bytes"].get<uint64_t>(), base_weights) << state;
    }
  }
  // The CNN (convolutions read the working copy; batch norm's gains and the head's bias the fp32
  // weights) at 2 ranks: bitwise zero 0's losses and parameters.
  {
    const std::string base = scratch("zero_bf16_cnn_0");
    Exit e = run(mpirun(2) + trainer() + cnn(base, 8) + " data.batch_size=8 device.precision=bf16");
    ASSERT_EQ(e.code, 0) << e.output;
    const auto want = all_tensors(base + "/ckpt/step_8.safetensors");
    for (const char* state : {"memory.zero=2", "memory.zero=1 memory.optimizer=host"}) {
      const std::string dir = scratch(std::string("zero_bf16_cnn_") +
                                      std::to_string(std::hash<std::string>{}(state) % 1000));
      e = run(mpirun(2) + trainer() + cnn(dir, 8) + " data.batch_size=8 device.precision=bf16 " +
              state);
      ASSERT_EQ(e.code, 0) << state << "\n" << e.output;
      EXPECT_EQ(loss_gap(dir, base), 0.0) << state;
      const auto got = all_tensors(dir + "/ckpt/step_8.safetensors");
      ASSERT_EQ(got.size(), want.size()) << state;
      for (const auto& [name, v] : want) {
        EXPECT_EQ(std::memcmp(got.at(name).data(), v.data(), v.size() * sizeof(float)), 0)
            << state << ": " << name;
      }
      const nlohmann::json sm = summary(dir);
      EXPECT_EQ(sm["device_peak_bytes"], sm["planned_peak_bytes"]) << state;
    }
  }
  // The gather's bytes: bf16 moves the working copy (half the fp32 block) and the fp32 weights.
  const std::string fp32 = scratch("zero_bf16_gather_fp32"), bf16 = scratch("zero_bf16_gather");
  Exit e = run(mpirun(2) + trainer() + gpt(fp32, 2, 2) + " data.batch_size=8 memory.zero=1");
  ASSERT_EQ(e.code, 0) << e.output;
  e = run(mpirun(2) + trainer() + gpt(bf16, 2, 2) +
          " data.batch_size=8 memory.zero=1 device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;
  const uint64_t g32 = summary(fp32)["gathered_bytes"], g16 = summary(bf16)["gathered_bytes"];
  // The fp32 gather moves every rank's shard (2 x S x 4 bytes); rank 0's weights are S x 4 of
  // masters and the compact block of fp32 weights (F, in whole 256-byte granules).
  const uint64_t f = summary(bf16)["weights_bytes"].get<uint64_t>() - g32 / 2;
  std::printf(
      "all-gather per update: fp32 %llu bytes, bf16 %llu (= %llu / 2 + fp32 weights %llu)\n",
      static_cast<unsigned long long>(g32), static_cast<unsigned long long>(g16),
      static_cast<unsigned long long>(g32), static_cast<unsigned long long>(g16 - g32 / 2));
  EXPECT_GT(g32, 0u);
  EXPECT_LE(g16 - g32 / 2, f);
  EXPECT_GT(g16 - g32 / 2 + 256, f);
}

// Note [Sharded master weights]: a bf16 zero 2 checkpoint holds the whole fp32 masters (every
// rank's shard gathered) under today's names. On 4 ranks it resumes bitwise; on 2 ranks with zero
// 0 and on 1 rank in fp32 with the host optimizer it continues the same run.
TEST_F(Zero, Bf16ShardedCheckpointResumesAcrossRanksStagesAndPrecisions) {
  if (!cpu::bf16_gap_here().empty()) GTEST_SKIP() << cpu::bf16_gap_here();
  const std::string whole = scratch("zero_bf16_resume_whole");
  Exit e = run(mpirun(4) + trainer() + gpt(whole, 20, 10) +
               " data.batch_size=4 memory.zero=2 device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string ckpt = whole + "/ckpt/step_10.safetensors";
  {
    const auto t = all_tensors(ckpt);
    EXPECT_TRUE(t.count("transformer.wte.weight"));
    EXPECT_TRUE(t.count("transformer.h.0.attn.c_attn.weight"));
    EXPECT_TRUE(t.count("optimizer.exp_avg.transformer.h.1.mlp.c_fc.weight"));
  }
  {
    const std::string dir = scratch("zero_bf16_resume_same");
    e = run(mpirun(4) + trainer() + gpt(dir, 20, 10) +
            " data.batch_size=4 memory.zero=2 device.precision=bf16 checkpoint.resume=" + ckpt);
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_EQ(loss_gap(dir, whole, 11), 0.0);
    expect_same_parameters(dir + "/ckpt/step_20.safetensors", whole + "/ckpt/step_20.safetensors",
                           0);
  }
  // 2 ranks, zero 0, bf16: the same run summed in another order (parameters at step 20 within
  // 5e-4 as the fp32 test above allows; 1e-7 measured).
  {
    const std::string dir = scratch("zero_bf16_resume_two_ranks_zero0");
    e = run(mpirun(2) + trainer() + gpt(dir, 20, 10) +
            " data.batch_size=8 device.precision=bf16 checkpoint.resume=" + ckpt);
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
    EXPECT_EQ(losses(dir).begin()->first, 11);
    const double d = max_relative_difference(dir + "/ckpt/step_20.safetensors",
                                             whole + "/ckpt/step_20.safetensors");
    std::printf(
        "bf16 zero 2 on 4 ranks resumed on 2 ranks with zero 0: parameters at step 20 "
        "differ by %.3g (relative)\n",
        d);
    EXPECT_LE(d, 5e-4);
  }
  // 1 rank, fp32, host optimizer: the masters are the weights. Its step 11 is the uninterrupted
  // run's global batch from the same weights, in fp32 instead of bf16: the losses agree within
  // bf16's rounding of the forward and the logs' 4 decimals (1e-3 absolute; 1e-4 measured).
  {
    const std::string dir = scratch("zero_bf16_resume_one_rank_fp32_host");
    e = run(trainer() + gpt(dir, 20, 10) +
            " data.batch_size=16 memory.optimizer=host checkpoint.resume=" + ckpt);
    ASSERT_EQ(e.code, 0) << e.output;
    EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
    const auto got = losses(dir);
    ASSERT_EQ(got.begin()->first, 11);
    const auto want = global_losses(whole, 4);
    ASSERT_TRUE(want.count(11));
    const double first = std::fabs(got.begin()->second - want.at(11));
    std::printf(
        "bf16 zero 2 on 4 ranks resumed on 1 rank in fp32: step 11 loss %.4f against %.4f "
        "(step 1 of the run: %.4f)\n",
        got.begin()->second, want.at(11), want.begin()->second);
    EXPECT_LE(first, 1e-3);
  }
}

TEST(ZeroPlan, RanksAndJsonFields) {
  const std::string dir = scratch("zero_plan");
  const auto plan = [&](const std::string& args) {
    const Exit e =
        run(trainer() + " plan " + std::string(FERRY_SOURCE_DIR) +
            "/configs/gpt_text.yaml --json memory.measure=false run.dir=" + dir + " " + args);
    EXPECT_EQ(e.code, 0) << e.output;
    return nlohmann::json::parse(e.output.substr(e.output.find('{')));
  };
  const nlohmann::json zero0 = plan("--ranks 4");
  const nlohmann::json host = plan("--ranks 4 memory.zero=1 memory.optimizer=host");
  const auto& p0 = zero0["policies"][0];
  const auto& ph = host["policies"][0];
  const uint64_t weights = p0["weights_bytes"];
  EXPECT_EQ(p0["optimizer_bytes"].get<uint64_t>(), 2 * weights);  // AdamW, unsharded
  EXPECT_EQ(ph["optimizer_bytes"].get<uint64_t>(), 0u);           // on the host
  const uint64_t shard = host["model_state"]["shard_floats"].get<uint64_t>() * 4;
  EXPECT_EQ(ph["weights_bytes"].get<uint64_t>(), 4 * shard);
  EXPECT_EQ(ph["host_optimizer_bytes"].get<uint64_t>(), 2 * shard);
  EXPECT_EQ(ph["host_weights_bytes"].get<uint64_t>(), shard);
  EXPECT_EQ(host["model_state"]["chosen"], "zero 1 + host optimizer");
  EXPECT_EQ(host["model_state"]["options"].size(), 6u);
  EXPECT_EQ(plan("--ranks 4 memory.zero=auto memory.optimizer=auto")["model_state"]["chosen"],
            "zero 0 + device optimizer");  // everything fits: no sharding, no offload
  const nlohmann::json one = plan("memory.zero=2");
  EXPECT_NE(one["model_state"]["note"].get<std::string>().find("changes nothing"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry::testing
