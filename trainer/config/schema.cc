// The config key table: one entry per key (name, type, range, help, bound field). To add a
// key, add a field with its default to the struct in config.h and one entry here.
// Invariant: FERRY_CONFIG_KEY(section, field) makes the key name equal the field's path.
#include "trainer/config/schema.h"

#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/strings.h"
#include "trainer/config/values.h"

namespace ferry::config_internal {

namespace {

// A field of a Config: (config.*section).*member.
template <class S, class T>
struct Field {
  S Config::*section;
  T S::*member;
  T& operator()(Config& c) const { return c.*section.*member; }
  const T& operator()(const Config& c) const { return c.*section.*member; }
};

template <class S, class T>
Field<S, T> field(S Config::*section, T S::*member) {
  return {section, member};
}

KeySpec spec(std::string name, ValueType type, std::string type_doc, std::string allowed_doc,
             std::string help) {
  KeySpec k;
  k.name = std::move(name);
  k.type = type;
  k.type_doc = std::move(type_doc);
  k.allowed_doc = std::move(allowed_doc);
  k.help = std::move(help);
  return k;
}

template <class S>
KeySpec flag(std::string name, Field<S, bool> f, std::string help) {
  KeySpec k = spec(std::move(name), ValueType::kBool, "bool", "true | false", std::move(help));
  k.assign = [f](Config& c, const YAML::Node& n) { f(c) = read_bool(n); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

template <class S>
KeySpec integer(std::string name, Field<S, int64_t> f, Range range, std::string help) {
  KeySpec k = spec(std::move(name), ValueType::kInt, "int", range.text(), std::move(help));
  k.assign = [f, range](Config& c, const YAML::Node& n) { f(c) = read_int(n, range); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

template <class S>
KeySpec unsigned_integer(std::string name, Field<S, uint64_t> f, std::string help) {
  KeySpec k = spec(std::move(name), ValueType::kUint, "uint", ">= 0", std::move(help));
  k.assign = [f](Config& c, const YAML::Node& n) { f(c) = read_uint(n); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

template <class S>
KeySpec real(std::string name, Field<S, double> f, Range range, std::string help) {
  KeySpec k = spec(std::move(name), ValueType::kFloat, "float", range.text(), std::move(help));
  k.assign = [f, range](Config& c, const YAML::Node& n) { f(c) = read_real(n, range); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

// `default_doc` describes a derived default (the field holds "" until resolved).
template <class S>
KeySpec text(std::string name, Field<S, std::string> f, std::string help,
             std::string default_doc = "", bool nonempty = false) {
  KeySpec k = spec(std::move(name), ValueType::kString, "string", nonempty ? "non-empty" : "",
                   std::move(help));
  k.default_doc = std::move(default_doc);
  k.assign = [f, nonempty](Config& c, const YAML::Node& n) { f(c) = read_string(n, nonempty); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

// Sizes in bytes; `default_doc` describes a derived default (the field holds 0 until resolved).
// `allowed_doc` documents a cross-key bound checked by the loader ("<= device.memory").
template <class S>
KeySpec size(std::string name, Field<S, uint64_t> f, uint64_t min_bytes, std::string help,
             std::string default_doc = "", std::string allowed_doc = "") {
  if (allowed_doc.empty() && min_bytes > 0) allowed_doc = ">= " + size_text(min_bytes);
  KeySpec k =
      spec(std::move(name), ValueType::kSize, "size", std::move(allowed_doc), std::move(help));
  k.default_doc = std::move(default_doc);
  k.assign = [f, min_bytes](Config& c, const YAML::Node& n) { f(c) = read_size(n, min_bytes); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

template <class S, SpelledEnum E>
KeySpec choice(std::string name, Field<S, E> f, std::string help) {
  const std::vector<std::string> names = enum_spellings<E>();
  KeySpec k =
      spec(std::move(name), ValueType::kChoice, "choice", join(names, " | "), std::move(help));
  k.assign = [f, names](Config& c, const YAML::Node& n) {
    f(c) = *from_string<E>(read_choice(n, names));
  };
  k.read = [f](const Config& c) -> Value { return std::string(to_string(f(c))); };
  return k;
}

// A fixed-length list of integers; `shape` names the entries ("[C, H, W]").
template <class S, size_t N>
KeySpec int_tuple(std::string name, Field<S, std::array<int64_t, N>> f, Range range,
                  std::string shape, std::string help) {
  KeySpec k =
      spec(std::move(name), ValueType::kIntTuple, fmt::format("list[{}] of int", N),
           range.text().empty() ? shape : shape + ", each " + range.text(), std::move(help));
  k.assign = [f, range, shape](Config& c, const YAML::Node& n) {
    const std::vector<int64_t> values = read_int_tuple(n, N, range, shape);
    std::copy(values.begin(), values.end(), f(c).begin());
  };
  k.read = [f](const Config& c) -> Value { return std::vector<int64_t>(f(c).begin(), f(c).end()); };
  return k;
}

template <class S>
KeySpec real_list(std::string name, Field<S, std::vector<double>> f, Range range,
                  std::string help) {
  KeySpec k = spec(std::move(name), ValueType::kFloatList, "list of float",
                   range.text().empty() ? "" : "each " + range.text(), std::move(help));
  k.assign = [f, range](Config& c, const YAML::Node& n) { f(c) = read_real_list(n, range); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

template <class S>
KeySpec int_list(std::string name, Field<S, std::vector<int64_t>> f, Range range,
                 std::string help) {
  KeySpec k = spec(std::move(name), ValueType::kIntList, "list of int",
                   range.text().empty() ? "" : "each " + range.text(), std::move(help));
  k.assign = [f, range](Config& c, const YAML::Node& n) { f(c) = read_int_list(n, range); };
  k.read = [f](const Config& c) -> Value { return f(c); };
  return k;
}

// "run", steps -> "run.steps", bound to Config::run.steps.
#define FERRY_CONFIG_KEY(section, member) \
#section "." #member, field(&Config::section, &decltype(Config::section)::member)

std::vector<KeySpec> build_schema() {
  return {
      // run
      text(FERRY_CONFIG_KEY(run, dir), "Run directory: config.yaml, metrics.jsonl, logs, traces.",
           "runs/<config file stem>"),
      integer(FERRY_CONFIG_KEY(run, steps), at_least(1), "Training steps to run."),
      unsigned_integer(FERRY_CONFIG_KEY(run, seed),
                       "Seed for initialisation, data order, synthetic data and dropout."),
      integer(FERRY_CONFIG_KEY(run, log_every), at_least(1),
              "Log a progress line and a metrics.jsonl record every this many steps."),
      flag(FERRY_CONFIG_KEY(run, trace), "Write a Chrome-trace JSON per rank to the run dir."),
      int_tuple(FERRY_CONFIG_KEY(run, trace_steps), at_least(1), "[first, last]",
                "Steps (from 1, inclusive) that the trace covers; first <= last."),
      flag(FERRY_CONFIG_KEY(run, overwrite),
           "A fresh run (no checkpoint.resume) whose checkpoint.dir holds another run's "
           "checkpoints deletes them and starts over; false = such a run is refused."),
      // model
      text(FERRY_CONFIG_KEY(model, name),
           "Model zoo name, e.g. resnet18_cifar, vgg11_cifar, lenet5, resnet50.", "", true),
      integer(FERRY_CONFIG_KEY(model, classes), at_least(1), "Number of output classes."),
      int_tuple(FERRY_CONFIG_KEY(model, input), at_least(1), "[C, H, W]",
                "Input image shape: channels, height, width."),
      text(FERRY_CONFIG_KEY(model, init_from),
           "Safetensors file to load initial weights from, or a Hugging Face model folder "
           "(config.json + model.safetensors or its shards: LlamaForCausalLM or "
           "GPT2LMHeadModel), which also sets model.name and the sizes; \"\" = fresh "
           "initialisation."),
      flag(FERRY_CONFIG_KEY(model, init_ignore_unused),
           "model.init_from: load a file that holds tensors the model does not read (a larger "
           "model's), skipping them; false = such a file is refused, naming the first."),
      integer(FERRY_CONFIG_KEY(model, layers), at_least(0),
              "Transformer blocks (gpt2 models); 0 = the named model's."),
      integer(FERRY_CONFIG_KEY(model, heads), at_least(0),
              "Attention heads (gpt2 models; must divide model.width); 0 = the named model's."),
      integer(FERRY_CONFIG_KEY(model, width), at_least(0),
              "Embedding width (gpt2 models); 0 = the named model's."),
      integer(FERRY_CONFIG_KEY(model, vocab), at_least(0),
              "Vocabulary size (gpt2 models; tokens must be below it); 0 = the named model's."),
      integer(FERRY_CONFIG_KEY(model, context), at_least(0),
              "Positions (gpt2 models; the longest data.seq_len); 0 = the named model's."),
      real(FERRY_CONFIG_KEY(model, dropout), closed_open(0, 1),
           "gpt2 models: embedding, attention and residual dropout probability."),
      choice(FERRY_CONFIG_KEY(model, attention),
             "Token models: the attention core. fused = blockwise (online softmax), saving the "
             "output and one log-sum-exp per query and recomputing the probabilities in "
             "backward (O(T) saved per head); naive = the (T, T) probabilities saved per head."),
      integer(FERRY_CONFIG_KEY(model, kv_heads), at_least(0),
              "Llama models: key-value heads of grouped-query attention (must divide "
              "model.heads); 0 = the named model's, or model.heads when that is set."),
      integer(FERRY_CONFIG_KEY(model, ffn), at_least(0),
              "Llama models: the SwiGLU MLP's intermediate width; 0 = the named model's."),
      real(FERRY_CONFIG_KEY(model, rope_theta), at_least(0),
           "Llama models: the rotary embeddings' base; 0 = the named model's (10000)."),
      real(FERRY_CONFIG_KEY(model, norm_eps), at_least(0),
           "Llama models: RMSNorm's eps; 0 = the named model's (1e-5)."),
      choice(FERRY_CONFIG_KEY(model, tie_embeddings),
             "Llama models: the LM head shares the token embedding (true) or has its own "
             "lm_head.weight (false); auto = the named model's."),
      // data
      choice(FERRY_CONFIG_KEY(data, source),
             "Dataset: a generated task, MNIST IDX files, CIFAR-10 binary batches, a folder of "
             "JPEG/PNG images (one subfolder per class) or a token file (llm.c or nanoGPT "
             "format) for language models."),
      text(FERRY_CONFIG_KEY(data, path),
           "idx: the images file; cifar10: a batch file or a folder of them; imagefolder: the "
           "training folder; tokens: the training token file. Required for all four."),
      text(FERRY_CONFIG_KEY(data, labels),
           "idx: the labels file; \"\" = derived from data.path by the loader."),
      integer(FERRY_CONFIG_KEY(data, batch_size), at_least(1), "Samples per step, per rank."),
      flag(FERRY_CONFIG_KEY(data, shuffle),
           "Shuffle every epoch (seeded); false keeps file order (tokens: training reads "
           "consecutive windows instead of random ones)."),
      real_list(FERRY_CONFIG_KEY(data, mean), unbounded(),
                "Per-channel mean subtracted from pixels in [0, 1]; [] = none, else one per "
                "channel of model.input."),
      real_list(FERRY_CONFIG_KEY(data, std), above(0),
                "Per-channel divisor after the mean; [] = none, else one per channel."),
      integer(FERRY_CONFIG_KEY(data, samples), at_least(1), "synthetic: samples in the dataset."),
      integer(FERRY_CONFIG_KEY(data, seed), at_least(-1),
              "synthetic: which samples are drawn; -1 = run.seed. Another seed gives a held-out "
              "set of the same task. imagefolder: seeds the augmentation draws; tokens: the random "
              "training windows."),
      flag(FERRY_CONFIG_KEY(data, drop_last), "Drop the final partial batch of an epoch."),
      text(FERRY_CONFIG_KEY(data, val_path),
           "imagefolder: the folder trainer eval reads; tokens: the validation token file; "
           "\"\" = data.path."),
      integer(FERRY_CONFIG_KEY(data, workers), closed(1, 256),
              "Loader threads that read, decode, augment and normalise the samples of a batch."),
      integer(FERRY_CONFIG_KEY(data, crop), closed(0, 16384),
              "imagefolder: side of the training random-resized crop and of the evaluation "
              "center crop; 0 = model.input's H and W (nonzero: must equal both)."),
      integer(FERRY_CONFIG_KEY(data, resize), closed(1, 16384),
              "imagefolder eval: resize the short side to this before the center crop."),
      int_list(FERRY_CONFIG_KEY(data, scales), closed(1, 16384),
               "synthetic, imagefolder training: square image sides; each global batch is drawn "
               "at one of them (seeded by run.seed, epoch and batch; the same on every rank) and "
               "the model is planned per side within memory.budget. [] = off (model.input's "
               "H and W)."),
      flag(FERRY_CONFIG_KEY(data, skip_bad),
           "imagefolder: an unreadable image is skipped with a warning (replaced by the next "
           "readable one) instead of an error."),
      integer(FERRY_CONFIG_KEY(data, seq_len), closed(0, 1 << 20),
              "tokens: tokens per training row (the window holds seq_len + 1: inputs and their "
              "next tokens); 0 = model.context; must be <= model.context."),
      flag(FERRY_CONFIG_KEY(data, documents),
           "tokens: one document per row, split at data.eot_token (longer ones cut at "
           "data.seq_len); a batch is padded to its longest document rounded up to "
           "data.len_bucket (the same length on every rank), padding ignored by attention and "
           "the loss, which is the mean over real tokens; planned per length."),
      flag(FERRY_CONFIG_KEY(data, pack),
           "data.documents: fill rows of data.seq_len with whole documents instead of padding, "
           "attention kept within each document and positions restarting at each."),
      integer(FERRY_CONFIG_KEY(data, len_bucket), at_least(1),
              "data.documents: a padded batch's length is rounded up to a multiple of this "
              "(at most data.seq_len): fewer lengths, fewer plans."),
      integer(FERRY_CONFIG_KEY(data, eot_token), closed(-1, 2147483647),
              "data.documents: the end-of-text token separating documents; -1 = model.vocab - 1 "
              "(GPT-2's 50256, scripts/prepare_tokens.py's bytes separator 256; for a Hugging "
              "Face tokenizer the script prints the value to set)."),
      // optim
      choice(FERRY_CONFIG_KEY(optim, name), "Optimizer."),
      real(FERRY_CONFIG_KEY(optim, lr), above(0), "Base learning rate (after warm-up)."),
      real(FERRY_CONFIG_KEY(optim, momentum), closed_open(0, 1), "sgd: momentum."),
      flag(FERRY_CONFIG_KEY(optim, nesterov), "sgd: Nesterov momentum; needs momentum > 0."),
      real(FERRY_CONFIG_KEY(optim, weight_decay), at_least(0),
           "L2 penalty (sgd) or decoupled weight decay (adamw)."),
      choice(FERRY_CONFIG_KEY(optim, decay),
             "Which parameters optim.weight_decay applies to: matrices = those of 2+ dimensions "
             "(linear, conv and embedding weights; not biases or norm weights), all = every one, "
             "auto = the model's choice (matrices for transformers, all otherwise)."),
      real(FERRY_CONFIG_KEY(optim, clip_norm), at_least(0),
           "Clip the gradients' global L2 norm (after the all-reduce) to this before the "
           "update, as torch.nn.utils.clip_grad_norm_; 0 = off."),
      choice(FERRY_CONFIG_KEY(optim, schedule), "Learning-rate schedule after warm-up."),
      integer(FERRY_CONFIG_KEY(optim, warmup_steps), at_least(0),
              "Linear warm-up from 0 to optim.lr over this many steps."),
      integer(FERRY_CONFIG_KEY(optim, step_size), at_least(1),
              "step: multiply the rate by optim.gamma every this many steps."),
      real(FERRY_CONFIG_KEY(optim, gamma), open_closed(0, 1), "step: decay factor."),
      real(FERRY_CONFIG_KEY(optim, min_lr), at_least(0),
           "cosine: the rate at the last step; <= optim.lr."),
      real(FERRY_CONFIG_KEY(optim, beta1), closed_open(0, 1), "adamw: first-moment decay."),
      real(FERRY_CONFIG_KEY(optim, beta2), closed_open(0, 1), "adamw: second-moment decay."),
      real(FERRY_CONFIG_KEY(optim, eps), above(0), "adamw: denominator epsilon."),
      integer(
          FERRY_CONFIG_KEY(optim, accumulate), at_least(1),
          "Gradient accumulation: micro-batches of data.batch_size per rank per update "
          "(effective batch = batch_size x accumulate x ranks). Gradients are summed on the "
          "device, reduced across ranks once, on the last micro-batch (memory.zero 2 with staged "
          "gradients: reduce-scattered every micro-batch into the rank's shard), and the loss "
          "is averaged as one batch of that size would be; run.steps, the schedule, logging "
          "and checkpoints count updates. Costs one more gradient-sized block (not under "
          "zero 2's staged gradients)."),
      // device
      choice(FERRY_CONFIG_KEY(device, backend), "Device backend."),
      size(FERRY_CONFIG_KEY(device, memory), 1,
           "Device-memory capacity; allocations beyond it are out-of-memory errors."),
      integer(FERRY_CONFIG_KEY(device, threads), closed(0, 1024),
              "cpu: threads for kernels; 0 = every core."),
      real(FERRY_CONFIG_KEY(device, copy_gbps), at_least(0),
           "cpu: emulated host<->device link bandwidth in GB/s; 0 = unlimited."),
      flag(FERRY_CONFIG_KEY(device, tf32),
           "cuda: convolutions may use TF32 tensor cores (PyTorch's default); false = FP32 FMA."),
      flag(FERRY_CONFIG_KEY(device, tf32_matmul),
           "cuda: linear layers may use TF32 tensor cores; false = FP32, PyTorch's default."),
      flag(FERRY_CONFIG_KEY(device, deterministic),
           "cuda: only cuDNN algorithms with bitwise-repeatable results, one choice per "
           "convolution for the whole process, and a workspace limit that memory.budget does not "
           "change."),
      choice(FERRY_CONFIG_KEY(device, algorithms),
             "cuda: how convolution algorithms are chosen: timed runs each candidate once "
             "(cudnnFind) and keeps the fastest; heuristic takes cuDNN's ranking and runs nothing, "
             "so every process (a resumed run too) gets the same ones, as PyTorch's deterministic "
             "mode."),
      choice(FERRY_CONFIG_KEY(device, precision),
             "fp32, or bf16 mixed precision: fp32 master weights and optimizer state, bf16 "
             "activations, their gradients and the products of convolutions, linear layers and "
             "attention, fp32 inside norms, softmax and the loss (docs/precision.md). cpu: needs "
             "avx512_bf16; cuda: sm_80 or newer."),
      // checkpoint
      text(FERRY_CONFIG_KEY(checkpoint, dir), "Directory of step_<N>.safetensors checkpoints.",
           "<run.dir>/checkpoints"),
      integer(FERRY_CONFIG_KEY(checkpoint, every), at_least(0),
              "Write a checkpoint every this many steps and at the last step; 0 = never."),
      integer(FERRY_CONFIG_KEY(checkpoint, keep), at_least(0),
              "Keep the newest this many checkpoints; 0 = keep all."),
      text(FERRY_CONFIG_KEY(checkpoint, resume),
           "\"\" = fresh start, latest = newest checkpoint in checkpoint.dir, or a file path."),
      // memory
      choice(FERRY_CONFIG_KEY(memory, policy),
             "Activation offload policy: none, vDNN's two static ones, or budget-driven auto."),
      size(FERRY_CONFIG_KEY(memory, budget), 0, "Device bytes the plan may use; 0 = device.memory.",
           "device.memory", "<= device.memory"),
      flag(FERRY_CONFIG_KEY(memory, recompute),
           "auto: may drop activations and rebuild them in backward (ReLU, BN, pooling, add, "
           "convolutions, linear layers) where that is predicted faster than copying them."),
      flag(FERRY_CONFIG_KEY(memory, per_shape),
           "auto with input shapes that change per step (data.scales): plan each shape on its "
           "own; false = plan the largest shape and apply its decisions (what is offloaded, "
           "what is rebuilt) to every smaller one (Mimose's static baseline, for comparison)."),
      choice(FERRY_CONFIG_KEY(memory, oversize),
             "A batch whose input shape no plan fits within memory.budget: error = the run ends "
             "before its step, naming the shape and the smallest budget; skip = the batch is "
             "dropped on every rank with a counted warning (log, summary.json)."),
      size(FERRY_CONFIG_KEY(memory, host_limit), 0,
           "Cap of the pinned host pool for offloads (and the optimizer state under "
           "memory.optimizer host)."),
      choice(FERRY_CONFIG_KEY(memory, zero),
             "Model state per data-parallel rank (ZeRO): 0 = every rank holds all of it; 1 = "
             "each rank keeps 1/N of the optimizer state and updates its shard (gradients "
             "reduce-scattered, parameters all-gathered); 2 = also 1/N of the gradients, "
             "reduce-scattered bucket by bucket during backward; auto = the planner's choice "
             "(the least predicted step that fits, no sharding when it fits)."),
      choice(FERRY_CONFIG_KEY(memory, optimizer),
             "Where the optimizer state lives and its update runs: device, host (host memory "
             "within memory.host_limit, updated by the CPU), or auto = the planner's choice "
             "(device when it fits)."),
      real(FERRY_CONFIG_KEY(memory, link_gbps), at_least(0),
           "Host<->device GB/s the planner assumes when costing offloads; 0 = measured "
           "(memory.measure) or the device's (cuda 12, cpu device.copy_gbps or 8)."),
      flag(FERRY_CONFIG_KEY(memory, debug_poison),
           "Fill the device space of non-resident tensors with NaN (testing)."),
      size(FERRY_CONFIG_KEY(memory, workspace_limit), 0,
           "cuda: most scratch bytes one convolution or linear kernel may use, at most "
           "memory.budget / 8; the plan holds the chosen algorithms' real workspace."),
      flag(FERRY_CONFIG_KEY(memory, measure),
           "Time the model's kernels and the link on the device at start (cached in "
           "<run.dir>/cost_profile.json) and plan with those times; false = the FLOP model."),
      flag(FERRY_CONFIG_KEY(memory, share),
           "Share the device with the node's other ferry jobs that share it: the budget is "
           "assigned by the node's job ledger (trainer jobs), between the plan's lower bound and "
           "its peak, at most memory.budget; a job whose lower bound does not fit waits. The "
           "device then holds only what the job's heap holds, in 2 MiB granules (cuda: "
           "device.memory is reserved address space, mapped on use)."),
      choice(FERRY_CONFIG_KEY(memory, share_objective),
             "How a shared device is divided (the first job's on the device holds): throughput = "
             "the most speed summed over jobs, each relative to running alone; fair = the "
             "smallest largest slowdown against running alone."),
      real(FERRY_CONFIG_KEY(memory, share_wait), closed(0, 1e6),
           "memory.share: seconds a job waits for its lower bound to fit the shared device, "
           "then exits with an error (code 2); 0 = no wait."),
      real(FERRY_CONFIG_KEY(memory, share_drift), closed(0, 100),
           "memory.share: a running job whose measured step time differs from its predicted one "
           "by more than this share (TENSILE's 0.3) re-registers its curve scaled by measured / "
           "predicted, and the device is divided again; 0 = never."),
      // comm
      choice(FERRY_CONFIG_KEY(comm, backend),
             "Gradient all-reduce: auto = nccl on cuda, mpi on cpu."),
      real(FERRY_CONFIG_KEY(comm, bucket_mb), closed(0.001, 16384), "Gradient bucket size in MiB."),
      flag(FERRY_CONFIG_KEY(comm, overlap),
           "Reduce each bucket while backward continues; false = after backward."),
      real(FERRY_CONFIG_KEY(comm, timeout_s), Range{0, 86400, false, false},
           "Watchdog: a rank that waits longer than this many seconds in one collective ends "
           "the job (the mpi backend names the ranks that did not arrive); 0 = off, else at "
           "least 1."),
      choice(FERRY_CONFIG_KEY(comm, dtype),
             "Format the gradients are all-reduced in: bf16 halves the bytes on the wire, the "
             "sum accumulated into fp32 gradients; needs device.precision bf16."),
      // topology
      text(FERRY_CONFIG_KEY(topology, file),
           "\"\" = the live machine; an hwloc .xml export or a synthetic .yaml description."),
      choice(FERRY_CONFIG_KEY(topology, scheduler),
             "When offloads and prefetches start: fifo (in request order) or topology (chunks "
             "arbitrated per link across the node's ranks, least deadline slack first)."),
      flag(FERRY_CONFIG_KEY(topology, bind),
           "Bind each rank's threads and pinned memory to its GPU's NUMA node."),
      real(FERRY_CONFIG_KEY(topology, unknown_link_gbps), above(0),
           "Bandwidth in GB/s assumed for a PCIe link whose speed is unknown."),
      real(FERRY_CONFIG_KEY(topology, duplex_factor), open_closed(0, 1),
           "Per-direction capacity multiplier of a link while both directions are busy."),
      real(FERRY_CONFIG_KEY(topology, emulation_scale), open_closed(0, 1e6),
           "cpu ranks on topology.file: multiplier on emulated link time (CPU step time / GPU "
           "step time keeps compute:link ratios)."),
      real(FERRY_CONFIG_KEY(topology, chunk_mb), closed(0.0625, 1024),
           "topology scheduler: transfers cross the links in chunks of this many MiB. On a GPU "
           "each chunk costs a host hand-off (a few us to tens of us): 16-64 MiB keeps that "
           "small (a 4 MiB chunk moves in ~80 us at 50 GB/s)."),
      // debug
      integer(FERRY_CONFIG_KEY(debug, fail_at_step), at_least(-1),
              "Inject a failure at the start of this step; -1 = never."),
      integer(FERRY_CONFIG_KEY(debug, fail_rank), at_least(-1),
              "The rank that fails at debug.fail_at_step or stalls at debug.stall_at_step; -1 = "
              "every rank."),
      integer(FERRY_CONFIG_KEY(debug, stall_at_step), at_least(-1),
              "Stop the rank (SIGSTOP: it hangs until killed or continued) at the start of this "
              "step, to test comm.timeout_s; -1 = never."),
  };
}

#undef FERRY_CONFIG_KEY

}  // namespace

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> kSchema = build_schema();
  return kSchema;
}

const KeySpec* find_key(const std::string& name) {
  static const std::unordered_map<std::string, const KeySpec*> kIndex = [] {
    std::unordered_map<std::string, const KeySpec*> index;
    for (const auto& k : schema()) index.emplace(k.name, &k);
    return index;
  }();
  const auto it = kIndex.find(name);
  return it == kIndex.end() ? nullptr : it->second;
}

const std::vector<std::string>& sections() {
  static const std::vector<std::string> kSections = [] {
    std::vector<std::string> out;
    for (const auto& k : schema()) {
      const std::string section = k.name.substr(0, k.name.find('.'));
      if (out.empty() || out.back() != section) out.push_back(section);
    }
    return out;
  }();
  return kSections;
}

std::string value_text(const KeySpec& spec, const Value& value) {
  switch (spec.type) {
    case ValueType::kBool:
      return std::get<bool>(value) ? "true" : "false";
    case ValueType::kInt:
      return fmt::format("{}", std::get<int64_t>(value));
    case ValueType::kUint:
      return fmt::format("{}", std::get<uint64_t>(value));
    case ValueType::kFloat:
      return real_text(std::get<double>(value));
    case ValueType::kSize:
      return size_text(std::get<uint64_t>(value));
    case ValueType::kString: {
      const auto& s = std::get<std::string>(value);
      return s.empty() ? "\"\"" : s;
    }
    case ValueType::kChoice:
      return std::get<std::string>(value);
    case ValueType::kIntTuple:
    case ValueType::kIntList:
      return fmt::format("[{}]", fmt::join(std::get<std::vector<int64_t>>(value), ", "));
    case ValueType::kFloatList: {
      std::vector<std::string> parts;
      for (double v : std::get<std::vector<double>>(value)) parts.push_back(real_text(v));
      return fmt::format("[{}]", fmt::join(parts, ", "));
    }
  }
  return "";
}

std::string default_text(const KeySpec& spec) {
  if (!spec.default_doc.empty()) return spec.default_doc;
  return value_text(spec, spec.read(Config{}));
}

std::string accepted_text(const KeySpec& spec) {
  const auto with = [&](std::string what) {
    return spec.allowed_doc.empty() ? what : what + " " + spec.allowed_doc;
  };
  switch (spec.type) {
    case ValueType::kBool:
      return "true or false";
    case ValueType::kInt:
    case ValueType::kUint:
      return with("an integer");
    case ValueType::kFloat:
      return with("a number");
    case ValueType::kString:
      return spec.allowed_doc.empty() ? "a string" : "a non-empty string";
    case ValueType::kSize:
      return with("a size such as 512MiB or 16GiB");
    case ValueType::kChoice:
      return "one of " + spec.allowed_doc;
    case ValueType::kIntTuple:
      return fmt::format("a list of {} integers {}",
                         std::get<std::vector<int64_t>>(spec.read(Config{})).size(),
                         spec.allowed_doc);
    case ValueType::kIntList:
      return spec.allowed_doc.empty() ? "a list of integers"
                                      : "a list of integers, " + spec.allowed_doc;
    case ValueType::kFloatList:
      return spec.allowed_doc.empty() ? "a list of numbers"
                                      : "a list of numbers, " + spec.allowed_doc;
  }
  return "";
}

}  // namespace ferry::config_internal
