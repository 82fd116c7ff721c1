// The enumerated choices of the config (memory.policy: vdnn-all, ...) and their spellings.
// Invariant: each enum value has exactly one spelling, and from_string(to_string(v)) == v.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Choices that name a lower layer's concept reuse its enum: device.backend (Backend),
// device.algorithms (AlgorithmSearch), device.precision and comm.dtype (Precision),
// optim.name, optim.schedule and optim.decay (OptimizerKind, ScheduleKind, WeightDecayGroups),
// memory.policy (MemoryPolicy), memory.share_objective (ShareObjective).
#include "device/device.h"
#include "device/precision.h"
#include "jobs/share_controller.h"
#include "prefetch/policy.h"
#include "trainer/optim/kinds.h"

namespace ferry {

// data.source
enum class DataSource { kSynthetic, kIdx, kCifar10, kImageFolder, kTokens };
// model.tie_embeddings: the named model's choice, or a tied / untied LM head.
enum class TieEmbeddings { kAuto, kTrue, kFalse };
// comm.backend
enum class CommBackend { kAuto, kMpi, kNccl };
// memory.oversize: what training does with a batch whose input shape the budget cannot hold.
// error: the run ends before that batch's step; skip: the batch is dropped (on every rank).
enum class OversizeAction { kError, kSkip };
// model.attention: fused saves y and a log-sum-exp per query and recomputes the probabilities in
// backward; naive saves the (T, T) probabilities per head.
enum class AttentionKind { kFused, kNaive };
// topology.scheduler: how the link scheduler orders offload/prefetch transfers.
// fifo: oblivious, in request order; topology: per-link arbitration across the node's ranks.
enum class LinkSchedulerKind { kFifo, kTopology };

// EnumNames<E>::kNames lists every value of E with its config spelling, in declaration order.
template <class E>
struct EnumNames;

template <>
struct EnumNames<DataSource> {
  static constexpr std::array<std::pair<DataSource, std::string_view>, 5> kNames{
      {{DataSource::kSynthetic, "synthetic"},
       {DataSource::kIdx, "idx"},
       {DataSource::kCifar10, "cifar10"},
       {DataSource::kImageFolder, "imagefolder"},
       {DataSource::kTokens, "tokens"}}};
};
template <>
struct EnumNames<OptimizerKind> {
  static constexpr std::array<std::pair<OptimizerKind, std::string_view>, 2> kNames{
      {{OptimizerKind::kSgd, "sgd"}, {OptimizerKind::kAdamW, "adamw"}}};
};
template <>
struct EnumNames<ZeroStage> {
  static constexpr std::array<std::pair<ZeroStage, std::string_view>, 4> kNames{
      {{ZeroStage::k0, "0"},
       {ZeroStage::k1, "1"},
       {ZeroStage::k2, "2"},
       {ZeroStage::kAuto, "auto"}}};
};
template <>
struct EnumNames<OptimizerPlacement> {
  static constexpr std::array<std::pair<OptimizerPlacement, std::string_view>, 3> kNames{
      {{OptimizerPlacement::kDevice, "device"},
       {OptimizerPlacement::kHost, "host"},
       {OptimizerPlacement::kAuto, "auto"}}};
};
template <>
struct EnumNames<ScheduleKind> {
  static constexpr std::array<std::pair<ScheduleKind, std::string_view>, 3> kNames{
      {{ScheduleKind::kConstant, "constant"},
       {ScheduleKind::kStep, "step"},
       {ScheduleKind::kCosine, "cosine"}}};
};
template <>
struct EnumNames<WeightDecayGroups> {
  static constexpr std::array<std::pair<WeightDecayGroups, std::string_view>, 3> kNames{
      {{WeightDecayGroups::kAuto, "auto"},
       {WeightDecayGroups::kMatrices, "matrices"},
       {WeightDecayGroups::kAll, "all"}}};
};
template <>
struct EnumNames<Backend> {
  static constexpr std::array<std::pair<Backend, std::string_view>, 2> kNames{
      {{Backend::kCpu, "cpu"}, {Backend::kCuda, "cuda"}}};
};
template <>
struct EnumNames<AlgorithmSearch> {
  static constexpr std::array<std::pair<AlgorithmSearch, std::string_view>, 2> kNames{
      {{AlgorithmSearch::kTimed, "timed"}, {AlgorithmSearch::kHeuristic, "heuristic"}}};
};
template <>
struct EnumNames<Precision> {
  static constexpr std::array<std::pair<Precision, std::string_view>, 2> kNames{
      {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}};
};
template <>
struct EnumNames<MemoryPolicy> {
  static constexpr std::array<std::pair<MemoryPolicy, std::string_view>, 4> kNames{
      {{MemoryPolicy::kNone, "none"},
       {MemoryPolicy::kVdnnConv, "vdnn-conv"},
       {MemoryPolicy::kVdnnAll, "vdnn-all"},
       {MemoryPolicy::kAuto, "auto"}}};
};
template <>
struct EnumNames<ShareObjective> {
  static constexpr std::array<std::pair<ShareObjective, std::string_view>, 2> kNames{
      {{ShareObjective::kThroughput, "throughput"}, {ShareObjective::kFair, "fair"}}};
};
template <>
struct EnumNames<TieEmbeddings> {
  static constexpr std::array<std::pair<TieEmbeddings, std::string_view>, 3> kNames{
      {{TieEmbeddings::kAuto, "auto"},
       {TieEmbeddings::kTrue, "true"},
       {TieEmbeddings::kFalse, "false"}}};
};
template <>
struct EnumNames<CommBackend> {
  static constexpr std::array<std::pair<CommBackend, std::string_view>, 3> kNames{
      {{CommBackend::kAuto, "auto"}, {CommBackend::kMpi, "mpi"}, {CommBackend::kNccl, "nccl"}}};
};
template <>
struct EnumNames<OversizeAction> {
  static constexpr std::array<std::pair<OversizeAction, std::string_view>, 2> kNames{
      {{OversizeAction::kError, "error"}, {OversizeAction::kSkip, "skip"}}};
};
template <>
struct EnumNames<AttentionKind> {
  static constexpr std::array<std::pair<AttentionKind, std::string_view>, 2> kNames{
      {{AttentionKind::kFused, "fused"}, {AttentionKind::kNaive, "naive"}}};
};
template <>
struct EnumNames<LinkSchedulerKind> {
  static constexpr std::array<std::pair<LinkSchedulerKind, std::string_view>, 2> kNames{
      {{LinkSchedulerKind::kFifo, "fifo"}, {LinkSchedulerKind::kTopology, "topology"}}};
};

// An enum with config spellings.
template <class E>
concept SpelledEnum = requires {
  EnumNames<E>::kNames;
};

// The config spelling of `value`: to_string(MemoryPolicy::kVdnnAll) == "vdnn-all".
template <SpelledEnum E>
std::string_view to_string(E value) {
  for (const auto& [v, name] : EnumNames<E>::kNames)
    if (v == value) return name;
  return "?";
}

// The value spelled `text` (exact, case-sensitive), or nullopt.
template <SpelledEnum E>
std::optional<E> from_string(std::string_view text) {
  for (const auto& [v, name] : EnumNames<E>::kNames)
    if (name == text) return v;
  return std::nullopt;
}

// Every spelling of E in declaration order: {"none", "vdnn-conv", "vdnn-all", "auto"}.
template <SpelledEnum E>
std::vector<std::string> enum_spellings() {
  std::vector<std::string> out;
  for (const auto& entry : EnumNames<E>::kNames) out.emplace_back(entry.second);
  return out;
}

}  // namespace ferry
