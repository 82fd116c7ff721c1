// Checkpoints: 10 steps straight equal 5 steps, stop, resume, 5 steps (bitwise on one rank,
// within 1e-6 on two); a checkpoint interrupted mid-write (the writer killed) leaves the
// previous one loadable and resumable.
#include <csignal>
#include <cstring>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/trainer/integration/run_util.h"
#include "trainer/checkpoint/safetensors.h"

namespace ferry::testing {
namespace {

std::string args(const std::string& dir, int steps, const std::string& resume) {
  return " train " + std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml run.dir=" + dir +
         " run.steps=" + std::to_string(steps) +
         " data.samples=160 data.batch_size=16 checkpoint.every=5 checkpoint.keep=0 "
         "checkpoint.dir=" +
         dir + "/ckpt" + (resume.empty() ? "" : " checkpoint.resume=" + resume);
}

TEST(Resume, FivePlusFiveStepsEqualTenStepsBitwise) {
  const std::string straight = scratch("resume_straight");
  Exit e = run(trainer() + args(straight, 10, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string split = scratch("resume_split");
  e = run(trainer() + args(split, 5, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  e = run(trainer() + args(split, 10, "latest"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
  // 160 samples at 16 a batch: step 10 crosses into the second epoch, so the resumed run must
  // also continue the data order exactly.
  expect_same_parameters(split + "/ckpt/step_10.safetensors",
                         straight + "/ckpt/step_10.safetensors", 0.0);
}

// device.precision bf16: 5 + 5 steps equal 10 bitwise (the bf16 working copy is made from the
// resumed master weights exactly as from the running ones).
TEST(Resume, Bf16FivePlusFiveStepsEqualTenStepsBitwise) {
  const std::string straight = scratch("resume_bf16_straight");
  Exit e = run(trainer() + args(straight, 10, "") + " device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string split = scratch("resume_bf16_split");
  e = run(trainer() + args(split, 5, "") + " device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;
  e = run(trainer() + args(split, 10, "latest") + " device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
  expect_same_parameters(split + "/ckpt/step_10.safetensors",
                         straight + "/ckpt/step_10.safetensors", 0.0);
}

// A bf16 run's checkpoint holds the fp32 master weights (not their bf16 copy) under the names an
// fp32 run writes, with the fp32 optimizer state; an fp32 checkpoint resumes in bf16 and a bf16
// one in fp32, each ending near the run that kept its precision.
TEST(Resume, Bf16CheckpointsHoldFp32MasterWeightsAndResumeEitherWay) {
  const std::string fp32 = scratch("resume_mixed_fp32");
  Exit e = run(trainer() + args(fp32, 10, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string bf16 = scratch("resume_mixed_bf16");
  e = run(trainer() + args(bf16, 10, "") + " device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;

  const SafetensorsFile f = read_safetensors(fp32 + "/ckpt/step_5.safetensors");
  const SafetensorsFile b = read_safetensors(bf16 + "/ckpt/step_5.safetensors");
  ASSERT_EQ(f.entries().size(), b.entries().size());
  size_t low_bits = 0, floats = 0;
  for (size_t i = 0; i < f.entries().size(); ++i) {
    const SafetensorsEntry& fe = f.entries()[i];
    const SafetensorsEntry& be = b.entries()[i];
    EXPECT_EQ(be.name, fe.name);
    EXPECT_EQ(be.dtype, fe.dtype) << be.name;
    EXPECT_EQ(be.shape, fe.shape) << be.name;
    EXPECT_EQ(be.stored_dtype, fe.stored_dtype) << be.name;
    if (be.dtype != DType::kF32 || be.name.rfind("optimizer.", 0) == 0) continue;
    for (size_t k = 0; k + 4 <= be.bytes.size(); k += 4) {
      uint32_t u;
      std::memcpy(&u, be.bytes.data() + k, 4);
      low_bits += (u & 0xFFFFu) != 0;
      ++floats;
    }
  }
  // Weights rounded to bf16 would have all 16 low bits zero.
  EXPECT_GT(low_bits, floats / 2) << "the checkpoint holds bf16-rounded weights";
  // bf16 trained other bits than fp32, close to them.
  const auto pf = parameters(fp32 + "/ckpt/step_5.safetensors");
  const auto pb = parameters(bf16 + "/ckpt/step_5.safetensors");
  bool differs = false;
  for (const auto& [name, v] : pf) differs = differs || v != pb.at(name);
  EXPECT_TRUE(differs) << "the bf16 run trained exactly as fp32";
  expect_same_parameters(bf16 + "/ckpt/step_5.safetensors", fp32 + "/ckpt/step_5.safetensors",
                         0.05);

  // fp32 -> bf16 and bf16 -> fp32 from step 5 to 10.
  const std::string to_bf16 = scratch("resume_to_bf16");
  e = run(trainer() + args(to_bf16, 10, fp32 + "/ckpt/step_5.safetensors") +
          " device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
  const std::string to_fp32 = scratch("resume_to_fp32");
  e = run(trainer() + args(to_fp32, 10, bf16 + "/ckpt/step_5.safetensors"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
  expect_same_parameters(to_bf16 + "/ckpt/step_10.safetensors", fp32 + "/ckpt/step_10.safetensors",
                         0.05);
  expect_same_parameters(to_fp32 + "/ckpt/step_10.safetensors", bf16 + "/ckpt/step_10.safetensors",
                         0.05);
}

TEST(Resume, TwoRanksResumeWithin1e6) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const std::string straight = scratch("resume2_straight");
  Exit e = run(mpirun(2) + trainer() + args(straight, 10, "") + " data.batch_size=8");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string split = scratch("resume2_split");
  e = run(mpirun(2) + trainer() + args(split, 5, "") + " data.batch_size=8");
  ASSERT_EQ(e.code, 0) << e.output;
  e = run(mpirun(2) + trainer() + args(split, 10, "latest") + " data.batch_size=8");
  ASSERT_EQ(e.code, 0) << e.output;
  expect_same_parameters(split + "/ckpt/step_10.safetensors",
                         straight + "/ckpt/step_10.safetensors", 1e-6);
}

TEST(Resume, AKilledWriterLeavesThePreviousCheckpointLoadable) {
  const std::string dir = scratch("resume_killed");
  // Checkpoint every step; kill the trainer at staggered moments, many of them mid-write.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::string command = trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
                                "/configs/quickstart.yaml run.dir=" + dir +
                                " run.steps=100000 data.batch_size=4 checkpoint.every=1 "
                                "memory.measure=false "  // checkpoints from the first second
                                "checkpoint.keep=2 checkpoint.resume=latest checkpoint.dir=" +
                                dir + "/ckpt > /dev/null 2>&1 & echo $!";
    const Exit started = run(command);
    const int pid = std::stoi(started.output);
    std::this_thread::sleep_for(std::chrono::milliseconds(700 + 137 * attempt));
    ::kill(pid, SIGKILL);
    run("while kill -0 " + std::to_string(pid) + " 2>/dev/null; do sleep 0.05; done");
  }
  // Every complete-named checkpoint loads; half-written files only ever have temp names.
  int complete = 0;
  int64_t newest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt")) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) continue;
    EXPECT_NO_THROW(parameters(entry.path().string())) << name;
    newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
    ++complete;
  }
  ASSERT_GT(complete, 0);
  // And training resumes from the newest, for one more step.
  const Exit e =
      run(trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
          "/configs/quickstart.yaml run.dir=" + dir + " run.steps=" + std::to_string(newest + 1) +
          " data.batch_size=4 checkpoint.resume=latest checkpoint.dir=" + dir + "/ckpt");
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos);
}

// Keys that change no parameter's shape (model.heads, data.seq_len) are checked on resume
// (Note [What resume checks] in trainer/checkpoint/model_checkpoint.cc); a checkpoint written
// before they were recorded still resumes, saying what it could not check.
TEST(Resume, AChangedModelOrDataShapeIsRefused) {
  const std::string dir = scratch("resume_shape");
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 2048;
  std::vector<uint16_t> body(2048);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint16_t>((i * 7) % 200);
  {
    std::ofstream out(dir + "/train.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 256 * sizeof(int32_t));
    out.write(reinterpret_cast<const char*>(body.data()),
              static_cast<std::streamsize>(body.size() * sizeof(uint16_t)));
  }
  const auto train = [&](const std::string& name, int steps, const std::string& extra) {
    return run(trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
               "/configs/gpt_text.yaml model.layers=1 model.width=32 model.heads=4 "
               "model.context=32 data.seq_len=16 data.batch_size=2 data.path=" +
               dir +
               "/train.bin data.val_path= memory.measure=false device.threads=1 "
               "optim.warmup_steps=0 checkpoint.every=2 run.dir=" +
               dir + "/" + name + " run.steps=" + std::to_string(steps) + " " + extra);
  };
  Exit e = train("first", 2, "");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string ckpt = dir + "/first/checkpoints/step_2.safetensors";
  const std::string resume = " checkpoint.resume=" + ckpt;
  expect_user_error(
      train("heads", 3, "model.heads=2" + resume),
      "checkpoint.resume: model.heads is 2 but '" + ckpt + "' was written with model.heads=4");
  expect_user_error(train("seq_len", 3, "data.seq_len=8" + resume),
                    "data.seq_len is 8 but '" + ckpt + "' was written with data.seq_len=16");
  e = train("same", 3, resume);
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_EQ(e.output.find("not checked"), std::string::npos) << e.output;

  // The same checkpoint as an older ferry wrote it: the format, the position and model.name only.
  SafetensorsFile file = read_safetensors(ckpt);
  std::vector<SafetensorsTensor> tensors;
  for (const SafetensorsEntry& t : file.entries())
    tensors.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  SafetensorsMetadata old;
  for (const char* key : {"format", "model", "step", "epoch", "batch_in_epoch", "seed"})
    old[key] = file.metadata().at(key);
  const std::string older = dir + "/older.safetensors";
  write_safetensors(older, tensors, old);
  e = train("older", 3, "data.seq_len=8 checkpoint.resume=" + older);
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("records no data.seq_len, model.context, model.heads, model.layers, "
                          "model.vocab, model.width (an older checkpoint): not checked"),
            std::string::npos)
      << e.output;
  expect_user_error(train("older_name", 3, "model.name=gpt2-medium checkpoint.resume=" + older),
                    "model.name is gpt2-medium but");
}

}  // namespace
}  // namespace ferry::testing
