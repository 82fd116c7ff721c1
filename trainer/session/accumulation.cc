// Folding micro-batch gradients into the accumulation block and back, parameter by parameter as
// backward writes them (Note [Accumulating micro-batches] in accumulation.h).
#include "trainer/session/accumulation.h"

#include <algorithm>

#include "common/error.h"
#include "device/kernels.h"

namespace ferry {

namespace {

// A parameter's slice of a gradient block: its entry rounded up to the 64-byte alignment (the
// padding is zero in both blocks, so adjacent slices merge into one launch).
uint64_t slice_bytes(const ParameterStore::Entry& e) { return (e.desc.bytes() + 63) / 64 * 64; }

}  // namespace

class GradientAccumulation::Folder : public GradientListener {
 public:
  explicit Folder(GradientAccumulation& owner) : owner_(owner) {}
  void on_gradients(std::span<const size_t> params) override { owner_.fold(params); }
  // The parameters' all-gather waits (ModelStateStep) hold for every micro-batch's forward.
  void before_step(const Program& program, int step) override {
    owner_.reduce_.before_step(program, step);
  }

 private:
  GradientAccumulation& owner_;
};

GradientAccumulation::GradientAccumulation(Device& device, const ParameterStore& store,
                                           GradientListener& reduce)
    : device_(device),
      store_(store),
      reduce_(reduce),
      folder_(std::make_unique<Folder>(*this)),
      held_(store.params().size(), 0),
      written_(store.params().size(), 0) {
  FERRY_ASSERT(store.accumulation_block() != nullptr,
               "gradient accumulation needs the store's accumulation block");
}

GradientListener* GradientAccumulation::begin(const MicroBatch& micro) {
  FERRY_ASSERT(micro.count > 1 && micro.index >= 0 && micro.index < micro.count,
               "GradientAccumulation::begin: not a micro-batch of an accumulated update");
  if (micro.index == 0) std::fill(held_.begin(), held_.end(), 0);
  std::fill(written_.begin(), written_.end(), 0);
  micro_ = micro;
  return folder_.get();
}

void GradientAccumulation::fold(std::span<const size_t> params) {
  const auto& entries = store_.params();
  std::vector<size_t> order(params.begin(), params.end());
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return entries[a].offset < entries[b].offset; });
  // Runs of adjacent slices with the same fold, one launch each.
  Fold run_kind = Fold::kNone;
  uint64_t run_begin = 0, run_end = 0;
  const auto flush = [&] {
    if (run_kind != Fold::kNone) launch(run_kind, run_begin, run_end);
    run_kind = Fold::kNone;
  };
  for (size_t p : order) {
    FERRY_ASSERT(!written_[p], "a parameter's gradient was reported twice in one micro-batch");
    written_[p] = 1;
    Fold kind;
    if (!micro_.last()) {
      kind = held_[p] ? Fold::kAddToAcc : Fold::kCopyToAcc;
      held_[p] = 1;
    } else {
      kind = held_[p] ? Fold::kAddToGrad : Fold::kNone;
    }
    const uint64_t begin = entries[p].offset, end = begin + slice_bytes(entries[p]);
    if (kind != run_kind || begin != run_end) {
      flush();
      run_kind = kind;
      run_begin = begin;
    }
    run_end = end;
  }
  flush();
  if (micro_.last()) reduce_.on_gradients(params);
}

void GradientAccumulation::fold_rest() {
  FERRY_ASSERT(micro_.last(), "fold_rest before the update's last micro-batch");
  const auto& entries = store_.params();
  for (size_t p = 0; p < entries.size(); ++p) {
    if (written_[p] || !held_[p]) continue;
    launch(Fold::kCopyToGrad, entries[p].offset, entries[p].offset + slice_bytes(entries[p]));
  }
}

void GradientAccumulation::launch(Fold fold, uint64_t begin, uint64_t end) {
  float* grad = store_.grad_block() + begin / sizeof(float);
  float* acc = store_.accumulation_block() + begin / sizeof(float);
  const uint64_t bytes = end - begin;
  const auto n = static_cast<int64_t>(bytes / sizeof(float));
  Stream& compute = device_.stream(StreamKind::kCompute);
  Kernels& k = device_.kernels();
  switch (fold) {
    case Fold::kCopyToAcc:
      k.launch(CopyDevice{bytes, grad, acc}, compute);
      break;
    case Fold::kAddToAcc:
      k.launch(Accumulate{n, grad, acc}, compute);
      break;
    case Fold::kAddToGrad:
      k.launch(Accumulate{n, acc, grad}, compute);
      break;
    case Fold::kCopyToGrad:
      k.launch(CopyDevice{bytes, acc, grad}, compute);
      break;
    case Fold::kNone:
      return;
  }
  ++launches_;
}

}  // namespace ferry
