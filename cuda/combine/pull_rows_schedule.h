// Who does what, and where, in the whole-row pull combine
// (combine/pull_rows.cuh, pull_reduce_whole_rows): which tokens a producer warp
// walks, which row buffer and barrier phase its k-th step uses, where its
// batch of token slots lives.  Plain C++ shared by the kernel and a host test
// (test/nvlink/test_pull_rows_schedule.cpp) that model-checks the protocol
// on exactly these numbers.
#pragma once

#include <stdint.h>

#include "common/host_device.h"

namespace moe_ep {
namespace kernels {

// The row buffers share one region of shared memory: as many buffers as rows
// of the call's size fit, at most kRowMaxStages (14 buffers of 14 KiB rows,
// 12 of 16 KiB: the pull is bound by how many rows
// each SM has in flight, docs/nvlink_backend.md).
constexpr int kRowMaxStages = 16;            // row buffers per block at most (barriers are sized for it)
constexpr int kRowMaxBytes = 16 * 1024;      // rows up to 16 KiB
constexpr int kRowBufferBytes = 14 * 14336;  // 14 DeepSeek rows (7168 bf16), 12 rows of 16 KiB
constexpr int kRowStageAlign = 128;          // each buffer starts on a 128-byte boundary
constexpr int kRowMaxProducers = 4;
constexpr int kSlotBatchInts = 1024;                 // one slot buffer of each producer, split between the producers
constexpr int kSlotRegionInts = 2 * kSlotBatchInts;  // the block's slot buffers: two per producer
constexpr int kSlotBatchMaxTokens = 64;
static_assert(kRowBufferBytes / (2 * kRowMaxBytes) >= kRowMaxProducers, "every producer has a buffer");

// Bytes of one row's half of a buffer for rows of `row_bytes` (at most kRowMaxBytes).
MOE_EP_HOST_DEVICE int row_stage_bytes(int row_bytes) {
  return (row_bytes + kRowStageAlign - 1) / kRowStageAlign * kRowStageAlign;
}

// Buffers of two rows of `row_bytes` that fit.
MOE_EP_HOST_DEVICE int row_stages_that_fit(int row_bytes) {
  const int fit = kRowBufferBytes / (2 * row_stage_bytes(row_bytes < 1 ? 1 : row_bytes));
  return fit < kRowMaxStages ? fit : kRowMaxStages;
}

struct PullRowsSchedule {
  int producers;  // 1..kRowMaxProducers
  int ring;       // buffers per producer: the available buffers split evenly (the rest unused)

  // What the host asked for, clamped to 1..kRowMaxProducers, over `stages`
  // buffers (kRowMaxProducers..kRowMaxStages).
  MOE_EP_HOST_DEVICE static PullRowsSchedule make(int requested, int stages) {
    PullRowsSchedule s;
    s.producers = requested <= 1 ? 1 : (requested >= kRowMaxProducers ? kRowMaxProducers : requested);
    s.ring = stages / s.producers;
    return s;
  }
  // Buffers in use (ring * producers <= the stages given to make()).
  MOE_EP_HOST_DEVICE int stages() const { return ring * producers; }

  // Producer j's k-th step: its buffer (and barriers), the how-many-th use of
  // that buffer it is, and the parity of the barrier phase that use completes.
  MOE_EP_HOST_DEVICE int stage(int j, uint32_t k) const {
    return j * ring + static_cast<int>(k % static_cast<uint32_t>(ring));
  }
  MOE_EP_HOST_DEVICE uint32_t use(uint32_t k) const { return k / static_cast<uint32_t>(ring); }
  MOE_EP_HOST_DEVICE uint32_t parity(uint32_t k) const { return use(k) & 1u; }

  // The same numbers walked step by step, without a division (the kernel's
  // rings have a run-time size; a division per step sat on the consumers'
  // critical path): start() is step 0 of producer j, next() the step after.
  // test_pull_rows_schedule checks that the k-th position equals stage(j, k)
  // and use(k) for every producer count.
  struct Position {
    int stage;     // stage(j, k)
    uint32_t use;  // use(k)
    MOE_EP_HOST_DEVICE uint32_t parity() const { return use & 1u; }
  };
  MOE_EP_HOST_DEVICE Position start(int j) const { return Position{j * ring, 0u}; }
  MOE_EP_HOST_DEVICE Position next(int j, Position p) const {
    return p.stage + 1 == (j + 1) * ring ? Position{j * ring, p.use + 1} : Position{p.stage + 1, p.use};
  }

  // Tokens of the block's range [t0, t1): token t belongs to producer
  // (t - t0) % producers, which takes them in order: its n-th token is
  // t0 + j + n * producers, for n < tokens_of(j, t0, t1).
  MOE_EP_HOST_DEVICE int producer_of(int32_t t, int32_t t0) const { return static_cast<int>((t - t0) % producers); }
  MOE_EP_HOST_DEVICE int32_t tokens_of(int j, int32_t t0, int32_t t1) const {
    return t1 - t0 > j ? (t1 - t0 - j + producers - 1) / producers : 0;
  }
  MOE_EP_HOST_DEVICE int32_t token(int j, int32_t n, int32_t t0) const { return t0 + j + n * producers; }

  // Producer j's two slot buffers of slot_buffer_ints() ints each (all of
  // them tile kSlotRegionInts), holding slot_batch(world) tokens' slots
  // (world ints per token).
  MOE_EP_HOST_DEVICE int32_t slot_buffer_ints() const { return kSlotBatchInts / producers; }
  MOE_EP_HOST_DEVICE int32_t slot_batch(int world) const {
    const int32_t fits = slot_buffer_ints() / world;
    return fits < kSlotBatchMaxTokens ? fits : kSlotBatchMaxTokens;
  }
  MOE_EP_HOST_DEVICE int32_t slot_buffer_offset(int j, int buffer) const {
    return (2 * j + buffer) * slot_buffer_ints();
  }
};

}  // namespace kernels
}  // namespace moe_ep
