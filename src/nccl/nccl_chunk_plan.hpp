// How the NCCL backend splits one exchange into row ranges, so that its own
// kernels (dispatch's packing, combine's reduction) overlap NCCL's transfer of
// the neighbouring range.  Pure host arithmetic, unit-tested on the CPU.
//
// A segment of tokens_per_rank rows is cut into n = min(chunks, tpr) ranges,
// range c = [c * tpr / n, (c + 1) * tpr / n): balanced (sizes differ by at
// most one row), none empty, in ascending order, covering [0, tpr).  Every
// rank must build the same plan: NCCL matches sends and receives by order.
// (A rank that breaks the contract with another tokens_per_rank still issues
// the same number of NCCL calls while both values are >= chunks, so the
// header check reports it as with one range.)
#pragma once

#include <stdint.h>

namespace moe_ep {

constexpr int32_t kMaxNcclChunks = 16;

struct NcclRowRange {
  int64_t first;  // first row (slot) of every segment this range covers
  int64_t rows;   // rows of every segment, > 0
};

struct NcclChunkPlan {
  int32_t count = 0;  // ranges: min(chunks, tpr), at least 1
  NcclRowRange ranges[kMaxNcclChunks] = {};
};

// chunks is clamped to [1, kMaxNcclChunks]; tpr <= 0 gives one empty range
// [0, 0) so that the callers keep one code path (a zero-row exchange).
NcclChunkPlan plan_nccl_chunks(int32_t tokens_per_rank, int32_t chunks);

// Tokens [begin, end) whose rows have all arrived once ranges 0..i have: a
// token's slot on any rank is at most its own index (rows keep ascending source
// order), so the tokens of range i are complete; the last range also takes
// every token past it.  Empty (begin == end) when num_tokens <= range.first.
struct NcclTokenRange {
  int32_t begin;
  int32_t end;
};
NcclTokenRange nccl_tokens_complete_after(const NcclChunkPlan& plan, int32_t i, int32_t num_tokens);

}  // namespace moe_ep
