// The experiment config: typed section structs, load with key=value overrides, resolved YAML/JSON.
// Invariant: a loaded Config is validated and resolved (no derived default unset); to_yaml reloads.
// Value syntax and Note [Config error messages]: docs/config.md (scripts/gen_config_doc.py).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "trainer/config/enums.h"

namespace ferry {

// Steps are numbered from 1. Integers are int64_t, sizes uint64_t bytes, reals double.
// The member initialisers are the defaults; a derived default ("" or 0 below) is filled in at
// load time, so a loaded Config never holds it.

struct RunConfig {
  std::string dir;                           // "" -> "runs/<config file stem>" ("runs/default")
  int64_t steps = 100;                       // >= 1
  uint64_t seed = 0;                         //
  int64_t log_every = 10;                    // >= 1
  bool trace = false;                        // Chrome trace of the steps in trace_steps
  std::array<int64_t, 2> trace_steps{2, 3};  // [first, last], 1 <= first <= last
  bool overwrite = false;  // a fresh run may replace another run's checkpoints in dir
  bool operator==(const RunConfig&) const = default;
};

struct ModelConfig {
  std::string name = "resnet18_cifar";      // checked against the zoo by the trainer
  int64_t classes = 10;                     // >= 1
  std::array<int64_t, 3> input{3, 32, 32};  // [C, H, W], each >= 1
  std::string init_from;                    // safetensors weights to start from, "" = fresh init
  bool init_ignore_unused = false;          // init_from: skip file tensors no parameter reads
  // Token models (gpt2, gpt2-medium): sizes, 0 = the named model's.
  int64_t layers = 0;    // >= 0
  int64_t heads = 0;     // >= 0, divides width
  int64_t width = 0;     // >= 0
  int64_t vocab = 0;     // >= 0
  int64_t context = 0;   // >= 0
  double dropout = 0.0;  // [0, 1)
  AttentionKind attention = AttentionKind::kFused;
  // Llama models: 0 / auto = the named model's.
  int64_t kv_heads = 0;     // >= 0, divides heads
  int64_t ffn = 0;          // >= 0
  double rope_theta = 0.0;  // >= 0
  double norm_eps = 0.0;    // >= 0
  TieEmbeddings tie_embeddings = TieEmbeddings::kAuto;
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  DataSource source = DataSource::kSynthetic;
  std::string path;         // required for idx (images file), cifar10 (file or folder),
                            // imagefolder (folder) and tokens (token file)
  std::string labels;       // idx labels file; "" = derived from path by the loader
  int64_t batch_size = 32;  // >= 1, per rank
  bool shuffle = true;
  std::vector<double> mean;  // per channel (size model.input[0]) or empty = none
  std::vector<double> std;   // per channel, each > 0, or empty = none
  int64_t samples = 4096;    // synthetic dataset size, >= 1
  int64_t seed = -1;         // synthetic: which samples, >= -1, -1 = run.seed
  bool drop_last = true;     // drop a final partial batch
  std::string val_path;      // imagefolder, tokens: what `trainer eval` reads; "" = path
  int64_t workers = 2;       // >= 1, loader threads decoding and transforming samples
  int64_t crop = 0;          // imagefolder: crop side, >= 0; 0 = model.input's H and W
  int64_t resize = 256;      // imagefolder eval: short side before the center crop, >= 1
  bool skip_bad = false;     // imagefolder: skip unreadable images with a warning
  int64_t seq_len = 0;       // tokens: window length T, >= 0; 0 = model.context (check_seq_len)
  // synthetic, imagefolder training: image sides drawn per global batch, each in [1, 16384];
  // empty = off (Note [Per-batch sides] in trainer/data/loader.h).
  std::vector<int64_t> scales;
  // tokens: one document per row, split at data.eot_token, padded per batch to the longest
  // rounded up to len_bucket (>= 1), or packed (Note [Documents as rows] in
  // trainer/data/documents.h); eot_token -1 = model.vocab - 1.
  bool documents = false;
  bool pack = false;
  int64_t len_bucket = 64;
  int64_t eot_token = -1;
  bool operator==(const DataConfig&) const = default;
};

struct OptimConfig {
  OptimizerKind name = OptimizerKind::kSgd;
  double lr = 0.1;            // > 0
  double momentum = 0.9;      // [0, 1), sgd
  bool nesterov = false;      // sgd; needs momentum > 0
  double weight_decay = 0.0;  // >= 0 (decoupled for adamw)
  // Which parameters weight_decay applies to; auto: the model's choice (ModelInfo).
  WeightDecayGroups decay = WeightDecayGroups::kAuto;
  double clip_norm = 0.0;  // >= 0, 0 = off: clip the gradients' global L2 norm to this
  ScheduleKind schedule = ScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // >= 0, linear warm-up from 0 to lr
  int64_t step_size = 30;    // >= 1, step schedule: lr *= gamma every step_size steps
  double gamma = 0.1;        // (0, 1]
  double min_lr = 0.0;       // >= 0, cosine floor, <= lr
  double beta1 = 0.9;        // [0, 1), adamw
  double beta2 = 0.999;      // [0, 1), adamw
  double eps = 1e-8;         // > 0, adamw
  // >= 1: micro-batches of data.batch_size per rank per update (gradient accumulation)
  int64_t accumulate = 1;
  bool operator==(const OptimConfig&) const = default;
};

struct DeviceConfig {
  Backend backend = Backend::kCpu;
  uint64_t memory = uint64_t{4} << 30;  // bytes, >= 1: the device-memory capacity
  int64_t threads = 0;                  // >= 0, 0 = every core
  double copy_gbps = 0.0;               // >= 0, cpu emulated link bandwidth, 0 = unlimited
  bool tf32 = true;                     // cuda: convolutions may use TF32 (PyTorch's default)
  bool tf32_matmul = false;             // cuda: linear layers may use TF32 (PyTorch's default)
  bool deterministic = false;           // cuda: only bitwise-repeatable cuDNN algorithms
  AlgorithmSearch algorithms = AlgorithmSearch::kTimed;  // cuda: timed (cudnnFind) | heuristic
  Precision precision = Precision::kFp32;                // fp32 | bf16 (mixed: fp32 master weights)
  bool operator==(const DeviceConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir;     // "" -> "<run.dir>/checkpoints"
  int64_t every = 0;   // >= 0, 0 = never
  int64_t keep = 3;    // >= 0, 0 = keep all
  std::string resume;  // "" = fresh start, "latest" = newest in dir, or a file path
  bool operator==(const CheckpointConfig&) const = default;
};

// How the planner fits the step into memory (Note [Life of an offloaded activation] in
// trainer/exec/executor.h, step 1).
struct MemoryConfig {
  MemoryPolicy policy = MemoryPolicy::kNone;
  uint64_t budget = 0;    // bytes; 0 -> device.memory; <= device.memory
  bool recompute = true;  // auto may recompute activations (never slower)
  // auto: a plan per input shape (true), or the largest shape's decisions for every shape
  // (false: Mimose's static baseline, Note [One plan for every shape] in prefetch/plan.h).
  bool per_shape = true;
  // A batch whose input shape cannot be planned within the budget: error | skip.
  OversizeAction oversize = OversizeAction::kError;
  uint64_t host_limit = uint64_t{8} << 30;  // pinned host pool cap, bytes
  // Model state per rank (Note [Model state per rank] in trainer/plan/model_state.h).
  ZeroStage zero = ZeroStage::k0;
  OptimizerPlacement optimizer = OptimizerPlacement::kDevice;
  double link_gbps = 0.0;     // >= 0, planner's assumed link GB/s, 0 = device's
  bool debug_poison = false;  // fill non-resident device space with NaN
  uint64_t workspace_limit = uint64_t{256} << 20;  // cuda: scratch bytes one kernel may use
  bool measure = true;  // time the model's kernels and the link at start; false = FLOP model
  // Share the device with the node's other ferry jobs: the budget is assigned (at most
  // memory.budget) by the node's job ledger (jobs/job_ledger.h).
  bool share = false;
  ShareObjective share_objective = ShareObjective::kThroughput;
  double share_wait = 600;  // [0, 1e6] seconds a job waits to be admitted; 0 = not at all
  // [0, 100]: a running job whose measured step time differs from its curve's prediction by more
  // than this share re-registers its curve scaled by measured / predicted; 0 = never.
  double share_drift = 0.3;
  bool operator==(const MemoryConfig&) const = default;
};

struct CommConfig {
  CommBackend backend = CommBackend::kAuto;  // auto: nccl on cuda, mpi on cpu
  double bucket_mb = 25.0;                   // > 0, gradient bucket size in MiB
  bool overlap = true;                       // reduce buckets while backward runs
  double timeout_s = 300;                    // 0 or [1, 86400]; 0 = no watchdog on collectives
  Precision dtype = Precision::kFp32;        // all-reduce format; bf16 needs device.precision bf16
  bool operator==(const CommConfig&) const = default;
};

struct TopologyConfig {
  std::string file;  // "" = the live machine; .xml (hwloc) or .yaml (synthetic)
  LinkSchedulerKind scheduler = LinkSchedulerKind::kFifo;
  bool bind = true;                 // bind threads and pinned memory to the GPU's NUMA node
  double unknown_link_gbps = 16.0;  // > 0, bandwidth assumed for a link of unknown speed
  double duplex_factor = 1.0;       // (0, 1], per-direction capacity when both are busy
  double emulation_scale = 1.0;     // > 0, cpu emulation: multiplier on link time
  double chunk_mb = 4.0;            // (0, 1024], topology scheduler: chunk size in MiB
  bool operator==(const TopologyConfig&) const = default;
};

struct DebugConfig {
  int64_t fail_at_step = -1;   // >= -1, -1 = never: throw at the start of this step
  int64_t fail_rank = -1;      // >= -1, -1 = every rank fails at fail_at_step (or stalls)
  int64_t stall_at_step = -1;  // >= -1, -1 = never: the rank stops itself (SIGSTOP) at this step
  bool operator==(const DebugConfig&) const = default;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  DeviceConfig device;
  CheckpointConfig checkpoint;
  MemoryConfig memory;
  CommConfig comm;
  TopologyConfig topology;
  DebugConfig debug;
  bool operator==(const Config&) const = default;
};

// Reads the YAML file at `path`, applies `overrides` ("key=value", in order, later wins),
// validates and resolves derived defaults. run.dir defaults to "runs/<stem of path>".
// Throws ConfigError (Note [Config error messages] in docs/config.md).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// As load_config, from YAML text. `source_name` names the text in messages ("FILE:LINE") and
// gives run.dir's default stem when it is a file name (".yaml"/".yml"); else "runs/default".
Config parse_config_text(const std::string& yaml_text,
                         const std::vector<std::string>& overrides = {},
                         const std::string& source_name = "<config>");

// Every key at its default, resolved (run.dir "runs/default").
Config default_config();

// The resolved config with every key, grouped by section in reference order. Sizes print as
// "4GiB" when a whole number of a binary unit, else as a byte count. Loads back equal.
std::string to_yaml(const Config& config);

// The same as nested JSON: sizes are integers (bytes), choices are strings.
nlohmann::json to_json(const Config& config);

// data.seq_len resolved against the model's context length (Note [Token windows] in
// trainer/data/dataset.h): 0 -> `context`; a value in [1, context] is kept. ConfigError
// "data.seq_len: must be <= model.context (C), got S" (with `where`, e.g. " (FILE:LINE)",
// appended) naming both keys when seq_len > context. Called where model.context is known.
int64_t check_seq_len(int64_t seq_len, int64_t context, const std::string& where = "");

// One row of the config reference.
struct KeyInfo {
  std::string key;            // "optim.lr"
  std::string type;           // bool, int, uint, float, string, size, choice, list...
  std::string default_value;  // as written in YAML ("0.1", "4GiB", "[3, 32, 32]", "\"\"")
  std::string allowed;        // "> 0", "in [0, 1)", "sgd | adamw", "" = any
  std::string help;           // one line
};

// Every key, in schema order (sections in Config order).
std::vector<KeyInfo> config_reference();

// The reference as a markdown table: | Key | Type | Default | Allowed | Description |, one
// row per key, each key in backticks. The README embeds it.
std::string config_reference_markdown();

}  // namespace ferry
