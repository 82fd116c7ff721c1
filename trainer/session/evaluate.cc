// The evaluation loop: one pass over the configured dataset with fixed weights.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "device/bf16.h"
#include "trainer/configured/dataset.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/session/checkpoints.h"
#include "trainer/session/run_dir.h"
#include "trainer/session/session.h"
#include "trainer/session/train.h"

namespace ferry {

namespace fs = std::filesystem;

namespace {

// Rows of `logits` (n, k) whose label's logit is among the 5 largest; a logit equal to the
// label's counts as larger when its class index is lower.
int64_t top5_correct(const float* logits, const int32_t* labels, int64_t n, int64_t k) {
  int64_t correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits + i * k;
    const float mine = row[labels[i]];
    int64_t above = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (row[j] > mine || (row[j] == mine && j < labels[i])) ++above;
    }
    if (above < 5) ++correct;
  }
  return correct;
}

// Loss and top-1 count of one batch's rows on the host, from its logits (n, k), leaving out the
// rows whose sample was unreadable (data.skip_bad replaced it by another file).
struct RowScore {
  double loss_sum = 0;
  int64_t correct = 0, top5 = 0, rows = 0;
};
RowScore score_readable_rows(const float* logits, const int32_t* labels, int64_t k,
                             const std::vector<bool>& skip) {
  RowScore s;
  for (size_t i = 0; i < skip.size(); ++i) {
    if (skip[i]) continue;
    const float* row = logits + static_cast<int64_t>(i) * k;
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j)
      if (row[j] > row[best]) best = j;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(row[j] - row[best]));
    s.loss_sum += std::log(sum) - static_cast<double>(row[labels[i]] - row[best]);
    s.correct += best == labels[i] ? 1 : 0;
    s.top5 += top5_correct(row, labels + i, 1, k);
    ++s.rows;
  }
  return s;
}

// The kept logits of the last batch as floats (bf16 logits widened, exactly).
std::vector<float> read_logits(Session& session, const std::string& name) {
  const std::vector<std::byte> bytes = session.executor().read_activation(name);
  const Graph& g = session.graph();
  if (g.tensor(g.logits()).desc.dtype != DType::kBF16) {
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
  }
  std::vector<float> out(bytes.size() / sizeof(uint16_t));
  for (size_t i = 0; i < out.size(); ++i) {
    BF16 h;
    std::memcpy(&h.bits, bytes.data() + i * sizeof(uint16_t), sizeof(uint16_t));
    out[i] = bf16_to_float(h);
  }
  return out;
}

// The evaluation set once, in order, every partial batch kept; announced on stdout.
DataLoader one_pass(const Config& c, Session& session, std::shared_ptr<const Dataset> dataset) {
  LoaderOptions lo = loader_options(c, session.device());
  lo.shuffle = false;
  lo.drop_last = false;
  lo.epochs = 1;
  std::printf("eval     %s on %s with %s\n", c.model.name.c_str(), dataset->describe().c_str(),
              c.model.init_from.c_str());
  return DataLoader(std::move(dataset), lo);
}

// Note [Evaluating a token model]
// Every full window of the file once, in order (the dataset's evaluation windows), or every
// document once (data.documents: padded per batch, or packed); each batch's loss is the mean over
// its labelled tokens (rows x T, or the documents' real tokens), so the file's mean token loss is
// their weighted sum; perplexity = exp(loss); accuracy = the share of next tokens whose logit is
// the largest. The logits (rows x T x vocab) are never copied to the host.
EvalResult evaluate_tokens(const Config& c) {
  Session session(c, RankInfo{}, /*training=*/false);
  auto dataset = open_configured_dataset(c, /*evaluation=*/true);
  DataLoader loader = one_pass(c, session, dataset);
  double loss_sum = 0;
  int64_t correct = 0, windows = 0, labelled = 0;
  while (Batch batch = loader.next()) {
    if (batch.size() == 0) continue;
    session.executor().enqueue({batch.input(), batch.labels(), batch.size(), batch.shape(),
                                batch.segments(), batch.loss_divisor()},
                               false, 0);
    const StepMetrics m = session.metrics();
    loss_sum += static_cast<double>(m.loss) * static_cast<double>(batch.labelled());
    correct += m.correct;
    windows += batch.size();
    labelled += batch.labelled();
  }
  const double tokens = static_cast<double>(std::max<int64_t>(labelled, 1));
  EvalResult r;
  r.loss = loss_sum / tokens;
  r.accuracy = static_cast<double>(correct) / tokens;
  r.samples = windows;
  r.tokens = labelled;
  r.perplexity = std::exp(r.loss);
  nlohmann::json j = {{"loss", r.loss},
                      {"perplexity", r.perplexity},
                      {"accuracy", r.accuracy},
                      {"samples", r.samples},
                      {"tokens", r.tokens},
                      {"model", c.model.name},
                      {"weights", c.model.init_from}};
  write_run_file((fs::path(c.run.dir) / "eval.json").string(), j.dump(2) + "\n");
  std::printf("eval     loss %.4f  perplexity %.3f  accuracy %.4f  %s %lld (%lld tokens)  -> %s\n",
              r.loss, r.perplexity, r.accuracy,
              !c.data.documents ? "windows"
              : c.data.pack     ? "packed rows"
                                : "documents",
              static_cast<long long>(r.samples), static_cast<long long>(r.tokens),
              (fs::path(c.run.dir) / "eval.json").c_str());
  return r;
}

}  // namespace

