// The per-step bookkeeping of gradient buckets: marks, in-order launches, the final ordering.
#include "comm/buckets.h"

#include <algorithm>

#include <fmt/format.h>

#include "comm/backends.h"
#include "common/error.h"

namespace ferry {

GradientBuckets::GradientBuckets(Communicator& comm, Device& device, float* grad_block,
                                 std::vector<GradSlice> params, BucketOptions options)
    : comm_(comm),
      device_(device),
      block_(grad_block),
      params_(std::move(params)),
      options_(std::move(options)) {
  buckets_ = assign_buckets(params_, options_.order, options_.bucket_bytes);
  bucket_of_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t p : buckets_[b].params) bucket_of_[p] = b;
  }
  if (options_.wire_dtype != DType::kF32 && options_.reduce) {
    throw UnsupportedError(
        fmt::format("comm.dtype: {} all-reduces, but these buckets reduce-scatter (memory.zero 1 "
                    "or 2), which runs in fp32 only",
                    dtype_name(options_.wire_dtype)),
        "set comm.dtype=fp32, or memory.zero=0");
  }
  FERRY_ASSERT(options_.wire_dtype == DType::kF32 || options_.wire_dtype == DType::kBF16,
               "a bucket's wire dtype is fp32 or bf16");
  if (options_.writes_per_param.empty()) {
    expected_.assign(params_.size(), 1);
  } else {
    FERRY_ASSERT(options_.writes_per_param.size() == params_.size(),
                 "writes_per_param must have one entry per parameter");
    expected_ = options_.writes_per_param;
  }
  reset();
}

void GradientBuckets::reset() {
  for (const auto& works : works_) {
    in_flight_.insert(in_flight_.end(), works.begin(), works.end());
  }
  std::erase_if(in_flight_, [](const CommWork& w) {
    if (!w.ready()) return false;
    w.wait();  // complete: does not block, rethrows its failure
    return true;
  });
  marks_.assign(params_.size(), 0);
  pending_.assign(buckets_.size(), 0);
  for (size_t p = 0; p < params_.size(); ++p) {
    if (expected_[p] > 0) ++pending_[bucket_of_[p]];
  }
  works_.assign(buckets_.size(), {});
  launch_ns_.assign(buckets_.size(), 0);
  next_ = 0;
  finished_ = false;
}

void GradientBuckets::mark_ready(size_t param) {
  FERRY_ASSERT(param < params_.size(), fmt::format("mark_ready: no parameter {}", param));
  FERRY_ASSERT(!finished_, "mark_ready after finish(): call reset() before the next step");
  const int marks = ++marks_[param];
  FERRY_ASSERT(marks <= expected_[param],
               fmt::format("parameter {}'s gradient was written {} times in one step, expected {} "
                           "(set BucketOptions::writes_per_param)",
                           param, marks, expected_[param]));
  if (marks == expected_[param]) {
    --pending_[bucket_of_[param]];
    if (options_.overlap) launch_ready();
  }
}

void GradientBuckets::mark_ready(std::span<const size_t> params) {
  for (size_t p : params) mark_ready(p);
}

void GradientBuckets::launch_ready() {
  Stream& compute = device_.stream(StreamKind::kCompute);
  while (next_ < buckets_.size() && pending_[next_] == 0) {
    launch(next_++, compute);
    ++overlapped_;
  }
}

void GradientBuckets::launch(size_t bucket, Stream& after) {
  launch_ns_[bucket] = detail::now_ns();
  for (const ByteRange& r : buckets_[bucket].ranges) {
    const auto offset = static_cast<int64_t>(r.offset / sizeof(float));
    const auto count = static_cast<int64_t>(r.bytes / sizeof(float));
    if (options_.reduce) {
      works_[bucket].push_back(options_.reduce(block_, offset, count, after));
    } else if (options_.wire_dtype == DType::kBF16) {
      works_[bucket].push_back(comm_.all_reduce_mean_bf16(block_ + offset, count, after));
    } else {
      works_[bucket].push_back(comm_.all_reduce_mean(block_ + offset, count, after));
    }
    ++collectives_;
  }
}

void GradientBuckets::finish(Stream& compute) {
  FERRY_ASSERT(!finished_, "finish() called twice in one step: call reset() between steps");
  while (next_ < buckets_.size()) launch(next_++, compute);
  for (const auto& works : works_) {
    for (const CommWork& w : works) w.order_before(compute);
  }
  finished_ = true;
  ++reductions_;
}

uint64_t GradientBuckets::wire_bytes(uint64_t fp32_bytes) const {
  return fp32_bytes / sizeof(float) * dtype_size(options_.wire_dtype);
}

std::vector<BucketSpan> GradientBuckets::spans() const {
  std::vector<BucketSpan> out;
  for (size_t b = 0; b < next_; ++b) {
    if (works_[b].empty()) continue;
    BucketSpan s{b, wire_bytes(buckets_[b].bytes), launch_ns_[b], INT64_MAX, INT64_MIN};
    bool measured = true;
    for (const CommWork& w : works_[b]) {
      w.wait();
      const auto span = w.span();
      if (!span) {
        measured = false;
        break;
      }
      s.start_ns = std::min(s.start_ns, span->start_ns);
      s.end_ns = std::max(s.end_ns, span->end_ns);
    }
    if (measured) out.push_back(s);
  }
  return out;
}

}  // namespace ferry
