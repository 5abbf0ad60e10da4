// The one boundary between the host code (src/nvlink) and the CUDA kernels of
// the NVLINK_TWO_SIDED backend: plain structs of pointers and integers, and
// launch functions that return a cudaError_t.  No templates cross it, so the
// host side compiles as ordinary C++.
//
// Fields under MOE_EP_DIAGNOSTICS exist only in measurement builds (the CMake
// option of that name, which defines it for the kernels and for the host code
// that fills these structs alike).
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

// Plain C++ the host shares with the kernels: the dispatch grid's bound and
// look-back words (the workspace layout), the token shares it picks per call.
#include "dispatch/lookback.h"
#include "dispatch/token_shares.h"

namespace moe_ep {
namespace kernels {

// Largest group the kernels handle: a token's destinations are a 64-bit mask.
constexpr int kMaxWorldSize = 64;

// Threads per block of every kernel (16 warps).
constexpr int kBlockThreads = 512;

// Values of combine_dtype.
enum CombineDtype : int32_t { kCombineBf16 = 0, kCombineFp16 = 1, kCombineFp32 = 2 };

// Phases named in a timeout record.
enum Phase : uint32_t { kPhaseNone = 0, kPhaseDispatch = 1, kPhaseCombine = 2 };

// A source's published row count refused by a receiver: its tokens_per_rank
// differs from the receiver's (runtime_max_tokens_per_rank must be the same on
// every rank of a call), or it claims more rows than tokens_per_rank.  The
// receiver then takes no row from that source.
struct PeerCountError {
  int32_t source;
  int32_t source_tokens_per_rank;
  int32_t source_rows;
  int32_t own_tokens_per_rank;
};

// Written by the kernels in device memory (atomics), read by the host after a
// synchronisation.  The first timeout wins and stays; the input errors (bad
// ids, peers' counts that disagree with this rank's call) accumulate until the
// host reads and clears them (everything from bad_id_count on).
struct DeviceErrors {
  uint32_t timeout_phase;   // Phase of the first timeout, kPhaseNone if none
  int32_t timeout_peer;     // rank that did not answer
  uint32_t bad_id_count;    // picks outside [0, E) that are not the invalid id
  uint32_t peer_count_errors;  // (call, source) pairs whose published counts were refused
  uint64_t bad_id_first;    // min over bad picks of (token*top_k + pick) << 32 | (uint32)id;
                            // UINT64_MAX when none
  PeerCountError first_peer_count_error;  // written by the thread that counted the first
};

// Every block of a kernel adds to a per-source counter at each destination,
// and the weights of one call sum to kArrivalsPerCall whatever the grid size
// (block 0 adds the rest, arrival_weight), so a receiver knows call N is
// complete when the counter reaches N * kArrivalsPerCall, without knowing the
// sender's grid.  Counters only grow: 2^44 calls before a 64-bit counter wraps.
constexpr uint64_t kArrivalsPerCall = uint64_t{1} << 20;

// A split call's ready word (WorkspaceOffsets::dispatch_ready, combine_ready)
// holds this once every peer's blocks have published: the receive half's
// stream wait target.  Fits 32 bits for kMaxWorldSize ranks.
constexpr uint32_t ready_target(int32_t world_size) {
  return static_cast<uint32_t>(world_size - 1) * static_cast<uint32_t>(kArrivalsPerCall);
}

// Buffer slots of a handle (config.micro_batches, docs/overlap.md).
constexpr int kMaxSlots = 2;

// Which part of a call a kernel runs: the fused call, its send half (ends
// once its rows and flags are on their way) or its receive half (waits for
// the peers' flags, then produces the results).
enum CallPart : int32_t { kPartFused = 0, kPartSend = 1, kPartReceive = 2 };

// What a receive half tells the host's watchdog (src/nvlink/receive_watchdog.hpp)
// about its slot, in host-mapped memory: a stream wait has no timeout of its
// own, so the watchdog bounds it without synchronising with the device.
struct ReceiveWatch {
  volatile uint32_t waiting;    // 1 from the receive half's stream write until its kernel has finished
  volatile uint32_t completed;  // receive kernels finished on the slot (wraps)
};

// A copy of the timeout record in host-mapped memory, written with plain
// stores by the thread that won the device-side record, so that the host can
// refuse further calls without synchronising; and the slots' receive watches.
struct HostTimeoutMirror {
  volatile uint32_t timeout_phase;
  volatile int32_t timeout_peer;
  ReceiveWatch watch[kMaxSlots];
};

// Byte offsets of the regions of one rank's workspace.  The layout is the same
// on every rank, so a peer's region is peer_base + offset.
struct WorkspaceOffsets {
  // Written by peers (shared).  Counters and flags only ever grow (epochs),
  // so they are never reset.
  uint64_t dispatch_arrivals;   // [world] uint64, index = source: blocks' release-adds
  uint64_t dispatch_counts_in;  // [world] uint64: the source's tokens_per_rank << 32 | rows it wrote here
  uint64_t expert_counts_in;    // [world][experts_per_rank] int32: the source's picks per local expert
  uint64_t eplb_gathered;       // [world][num_experts] int32 (a dispatch result)
  uint64_t recv_hidden;         // [world*max_tpr][hidden_row_bytes]
  uint64_t recv_scales;         // [world*max_tpr][scale_row_bytes]
  uint64_t recv_ids;            // [world*max_tpr][top_k] int32
  uint64_t recv_weights;        // [world*max_tpr][top_k] fp32
  uint64_t recv_tokens;         // [world*max_tpr] int32: each row's token index on its source, for the
                                // expansion into an expert layout (GroupShape::send_token_index; 0 bytes
                                // in RANK_MAJOR)
  uint64_t combine_arrivals;    // [world] uint64, index = source: blocks' release-adds (serial combine)
  uint64_t combine_started;     // [world] uint64: epoch of the source's running combine
  uint64_t dispatch_ready;      // uint32: the peers' arrival weights of a split dispatch, taken back by
                                // the receive half (its stream wait's word: a fixed target,
                                // (world - 1) * kArrivalsPerCall, whatever the call, so graphs replay it)
  uint64_t combine_ready;       // uint32: the same for a split combine
  uint64_t combine_chunk_flags; // [world][max_tpr] uint64, index = source, phase: push blocks' counter adds
  uint64_t combine_in;          // [(world-1)*max_tpr][combine_partial_bytes]: the push combine's
                                // landing rows (absent with zero_copy_combine unless the combine
                                // wire is FP8, which always pushes)
  uint64_t combine_input;       // [world*max_tpr][combine_row_bytes]: the zero-copy combine input
                                // view (config->zero_copy_combine; 0 bytes otherwise).  Written by
                                // this rank's expert computation, read in place by combine; shared
                                // so that a source rank can pull its rows from every peer's copy.
  // Private to the rank.
  uint64_t peer_bases;          // [world] uint64: where each rank's workspace is mapped here
  uint64_t control;             // ControlBlock
  uint64_t expert_hist;         // [num_experts] int32, zero between calls (large E only)
  uint64_t recv_counts;         // [world] int32 (a dispatch result)
  uint64_t counts_private;      // [world] int32: recv_counts kept for combine
  uint64_t local_expert_counts; // [experts_per_rank] int32 (a dispatch result)
  uint64_t token_slots;         // [max_tpr][world] int32: slot of my token on each rank, -1 = not sent
  uint64_t dispatch_lookback;   // [kMaxDispatchBlocks][world] uint64: each dispatch block's count per
                                // destination, tagged with the call (dispatch/lookback.h)
  uint64_t combine_out;         // [max_tpr][combine_row_bytes] library-owned combine output
  // Expert layouts only (0 bytes in RANK_MAJOR); the expansion's own regions
  // (ExpertRowsOffsets, src/gpu/expert_rows_plan.hpp) follow these.
  uint64_t expert_combine_input;  // [expert_layout_rows][combine_row_bytes]: the zero-copy combine input in
                                  // the expert layout (config->zero_copy_combine), reduced into combine_input
  uint64_t combine_staging;       // [world*max_tpr][combine_row_bytes]: the push combine's rank-major rows,
                                  // reduced from the expert output (without zero_copy_combine)
  // The FP8 dispatch wire only (params->dispatch_wire; 0 bytes otherwise): the
  // caller's rows quantized before the dispatch kernel sends them, and with
  // dispatch_dequantize the received rows back in hidden_dtype.
  uint64_t wire_codes;          // [max_tpr][hidden_row_elems] e4m3fn codes
  uint64_t wire_scales;         // [max_tpr][ceil(hidden_row_elems / 128)] fp32 scales
  uint64_t wire_rows;           // [world*max_tpr][hidden_row_elems] hidden_dtype (dispatch_dequantize)
  // The FP8 combine wire only (params->combine_wire; 0 bytes otherwise): this
  // rank's rank-major expert output quantized before the combine kernel pushes
  // it (and reads its own rows from it).
  uint64_t combine_wire_rows;   // [world*max_tpr][combine_partial_bytes] wire rows (wire_kernels.h)
  uint64_t total_bytes;         // end of the layout
};

// Per-handle device state in the private part of the workspace.
struct ControlBlock {
  uint64_t epoch;  // number of the last dispatch (set by dispatch, read by combine); 0 at create
  uint32_t dispatch_ticket;  // the general dispatch's next logical block index; 0 between calls
  uint32_t lookback_tag;     // the general dispatch's last call tag (dispatch/lookback.h); 0 at create
  uint32_t receives_done;    // receive kernels finished (ReceiveWatch::completed's source)
  uint32_t watchdog_released;  // nonzero: the host's watchdog released a receive half's stream wait
                               // after timeout_ms; waits for the peers then give up at once
  // The active-rank mask as dispatch routes by it: bit r set when rank r is
  // inactive (its experts' picks are dropped), every bit when this rank is
  // (its picks all are).  0 at create: every rank active.  Written by the
  // host between pairs, read by every dispatch, so a captured graph follows it.
  uint64_t masked_ranks;
  // The ranks that take no part in the protocol any more (failure_policy
  // MASK: the survivors dropped them, or this rank is out of the mask and the
  // others are, from its side): bit r set when rank r is absent, never this
  // rank's own bit.  No wait is made for an absent rank, and this rank writes
  // its segments' padding and counts itself.  A subset of masked_ranks; 0 at
  // create.  Written by the host when the survivors resynchronise, with every
  // kernel of the group ended.
  uint64_t absent_ranks;
  DeviceErrors errors;
};

// Everything about the group's shapes the kernels need.
struct GroupShape {
  int32_t rank;
  int32_t world_size;
  int32_t num_experts;
  int32_t experts_per_rank;
  int32_t top_k;
  int32_t invalid_expert_id;
  uint32_t owner_magic;  // owner(id) = id / experts_per_rank by multiply-shift
  uint32_t owner_shift;
  int32_t max_tokens_per_rank;
  int32_t hidden_size;            // elements per combine row
  int32_t combine_dtype;          // CombineDtype
  int32_t eplb_enabled;
  int32_t send_token_index;  // nonzero (expert layouts): dispatch also writes each row's token index
                             // to the destination's recv_tokens
  int64_t hidden_row_bytes;  // of the rows dispatch moves: with an FP8 wire the codes (wire_layout)
  int64_t scale_row_bytes;   // the same: with an FP8 wire the wire's fp32 scales
  int64_t combine_row_bytes;
  // How a combine partial crosses: as a combine_dtype row (combine_wire 0,
  // combine_partial_bytes = combine_row_bytes), or as an FP8 wire row of
  // hidden_size codes and scales (wire_transfer_row_bytes, wire_kernels.h).
  int32_t combine_wire;
  int64_t combine_partial_bytes;
};

// Where this rank's state lives (device pointers) and the wait bound.  With
// several buffer slots each slot is a whole copy of the layout, at its own
// offsets (WorkspaceOffsets of that slot); the mirror is the handle's.
struct HandleState {
  char* local_base;             // this rank's workspace
  HostTimeoutMirror* mirror;    // device pointer of the host-mapped mirror
  int64_t timeout_ns;           // bound of every wait for a peer
  int32_t slot;                 // the buffer slot the offsets describe
};

struct DispatchLaunch {
  int32_t num_tokens;
  int32_t tokens_per_rank;
  const void* hidden;          // [T, hidden_row_bytes]
  const int32_t* topk_ids;     // [T, top_k]
  const float* topk_weights;   // [T, top_k] or NULL: zeros are forwarded
  const void* scales;          // [T, scale_row_bytes] or NULL
  const int32_t* eplb_local;   // [num_experts] or NULL: counted picks are sent
  int32_t num_blocks;          // grid size, at most the SMs the handle may use
  int32_t max_blocks;          // the largest grid of the handle (its SM budget, at most
                               // kMaxDispatchBlocks): the general kernel refreshes the look-back
                               // words of blocks [num_blocks, max_blocks)
  int32_t lookback;            // the general kernel: nonzero: each block routes its own tokens and
                               // looks back for the earlier blocks' counts (dispatch/lookback.h);
                               // zero: each block scans the tokens up to its last; chosen per call and
                               // rank by the host's path selection (src/nvlink/path_selection.hpp)
  int32_t first_block_share;   // the small-batch kernel: block 0's share of the tokens, in
                               // 1/kTokenShareUnit of the others' (small_first_block_share)
  int32_t last_block_share;    // the general kernel: the last block's share of the tokens, in
                               // 1/kTokenShareUnit of the others' (scan_last_block_share after a scan,
                               // the whole unit after a look-back; dispatch/token_shares.h)
  int32_t small_batch;         // nonzero: the small-batch kernel (the host's path selection chose it
                               // for a call of at most kSmallDispatchMaxTokens tokens per rank)
  int32_t pdl;                 // nonzero: Programmatic Dependent Launch (compute capability >= 9.0)
  int32_t bulk_rows;           // nonzero (compute capability >= 9.0): hidden rows go through shared
                               // memory with bulk copies (the host's path selection checked that rows
                               // and source are 16-byte aligned); zero: through registers
  int32_t part;                // CallPart: kPartFused, or kPartSend (no wait; launch_dispatch_receive
                               // then waits and counts, with the same lookback and small_batch)
  int32_t quantize;            // nonzero: the FP8 dispatch wire encoded in the send loop (the host's path
                               // selection checked that `hidden` is 16-byte aligned and the shape's code
                               // rows a multiple of 16 bytes); `hidden` is then the caller's rows of
                               // quantize_dtype, quantize_row_bytes apart, the shape's rows and scales
                               // the wire's, and `scales` unused
  int32_t quantize_dtype;      // CombineDtype of those rows: bf16, fp16 or fp32
  int32_t quantize_rule;       // WireScaleRule (wire_kernels.h)
  int64_t quantize_row_bytes;
#ifdef MOE_EP_DIAGNOSTICS
  int32_t diagnostic;  // hidden rows not written to this rank (1) or to the peers (2), for timing
                       // (wrong results); 4: per-block phase times (MOE_EP_DISPATCH_DIAGNOSTIC)
#endif
};

// Small calls may run the small-batch kernels: the same protocol, counters
// and results as the general kernels, with a shorter chain of dependent steps
// (docs/nvlink_backend.md).  Each rank chooses by itself, up to the bounds
// below (MOE_EP_SMALL_BATCH=0 turns them off): nothing a peer sees differs.
//
// The small-batch dispatch kernel routes every token in one round of one
// token per thread, so it can take calls of up to kBlockThreads tokens per
// rank; where below that it takes over from the general kernel is the host's
// choice (MOE_EP_SMALL_DISPATCH_TOKENS, src/nvlink/path_selection.hpp).
constexpr int32_t kSmallDispatchMaxTokens = kBlockThreads;
// The small-batch combine kernel's bound: any size works (its push items are
// (peer, slot, segment) over tokens_per_rank, strided over the grid's warps);
// this is the range that is tested, and the host chooses below it
// (MOE_EP_SMALL_COMBINE_TOKENS).
constexpr int32_t kSmallCombineMaxTokens = 512;

// How combine schedules its reduction.
enum CombineSchedule : int32_t {
  // Every block pushes its share of rows, counts in at every peer, waits for
  // every peer, then reduces its share of tokens.
  kCombineSerial = 0,
  // Push blocks and reduce blocks at once: the rows go back in a few phases
  // (slot ranges), every push block counts in per phase at every peer, and a
  // token is reduced as soon as the phases holding its rows have landed.
  kCombineOverlapped = 1,
  // Overlapped for large calls on many SMs, serial otherwise
  // (resolve_combine_schedule, from group-wide values: every rank of a call
  // runs the same schedule).  Both schedules advance every counter either
  // one waits for, so consecutive calls may use different schedules.
  kCombineAuto = 2
};

// Auto picks the overlapped schedule from this smallest SM budget in the group
// and this many tokens per rank.
constexpr int32_t kOverlapMinBlocks = 64;
constexpr int32_t kOverlapMinTokens = 1024;

// Publication phases of the overlapped schedule when CombineLaunch::phases is 0.
constexpr int32_t kDefaultCombinePhases = 16;

// The whole-row pull takes rows of at most this many bytes, with at most
// kPullMaxProducers producer warps per block (combine/pull_rows_schedule.h).
constexpr int32_t kPullRowMaxBytes = 16 * 1024;
constexpr int32_t kPullMaxProducers = 4;

struct CombineLaunch {
  int32_t num_tokens;
  int32_t tokens_per_rank;
  const void* expert_output;   // [world*tpr, combine_row_bytes]
  void* output;                // [T, combine_row_bytes]
  int32_t num_blocks;
  int32_t schedule;            // CombineSchedule, resolved (never kCombineAuto); the same on every rank
  int32_t phases;              // overlapped: publication phases (same on every rank), 0 = default
  int32_t reduce_blocks;       // overlapped: blocks that reduce, 0 = 5/11 of the grid
  int32_t small_batch;         // nonzero: the small-batch kernel (the host's path selection chose it
                               // for a serial schedule of at most kSmallCombineMaxTokens tokens per rank)
  int32_t pull;                // nonzero: zero-copy pull (config.zero_copy_combine, the same on every
                               // rank): every rank's expert output is in its combine_input view when
                               // its combine starts, and each source reads its rows from the peers'
                               // views; expert_output is then only read for this rank's own rows.
                               // schedule, phases, reduce_blocks and small_batch are ignored.
  int32_t pull_rows;           // pull only: whole-row bulk copies, warp-specialised (rows of at most
                               // kPullRowMaxBytes, 16-byte aligned; MOE_EP_PULL_ROWS)
  int32_t pull_copy_bytes;     // pull_rows only: each row is brought in copies of at most this many
                               // bytes (a multiple of 16, 16..kPullRowMaxBytes)
  int32_t pull_producers;      // pull_rows only: producer warps per block, each with its own ring of
                               // row buffers (1..4; MOE_EP_PULL_PRODUCERS)
  int32_t pull_registers;      // pull only: load the partials into registers instead of bulk copies
                               // into shared memory (the path where bulk copies are not available)
#ifdef MOE_EP_DIAGNOSTICS
  int32_t pull_diagnostic;  // pull_rows only: parts of the kernel switched off for timing
                            // (MOE_EP_PULL_DIAGNOSTIC; wrong results)
#endif
  int32_t pdl;                 // nonzero: Programmatic Dependent Launch (compute capability >= 9.0)
  int32_t part;                // CallPart: fused, send (push or announce, publish, end) or receive
                               // (wait, reduce); split calls run the serial schedule or the pull
};

// Publication phases of the overlapped combine (one counter each per source)
// and rows per phase: functions of group-wide values only, since sender and
// receiver must agree; the number of phases is the same in every call.
int32_t combine_phases(const GroupShape& shape, int32_t requested);
// The schedule a call runs (kCombineAuto resolved), from group-wide values:
// the smallest SM budget of the group (agreed at create).
int32_t resolve_combine_schedule(int32_t requested, int32_t world_size, int32_t tokens_per_rank,
                                 int32_t group_min_sm_budget);
int32_t combine_phase_rows(int32_t tokens_per_rank, int32_t phases);

// Multiply-shift constants for unsigned division by `divisor` (>= 1), exact
// for every 32-bit numerator: q = (umulhi(n, magic) + n) >> shift.
void division_magic(uint32_t divisor, uint32_t* magic, uint32_t* shift);

// Lowest compute capability (major*10+minor) the kernels were compiled for.
int32_t lowest_compiled_arch();

// Blocks to launch for a dispatch or combine of this size on `sm_budget` SMs.
int32_t dispatch_blocks(const GroupShape& shape, int32_t num_tokens, int32_t tokens_per_rank,
                        int32_t sm_budget);
int32_t combine_blocks(const GroupShape& shape, int32_t num_tokens, int32_t tokens_per_rank,
                       int32_t sm_budget);
// The pull path (CombineLaunch::pull) only reduces this rank's tokens.
int32_t combine_pull_blocks(int32_t num_tokens, int32_t sm_budget);

cudaError_t launch_dispatch(const GroupShape& shape, const WorkspaceOffsets& offsets,
                            const HandleState& state, const DispatchLaunch& args,
                            cudaStream_t stream);
// The receive half of a split dispatch (args.part == kPartSend was launched
// before it on the slot): one block waits for every rank's arrivals and
// writes the counts.  Reads num_tokens, tokens_per_rank, lookback and small_batch.
cudaError_t launch_dispatch_receive(const GroupShape& shape, const WorkspaceOffsets& offsets, const HandleState& state,
                                    const DispatchLaunch& args, cudaStream_t stream);
// At create, outside any stream capture: lets the bulk-copy dispatch kernels
// (bulk_rows nonzero) and the quantizing ones (quantize nonzero) use their
// shared memory on the current device.
cudaError_t prepare_dispatch(int32_t bulk_rows, int32_t quantize);
cudaError_t launch_combine(const GroupShape& shape, const WorkspaceOffsets& offsets,
                           const HandleState& state, const CombineLaunch& args,
                           cudaStream_t stream);

}  // namespace kernels
}  // namespace moe_ep