EvalResult evaluate(const Config& config) {
  ensure_writable_dir(config.run.dir, "run.dir");
  Config c = config;
  if (c.model.init_from.empty()) {
    const auto all = list_checkpoints(c.checkpoint.dir);
    if (all.empty()) {
      throw ConfigError("nothing to evaluate: model.init_from is empty and checkpoint.dir (" +
                            c.checkpoint.dir + ") holds no checkpoint",
                        "set model.init_from to a weights file, or train first");
    }
    c.model.init_from = all.back().second;
  }
  if (model_info(c.model.name).tokens) return evaluate_tokens(c);
  Session session(c, RankInfo{}, /*training=*/false);
  // The logits stay readable after each batch, for top-5 accuracy.
  const std::string logits = session.graph().tensor(session.graph().logits()).name;
  session.executor().keep_alive({logits});
  auto dataset = open_configured_dataset(c, /*evaluation=*/true);
  DataLoader loader = one_pass(c, session, dataset);
  double loss_sum = 0;
  int64_t correct = 0, correct5 = 0, samples = 0;
  const int64_t classes = c.model.classes;
  while (Batch batch = loader.next()) {
    if (batch.size() == 0) continue;
    for (const std::string& w : dataset->take_warnings()) std::printf("%s\n", w.c_str());
    session.executor().enqueue({batch.input(), batch.labels(), batch.size()}, false, 0);
    const StepMetrics m = session.metrics();
    const std::vector<float> out = read_logits(session, logits);
    FERRY_ASSERT(out.size() == static_cast<size_t>(batch.size() * classes),
                 "logits of an unexpected size");
    const float* rows = out.data();
    // A substitute for an unreadable image is not a sample of the evaluation set.
    std::vector<bool> skip;
    for (int64_t index : loader.indices(batch.position()))
      skip.push_back(dataset->unreadable(index));
    if (std::find(skip.begin(), skip.end(), true) != skip.end()) {
      const RowScore s = score_readable_rows(rows, batch.labels(), classes, skip);
      loss_sum += s.loss_sum;
      correct += s.correct;
      correct5 += s.top5;
      samples += s.rows;
      continue;
    }
    correct5 += top5_correct(rows, batch.labels(), batch.size(), classes);
    loss_sum += static_cast<double>(m.loss) * static_cast<double>(batch.size());
    correct += m.correct;
    samples += batch.size();
  }
  for (const std::string& w : dataset->take_warnings()) std::printf("%s\n", w.c_str());
  if (dataset->skipped() > 0) {
    std::printf("data     %lld unreadable image%s skipped (data.skip_bad)\n",
                static_cast<long long>(dataset->skipped()), dataset->skipped() == 1 ? "" : "s");
  }
  const double denom = static_cast<double>(std::max<int64_t>(samples, 1));
  EvalResult r{loss_sum / denom, static_cast<double>(correct) / denom,
               static_cast<double>(correct5) / denom, samples};
  nlohmann::json j = {
      {"loss", r.loss},       {"accuracy", r.accuracy}, {"top5_accuracy", r.top5_accuracy},
      {"samples", r.samples}, {"model", c.model.name},  {"weights", c.model.init_from}};
  write_run_file((fs::path(c.run.dir) / "eval.json").string(), j.dump(2) + "\n");
  std::printf("eval     loss %.4f  accuracy %.4f  top-5 %.4f  samples %lld  -> %s\n", r.loss,
              r.accuracy, r.top5_accuracy, static_cast<long long>(r.samples),
              (fs::path(c.run.dir) / "eval.json").c_str());
  return r;
}

}  // namespace ferry
