// memory.optimizer host's half of ModelStateStep: gradients down as each bucket's reduction ends,
// the update on the host, weights up with the deadline of their first forward, all through the
// executor's transfer engine (Note [Host copies on the links] in model_state_step.h). Invariant:
// the host reads its gradients only after every copy down has completed, and compute (or the
// all-gather) reads a weight piece only after its copy up has.
#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/optim/model_state_step.h"

namespace ferry {

Event& ModelStateStep::next_event() {
  if (next_event_ == events_.size()) events_.push_back(device_.create_event());
  return *events_[next_event_++];  // re-recorded each step: Note [Reusing completion events]
}

size_t ModelStateStep::param_at(int64_t at) const {
  const auto& params = store_.params();
  const auto it = std::upper_bound(
      params.begin(), params.end(), static_cast<uint64_t>(at) * sizeof(float),
      [](uint64_t bytes, const ParameterStore::Entry& e) { return bytes < e.offset; });
  return it == params.begin() ? 0 : static_cast<size_t>(it - params.begin() - 1);
}

std::string ModelStateStep::copy_name(const char* what, int64_t begin, int64_t end) const {
  if (store_.params().empty()) return what;
  const size_t first = param_at(begin), last = param_at(end - 1);
  const std::string& name = store_.params()[first].name;
  if (last == first) return fmt::format("{} {}", what, name);
  return fmt::format("{} {} +{}", what, name, last - first);
}

namespace {

// The least per-parameter deadline over the parameters [first, last], 0 when none is known.
double least(const std::vector<double>& seconds, size_t first, size_t last) {
  if (seconds.empty()) return 0;
  double s = seconds[std::min(first, seconds.size() - 1)];
  for (size_t p = first; p <= last && p < seconds.size(); ++p) s = std::min(s, seconds[p]);
  return s;
}

}  // namespace

const std::vector<ModelStateStep::UpPiece>& ModelStateStep::up_pieces() {
  if (!up_bounds_.empty() || store_.update_end() <= store_.update_begin()) return up_pieces_;
  const int64_t begin = store_.update_begin(), end = store_.update_end();
  const int64_t most =
      std::max<int64_t>(1, static_cast<int64_t>(options_.bucket_bytes / sizeof(float)));
  const auto& params = store_.params();
  for (int64_t at = begin; at < end;) {
    // Whole parameters while they fit in a piece; one larger than a piece is cut.
    size_t p = param_at(at);
    int64_t stop = at;
    while (stop < end) {
      const int64_t param_end =
          p + 1 < params.size()
              ? std::min(end, static_cast<int64_t>(params[p + 1].offset / sizeof(float)))
              : end;
      if (param_end - at <= most) {
        stop = param_end;
        ++p;
        continue;
      }
      if (stop == at) stop = at + most;
      break;
    }
    up_pieces_.push_back(
        {at, stop, least(options_.weight_deadline_s, param_at(at), param_at(stop - 1))});
    up_bounds_.push_back(at);
    at = stop;
  }
  up_bounds_.push_back(end);
  return up_pieces_;
}

void ModelStateStep::wait_upload(size_t k, Stream& compute, int step) {
  if (k >= uploading_.size() || !uploading_[k]) return;
  compute.wait(*up_events_[k]);
  uploading_[k] = 0;
  up_waited_at_[k] = step;
}

void ModelStateStep::send_gradients(int64_t offset, int64_t count, const CommWork& reduced,
                                    Stream& after) {
  // Staged zero 2: the shard holds the sum only after the update's last micro-batch.
  if (store_.staged() && !last_micro_) return;
  const int64_t begin = std::max(offset, store_.update_begin());
  const int64_t end = std::min(offset + count, store_.update_end());
  if (begin >= end) return;
  Event& ready = next_event();
  after.record(ready);  // its gradients are written (one rank: no collective to wait for)
  Stream& d2h = device_.stream(StreamKind::kDeviceToHost);
  reduced.order_before(d2h);
  // Staged zero 2: the rank's part reaches the shard on the comm stream after the collective.
  if (store_.staged()) {
    const auto at = range_at_.find(offset);
    if (at != range_at_.end()) d2h.wait(*copied_[at->second.first]);
  }
  TransferRequest request{TransferDirection::kToHost,
                          copy_name("gradients", begin, end),
                          static_cast<uint64_t>(end - begin) * sizeof(float),
                          -1,
                          least(options_.gradient_deadline_s, param_at(begin), param_at(end - 1)),
                          TransferPurpose::kOptimizer};
  Event& done = next_event();
  options_.transfers->copy(request, store_.host_grads() + (begin - store_.update_begin()),
                           store_.update_grads() + (begin - store_.update_begin()), ready, done);
  down_ = &done;
  sent_.emplace_back(begin, end);
}

void ModelStateStep::send_rest(Stream& compute) {
  std::sort(sent_.begin(), sent_.end());
  std::vector<std::pair<int64_t, int64_t>> gaps;
  int64_t at = store_.update_begin();
  for (const auto& [b, e] : sent_) {
    if (b > at) gaps.emplace_back(at, b);
    at = std::max(at, e);
  }
  if (at < store_.update_end()) gaps.emplace_back(at, store_.update_end());
  // compute waits for every collective (finish()): nothing more to order after.
  for (const auto& [b, e] : gaps) send_gradients(b, e - b, CommWork(), compute);
}

void ModelStateStep::host_update(Stream& compute, float lr) {
  const int64_t begin = store_.update_begin(), end = store_.update_end();
  const int64_t n = end - begin;
  float* param = store_.masters();
  TransferEngine& engine = *options_.transfers;
  const float clip_norm = optimizer_.options().clip_norm;
  // The sum of squares on the device (all-reduced by shard); the host scales.
  clip(compute, /*on_device=*/false);
  const auto down = [&](const std::string& name, void* host, const void* device, uint64_t bytes) {
    Event& ready = next_event();
    compute.record(ready);
    Event& done = next_event();
    engine.copy({TransferDirection::kToHost, name, bytes, -1, 0, TransferPurpose::kOptimizer}, host,
                device, ready, done);
    down_ = &done;
  };
  if (clip_norm > 0) {
    if (host_sum_sq_.size() == 0) host_sum_sq_ = PinnedFloats(device_.pinned(), 1);
    down("gradient norm", host_sum_sq_.data(), store_.grad_sq_address(), sizeof(float));
  }
  // Host masters (Note [Sharded master weights]): the host's are the weights; nothing to take.
  if (!host_weights_current_ && n > 0 && !store_.host_masters()) {
    // The first update (or one after a checkpoint was loaded): the host takes the device's bits.
    down(copy_name("weights", begin, end), store_.host_params(), param,
         static_cast<uint64_t>(n) * sizeof(float));
    host_weights_current_ = true;
  }
  // The one host wait of the step: the copy stream runs in order, so the last copy down's event
  // covers every gradient.
  if (down_) down_->synchronize();
  if (clip_norm > 0) {
    Optimizer::host_clip_by_norm(store_.host_grads(), n, host_sum_sq_.data()[0], clip_norm);
  }
  Optimizer::Range r{begin, end, store_.host_params(), store_.host_grads()};
  for (int s = 0; s < store_.optimizer_slots() && s < 2; ++s)
    r.state[s] = store_.optimizer_block(s);
  optimizer_.host_step(store_, r, lr);

  // Weights up, least deadline first. They overwrite weights the step's compute has read: the
  // copy stream waits for it. Compute waits per piece in before_step (or the gather does).
  const std::vector<UpPiece>& pieces = up_pieces();
  std::vector<size_t> order(pieces.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return pieces[a].deadline_s < pieces[b].deadline_s; });
  Event& ready = next_event();
  compute.record(ready);
  while (up_events_.size() < pieces.size()) up_events_.push_back(device_.create_event());
  uploading_.assign(pieces.size(), options_.shard ? 0 : 1);
  up_waited_at_.assign(pieces.size(), -2);
  // Host masters (Note [Sharded master weights]): a piece is its bf16 rounding plus the fp32
  // weights in it, several copies; the piece's event is its last copy's.
  const bool host_masters = store_.host_masters();
  if (host_masters) store_.round_host_masters(begin, end);
  std::vector<Event*> copies;
  for (size_t k : order) {
    const UpPiece& piece = pieces[k];
    const auto count = static_cast<uint64_t>(piece.end - piece.begin);
    const float* from = store_.host_params() + (piece.begin - begin);
    struct Copy {
      uint64_t bytes;
      void* to;
      const void* from;
    };
    std::vector<Copy> parts;
    if (!host_masters) {
      parts.push_back({count * sizeof(float), store_.masters() + (piece.begin - begin), from});
    } else {
      parts.push_back(
          {count * 2, store_.working_at(piece.begin),
           static_cast<const std::byte*>(store_.host_working()) + (piece.begin - begin) * 2});
      for (const ParameterStore::Fp32Copy& c : store_.fp32_copies(piece.begin, piece.end)) {
        parts.push_back({static_cast<uint64_t>(c.end - c.begin) * sizeof(float), c.to,
                         store_.host_params() + (c.begin - begin)});
      }
    }
    for (size_t c = 0; c < parts.size(); ++c) {
      Event& done = c + 1 == parts.size() ? *up_events_[k] : next_event();
      engine.copy({TransferDirection::kToDevice, copy_name("weights", piece.begin, piece.end),
                   parts[c].bytes, -1, piece.deadline_s, TransferPurpose::kOptimizer},
                  parts[c].to, parts[c].from, ready, done);
      if (host_masters) copies.push_back(&done);
    }
  }
  // Host masters are bf16 only, where compute waits for every piece at the update anyway (Note
  // [The bf16 working copy]); the all-gathers (the fp32 weights' first) wait for every copy too.
  if (host_masters) {
    Stream& comm = device_.stream(StreamKind::kComm);
    for (Event* e : copies) {
      comm.wait(*e);
      compute.wait(*e);
    }
  }
  next_event_ = 0;
  sent_.clear();
  down_ = nullptr;
}

}  // namespace ferry
