// comm.dtype bf16 on the host: fp32 gradients narrowed into a bf16 wire buffer, bf16 sums of two
// wire buffers, and the widened mean. Invariant: every step is elementwise and deterministic, so
// every rank that combines the same words gets the same bits (Note [A bf16 all-reduce]).
#pragma once

#include <cstdint>

namespace ferry {

// Note [A bf16 all-reduce]
// comm.dtype: bf16 all-reduces each gradient bucket in bf16, as NCCL's ncclBfloat16 sum and
// PyTorch DDP's bf16_compress_hook do:
//  1. narrow: each rank rounds its fp32 gradient to bf16, to nearest even (device/bf16.h's
//     float_to_bf16), into a wire buffer of 2 bytes an element: half the bytes of fp32;
//  2. sum: MPI has no bf16 type, so the MPI backend all-reduces the 16-bit words with a user
//     MPI_Op (commutative) whose combine widens both operands to fp32, adds, and rounds the sum
//     to bf16 once (sum_bf16). NCCL does the same with ncclBfloat16. We chose this over
//     all-reducing fp32-summed chunks because only it keeps every byte on the wire bf16;
//  3. widen: the bf16 sum is widened (exact) into the fp32 gradient and divided by the rank count
//     in fp32 (exact for a power of two), so the optimizer reads fp32 as before.
// The rounding users get, with b_i = bf16(x_i) and u = 2^-8 (bf16's unit roundoff):
//  - narrowing: |b_i - x_i| <= u |x_i|;
//  - summing n ranks takes n - 1 combines, each one rounding (the fp32 add of two bf16 values may
//    round too, at 2^-24, before the bf16 rounding), so |S - sum b_i| <= ((1 + u')^(n-1) - 1) *
//    sum |b_i| with u' = u + 2^-23; which pairs combine first is MPI's algorithm's choice, but
//    every rank receives the same bits (each partial sum is computed once, or by a commutative
//    combine of the same two operands);
//  - 2 ranks: one combine, so the mean is exactly bf16(b_0 + b_1) / 2, on every rank.
// With one rank nothing crosses a wire, so nothing is narrowed: the gradient stays fp32 (the
// local communicator). The wire buffer is the communicator's own (the largest bucket at 2 bytes an
// element: 12.5 MiB at comm.bucket_mb 25), outside the planned device memory, as MPI's and NCCL's
// own buffers are.

// w[i] = bf16(x[i]), round to nearest even, for i < n.
void narrow_to_bf16(const float* x, uint16_t* w, int64_t n);

// inout[i] = bf16(float(in[i]) + float(inout[i])): one pairwise combine of the bf16 sum.
void sum_bf16(const uint16_t* in, uint16_t* inout, int64_t n);

// x[i] = float(w[i]) / ranks, in fp32: the mean from the bf16 sum.
void widen_mean(const uint16_t* w, float* x, int64_t n, int ranks);

// x[i] = x[i] / ranks in fp32, as every backend divides a sum (times 1/ranks when ranks is a power
// of two, which is exact and cheaper).
void divide_by_ranks(float* x, int64_t n, int ranks);

}  // namespace ferry
