// The NVLINK_TWO_SIDED backend: a shared workspace (shared_memory.cpp), the
// kernels behind cuda/moe_ep_kernels.h, and the host bookkeeping around them:
// no host synchronisation in dispatch or combine, errors found on the device
// reported by poll_async_error, a destroy that never waits for a peer.
#include "nvlink/nvlink_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "bounded_exchange.hpp"
#include "collective_step.hpp"
#include "common/cuda_check.hpp"
#include "common/log.hpp"
#include "common/tuning_registry.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "expert_layout_kernels.h"
#include "gpu/device_copy.hpp"
#include "gpu/expert_rows_plan.hpp"
#include "gpu/own_work.hpp"
#include "gpu/peer_segments_copy.hpp"
#include "gpu/routing_mask.hpp"
#include "gpu/wire_rows_plan.hpp"
#include "input_errors.hpp"
#include "mask_agreement.hpp"
#include "moe_ep_kernels.h"
#include "nvlink/driver_api.hpp"
#include "nvlink/mirror_pool.hpp"
#include "nvlink/path_selection.hpp"
#include "nvlink/receive_watchdog.hpp"
#include "nvlink/rejoin_plan.hpp"
#include "nvlink/shared_memory.hpp"
#include "nvlink/workspace_plan.hpp"
#include "store/rank_failure.hpp"
#include "wire_kernels.h"

namespace moe_ep {

static_assert(kMaxMicroBatches <= kernels::kMaxSlots, "every slot has its receive watch in the mirror");
static_assert(kernels::kCombineSerial == 0 && kernels::kCombineOverlapped == 1 && kernels::kCombineAuto == 2,
              "MOE_EP_COMBINE_SCHEDULE's words are serial|overlapped|auto, in the order of CombineSchedule");
static_assert(int32_t{kernels::kWireScaleFp32} == int32_t{MOE_EP_WIRE_SCALE_FP32} &&
                  int32_t{kernels::kWireScaleUe8m0} == int32_t{MOE_EP_WIRE_SCALE_UE8M0},
              "params->wire_scale is passed to the wire kernels as it is");

namespace {

// The whole-row pull brings each row in one bulk copy (smaller copies only
// add copies per row).
constexpr int32_t kPullCopyBytes = 16384;

// Milliseconds per named step, for the destroy log line.
class TeardownClock {
 public:
  void step(const char* name) noexcept {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
    try {
      if (!summary_.empty()) summary_ += ", ";
      summary_ += std::string(name) + " " + std::to_string(ms) + " ms";
    } catch (...) {  // a log line is not worth failing a teardown for
    }
  }
  const std::string& summary() const { return summary_; }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::string summary_;
};

std::string phase_name(uint32_t phase) {
  return phase == kernels::kPhaseCombine ? "combine" : "dispatch";
}

class NvlinkBackend final : public Backend {
 public:
  // Exception-safe for every exception type: the local steps run under
  // run_then_agree (a failure on one rank fails create on every rank instead
  // of leaving the peers waiting), and whatever was acquired is released here
  // (the destructor does not run for a constructor that throws).
  NvlinkBackend(const Layout& layout, const moe_ep_config_t& config, const Bootstrap& bootstrap, NvlinkMasking masking)
      : layout_(layout), config_(config), bootstrap_(bootstrap), masking_(std::move(masking)) {
    if (masking_.store) active_ = masking_.store->membership().active;
    try {
      join_group(bootstrap);
    } catch (...) {
      shutdown();
      throw;
    }
  }

  // A replacement process for a rank the group masked (config->rejoin):
  // joins through the store as the survivors admit it (rejoin_group).
  NvlinkBackend(const Layout& layout, const moe_ep_config_t& config, NvlinkMasking masking)
      : layout_(layout), config_(config), masking_(std::move(masking)) {
    active_ = masking_.store->membership().active;
    try {
      rejoin_group();
    } catch (...) {
      shutdown();
      throw;
    }
  }

  ~NvlinkBackend() override { shutdown(); }

  void join_group(const Bootstrap& bootstrap) {
    run_then_agree(bootstrap, [&] { prepare_locally(); });
    // Every rank of a call runs the same combine schedule with the same
    // number of phases; auto decides from the group's smallest SM budget.
    check_same_on_every_rank(bootstrap, {{"MOE_EP_COMBINE_SCHEDULE / MOE_EP_COMBINE_PHASES",
                                          paths_.combine_schedule + 4 * combine_phases_}});
    const std::vector<int32_t> budgets = bootstrap.allgather_value(static_cast<int32_t>(sm_budget_));
    for (int32_t r = 0; r < bootstrap.world_size(); ++r) {
      group_min_sm_budget_ = r == 0 || budgets[r] < group_min_sm_budget_ ? budgets[r] : group_min_sm_budget_;
    }
    {
      const DeviceGuard guard(device_);
      memory_ =
          std::make_unique<SharedMemory>(bootstrap, device_, slots_total_bytes(offsets_, slots_), config_.timeout_ms);
    }
    // No peer writes here before this rank is ready.
    run_then_agree(bootstrap, [&] { initialise_workspace(0, 0); });
    log_settings();
  }

  // The newcomer's side of an admission (the survivors': change_mask):
  // the mask change through the store, the settings check, the memory
  // exchange among the ranks active after it, this rank's workspace under the
  // new mask, and the meeting that ends the survivors' reset.  Any failure
  // fails create; the survivors then drop this rank again.
  void rejoin_group() {
    prepare_locally();
    StoreExchange& store = *masking_.store;
    const std::vector<uint8_t> before = active_;
    std::vector<uint8_t> proposed = before;
    proposed[static_cast<size_t>(layout_.rank)] = 1;
    const MembershipState now{before, 0, store.membership().epoch};
    const MembershipState next = change_membership(store, now, proposed, MOE_EP_SUCCESS, "", masking_.fingerprint);
    const HandlePeers peers = rejoin_peers(before, next.active);
    group_min_sm_budget_ = agree_on_rejoin_settings(store, peers, rejoin_settings());
    {
      const DeviceGuard guard(device_);
      memory_ = std::make_unique<SharedMemory>(store, device_, slots_total_bytes(offsets_, slots_), config_.timeout_ms,
                                               peers);
    }
    initialise_workspace(masked_ranks(next.active, layout_.rank), absent_ranks(next.active, layout_.rank));
    meet_after_reset();
    set_mask(next.active, next.mask_epoch);
    log_settings();
  }

  RejoinSettings rejoin_settings() const {
    RejoinSettings s;
    s.combine_schedule = paths_.combine_schedule + 4 * combine_phases_;
    s.group_min_sm_budget = group_min_sm_budget_;
    s.sm_budget = sm_budget_;
    return s;
  }

  void log_settings() const {
    log_info(
        "rank ", layout_.rank, ": NVLINK_TWO_SIDED on device ", device_, ", ", sm_budget_, " of ", sm_count_,
        " SMs, workspace ", memory_->size(), " bytes (", slots_total_bytes(offsets_, slots_), " used, ", slots_,
        " slot", slots_ > 1 ? "s" : "", "), timeout ", config_.timeout_ms, " ms, combine schedule ",
        paths_.combine_schedule == kernels::kCombineOverlapped ? "overlapped"
        : paths_.combine_schedule == kernels::kCombineAuto     ? "auto"
                                                               : "serial",
        ", small-batch kernels ", paths_.small_batch ? "on" : "off", " (dispatch to ", paths_.small_dispatch_tokens,
        " tokens, combine to ", paths_.small_combine_tokens, "), PDL ", paths_.pdl ? "on" : "off", ", dispatch rows ",
        paths_.dispatch_bulk ? "bulk copies" : "registers", ", dispatch routing ",
        !paths_.dispatch_lookback.has_value() ? "auto"
        : *paths_.dispatch_lookback           ? "look-back"
                                              : "scan",
        layout_.fp8_dispatch()
            ? (layout_.dispatch_dequantize ? ", dispatch wire FP8 (dequantized on receipt)" : ", dispatch wire FP8")
            : "");
  }

  const char* name() const override { return "nvlink_two_sided"; }
  moe_ep_device_t device() const override { return moe_ep_device_t{MOE_EP_DEVICE_CUDA, device_}; }

  DispatchBuffers dispatch(const DispatchCall& call, void* stream) override {
    check_in_step();
    const DeviceGuard guard(device_);
    int32_t path = 0;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    const kernels::DispatchLaunch a = dispatch_launch(0, call, kernels::kPartFused, s, &path);
    check_cuda(kernels::launch_dispatch(shape_, offsets_, slot_state(0), a, s), "launching the dispatch kernel");
    split_[0].has_weights = call.has_weights;  // the expert layouts' combine reads it too
    dequantize_received(0, call.tokens_per_rank, s);
    expand_to_expert_rows(0, call.tokens_per_rank, call.has_weights, s);
    note_launch(0, s);
    paths.note(MOE_EP_PHASE_DISPATCH, path, layout_.rank);
    return dispatch_buffers(0, call.has_weights);
  }

  void* combine(const CombineCall& call, void* stream) override {
    check_in_step();
    const DeviceGuard guard(device_);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    int32_t path = 0;
    const CombineCall rank_major = quantize_for_combine_wire(0, fold_expert_rows(0, call, s), s);
    kernels::CombineLaunch a = combine_launch(0, rank_major, call.output, /*split=*/false, &path);
    a.part = kernels::kPartFused;
    if (a.pull && !rank_major.expert_output_is_workspace) copy_into_view(0, rank_major, s);
    check_cuda(kernels::launch_combine(shape_, offsets_, slot_state(0), a, s), "launching the combine kernel");
    note_launch(0, s);
    paths.note(MOE_EP_PHASE_COMBINE, path, layout_.rank);
    return a.output;
  }

  // ---- The split phases (docs/overlap.md, "NVLink backend") ----

  bool split_phases() const override { return true; }
  // The fused calls are one kernel each; the halves two, and a stream wait.
  bool fused_calls_are_faster() const override { return true; }

  void dispatch_send(int32_t slot, const DispatchCall& call, void* stream) override {
    check_in_step();
    const DeviceGuard guard(device_);
    SplitSlot& k = split_.at(static_cast<size_t>(slot));
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    k.dispatch = dispatch_launch(slot, call, kernels::kPartSend, s, &k.dispatch_path);
    k.has_weights = call.has_weights;
    check_cuda(kernels::launch_dispatch(shape_, slot_offsets_[slot], slot_state(slot), k.dispatch, s),
               "launching the dispatch send kernel");
    note_launch(slot, s);
  }

  DispatchBuffers dispatch_recv(int32_t slot, void* stream) override {
    check_in_step();
    const DeviceGuard guard(device_);
    SplitSlot& k = split_.at(static_cast<size_t>(slot));
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    kernels::DispatchLaunch a = k.dispatch;
    a.pdl = wait_for_ready(slot, slot_offsets_[slot].dispatch_ready, s) ? 0 : a.pdl;
    check_cuda(kernels::launch_dispatch_receive(shape_, slot_offsets_[slot], slot_state(slot), a, s),
               "launching the dispatch receive kernel");
    dequantize_received(slot, a.tokens_per_rank, s);
    expand_to_expert_rows(slot, a.tokens_per_rank, k.has_weights, s);
    note_launch(slot, s);
    paths.note(MOE_EP_PHASE_DISPATCH, k.dispatch_path, layout_.rank);
    return dispatch_buffers(slot, k.has_weights);
  }

  void combine_send(int32_t slot, const CombineCall& call, void* stream) override {
    check_in_step();
    const DeviceGuard guard(device_);
    SplitSlot& k = split_.at(static_cast<size_t>(slot));
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    k.combine_call = quantize_for_combine_wire(slot, fold_expert_rows(slot, call, s), s);
    // The pull variant depends on the output, known only to the receive
    // half; every pull path's send half is the same announcement.
    int32_t path = 0;
    kernels::CombineLaunch a = combine_launch(slot, k.combine_call, nullptr, /*split=*/true, &path);
    a.part = kernels::kPartSend;
    if (a.pull && !k.combine_call.expert_output_is_workspace) copy_into_view(slot, k.combine_call, s);
    check_cuda(kernels::launch_combine(shape_, slot_offsets_[slot], slot_state(slot), a, s),
               "launching the combine send kernel");
    note_launch(slot, s);
  }

  void* combine_recv(int32_t slot, void* output, void* stream) override {
    check_in_step();
    const DeviceGuard guard(device_);
    SplitSlot& k = split_.at(static_cast<size_t>(slot));
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    int32_t path = 0;
    kernels::CombineLaunch a = combine_launch(slot, k.combine_call, output, /*split=*/true, &path);
    a.part = kernels::kPartReceive;
    a.pdl = wait_for_ready(slot, slot_offsets_[slot].combine_ready, s) ? 0 : a.pdl;
    check_cuda(kernels::launch_combine(shape_, slot_offsets_[slot], slot_state(slot), a, s),
               "launching the combine receive kernel");
    note_launch(slot, s);
    paths.note(MOE_EP_PHASE_COMBINE, path, layout_.rank);
    return a.output;
  }

  // ---- The FP8 dispatch wire (docs/nvlink_backend.md, "The FP8 dispatch wire") ----

  // Before the dispatch kernel, on the same stream, where its path does not
  // encode the rows in the send loop: the caller's [T, R] rows quantized into
  // the slot's private codes and scales, and the call the dispatch kernels
  // then send (AS_IS: `call` as it is).
  DispatchCall quantize_for_wire(int32_t slot, const DispatchCall& call, cudaStream_t s) {
    if (!layout_.fp8_dispatch()) return call;
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* base = memory_->local();
    const kernels::WireQuantizeRows q =
        dispatch_quantize_rows(layout_, call.hidden, reinterpret_cast<uint8_t*>(base + o.wire_codes),
                               reinterpret_cast<float*>(base + o.wire_scales));
    kernels::WireRowSet rows{};
    rows.rows = call.num_tokens;
    check_cuda(kernels::launch_quantize_rows(q, rows, sm_budget_, paths_.pdl ? 1 : 0, s),
               "launching the FP8 wire's quantization of the dispatch rows");
    DispatchCall wire = call;
    wire.hidden = q.codes;
    wire.scales = q.scales;
    return wire;
  }

  // After the receive, on the same stream, with dispatch_dequantize: the
  // slot's received codes of the rank-major rows that arrived (the device
  // counts) back in hidden_dtype, in the slot's private result rows.
  void dequantize_received(int32_t slot, int32_t tokens_per_rank, cudaStream_t s) {
    if (!layout_.fp8_dispatch() || !layout_.dispatch_dequantize) return;
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* base = memory_->local();
    check_cuda(kernels::launch_dequantize_rows(
                   dispatch_dequantize_rows(layout_, base + o.recv_hidden, base + o.recv_scales, base + o.wire_rows),
                   received_row_set(reinterpret_cast<const int32_t*>(base + o.counts_private), layout_.world_size,
                                    tokens_per_rank),
                   sm_budget_, paths_.pdl ? 1 : 0, s),
               "launching the FP8 wire's dequantization of the received rows");
  }

  // Before the combine kernel, on the same stream, with an FP8 combine wire:
  // the rank-major rows this rank received (the device counts), its own
  // included, quantized into the slot's wire rows, which the push kernels
  // send and read; the call then names them (AS_IS: `call` as it is).
  CombineCall quantize_for_combine_wire(int32_t slot, const CombineCall& call, cudaStream_t s) {
    if (!layout_.fp8_combine()) return call;
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* base = memory_->local();
    const kernels::WireQuantizeRows q = combine_quantize_rows(layout_, call.expert_output, base + o.combine_wire_rows);
    check_cuda(kernels::launch_quantize_rows(q,
                                             received_row_set(reinterpret_cast<const int32_t*>(base + o.counts_private),
                                                              layout_.world_size, call.tokens_per_rank),
                                             sm_budget_, paths_.pdl ? 1 : 0, s),
               "launching the FP8 wire's quantization of the combine rows");
    CombineCall wire = call;
    wire.expert_output = q.codes;
    wire.expert_output_is_workspace = true;
    return wire;
  }

  // Where the slot's rank-major result rows and scales are: the received rows
  // (with an FP8 wire its codes and scales), or with dispatch_dequantize the
  // rows dequantized from them (no scales).
  struct ReceivedRows {
    void* hidden;
    void* scales;
  };
  ReceivedRows received_rows(int32_t slot) const {
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* base = memory_->local();
    if (layout_.fp8_dispatch() && layout_.dispatch_dequantize) return {base + o.wire_rows, nullptr};
    return {base + o.recv_hidden, shape_.scale_row_bytes ? base + o.recv_scales : nullptr};
  }

  // ---- The expert layouts (docs/nvlink_backend.md, "Expert layouts") ----

  // The slot's rank-major receive as the dispatch kernels left it (FP8 wire:
  // as received_rows has it).
  kernels::RankMajorReceive rank_major_receive(int32_t slot, int32_t tokens_per_rank, bool has_weights) const {
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* base = memory_->local();
    kernels::RankMajorReceive r{};
    r.tokens_per_rank = tokens_per_rank;
    const ReceivedRows rows = received_rows(slot);
    r.hidden = rows.hidden;
    r.scales = rows.scales;
    r.ids = reinterpret_cast<const int32_t*>(base + o.recv_ids);
    r.weights = has_weights ? reinterpret_cast<const float*>(base + o.recv_weights) : nullptr;  // NULL: weight 1
    r.recv_counts = reinterpret_cast<const int32_t*>(base + o.counts_private);
    r.source_tokens = reinterpret_cast<const int32_t*>(base + o.recv_tokens);
    return r;
  }

  kernels::ExpertRowsBuffers expert_rows(int32_t slot) const {
    return expert_rows_buffers(layout_, memory_->local(), slot_expert_rows_[slot]);
  }

  // After the rank-major receive, on the same stream: the slot's expert rows
  // (nothing in RANK_MAJOR).  Runs once every row has landed, so it does
  // not overlap the transfer.
  void expand_to_expert_rows(int32_t slot, int32_t tokens_per_rank, bool has_weights, cudaStream_t s) {
    if (!layout_.expert_layout()) return;
    check_cuda(
        kernels::launch_expand_to_expert_rows(expert_shape_, rank_major_receive(slot, tokens_per_rank, has_weights),
                                              expert_rows(slot), sm_budget_, paths_.pdl ? 1 : 0, s),
        "launching the expansion into expert rows");
  }

  // Before a combine in an expert layout, on the same stream: the weighted
  // reduction of the caller's expert rows into one rank-major row per
  // received token, and the call the rank-major combine kernels then run.
  // With zero_copy_combine the rows go to the shared combine_input view,
  // which the peers pull from; otherwise to the slot's staging rows, which
  // the push combine sends.  RANK_MAJOR: `call` as it is.
  CombineCall fold_expert_rows(int32_t slot, const CombineCall& call, cudaStream_t s) {
    if (!layout_.expert_layout()) return call;
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* rows = memory_->local() + (layout_.zero_copy_combine ? o.combine_input : o.combine_staging);
    const bool has_weights = split_.at(static_cast<size_t>(slot)).has_weights;
    check_cuda(kernels::launch_reduce_expert_rows(
                   expert_shape_, rank_major_receive(slot, call.tokens_per_rank, has_weights), expert_rows(slot),
                   call.expert_output, rows, sm_budget_, paths_.pdl ? 1 : 0, s),
               "launching the reduction of the expert rows");
    CombineCall rank_major = call;
    rank_major.expert_output = rows;
    rank_major.expert_output_is_workspace = layout_.zero_copy_combine;
    return rank_major;
  }

  // Copies the rows of every peer's segment of expert_output into this rank's
  // combine_input view, in stream order before the combine kernel, so that the
  // peers find them there.
  void copy_into_view(int32_t slot, const CombineCall& call, cudaStream_t s) {
    const size_t segment_bytes = static_cast<size_t>(call.tokens_per_rank) *
                                 static_cast<size_t>(layout_.combine_row_bytes);  // sizes checked at create
    copy_peer_segments(memory_->local() + slot_offsets_[slot].combine_input,
                       static_cast<const char*>(call.expert_output), layout_.rank, layout_.world_size, segment_bytes,
                       s);
  }

  // The host-mapped timeout mirror the device watch writes: no sync, no wait.
  HostHealth host_health() const override {
    HostHealth h;
    if (mirror_ == nullptr) return h;
    const uint32_t phase = mirror_->timeout_phase;
    if (phase == kernels::kPhaseNone) return h;
    h.status = MOE_EP_ERROR_TIMEOUT;
    h.failed_rank = mirror_->timeout_peer;
    h.message = timeout_message(phase, h.failed_rank);
    h.recoverable = masking_.store != nullptr;  // MASK: the next call recovers (check_in_step)
    return h;
  }

  // Collective over the whole group, inactive ranks included (they still
  // make every call: the mask changes what moves, not who takes part).  The
  // ranks agree through the bootstrap; then each writes the mask into its
  // own slots' control blocks once its own queued work is done, so no call
  // in flight sees it change and every later dispatch (a graph replay too)
  // reads it.
  void set_active_ranks(const std::vector<uint8_t>& active, moe_ep_status_t local_status,
                        const std::string& local_message) override {
    if (masking_.store) {
      change_mask(active, local_status, local_message);
      return;
    }
    {
      const BoundedExchange exchange(*bootstrap_, config_.timeout_ms);
      agree_on_mask(exchange, active, local_status, local_message, "NVLINK_TWO_SIDED set_active_ranks: masks");
    }
    const DeviceGuard guard(device_);
    wait_for_own_work();
    const uint64_t masked = masked_ranks(active, layout_.rank);
    for (int32_t slot = 0; slot < slots_; ++slot) {
      write_to_device(&control_device(slot)->masked_ranks, &masked, sizeof masked, private_stream_,
                      "writing the active-rank mask");
    }
  }

  // ---- failure_policy MASK (docs/nvlink_backend.md, "Surviving a dead rank") ----

  // Before every call: under FAIL_HANDLE a timeout leaves the handle out of
  // step for good; under MASK the survivors recover from it here, and the
  // call returns the outcome (RankFailure: TIMEOUT, the handle usable).
  void check_in_step() {
    if (!masking_.store) {
      refuse_after_timeout();
      return;
    }
    if (mirror_->timeout_phase != kernels::kPhaseNone) recover();
  }

  // A kernel of this rank gave up on a peer (its mirror names it).  Every
  // survivor comes here once its own kernels give up (each waits for a dead
  // peer, or for a survivor that stopped publishing); they agree on who is
  // gone through the store, reset their workspaces to the state of create,
  // and go on under the new mask.
  [[noreturn]] void recover() {
    const DeviceGuard guard(device_);
    const uint32_t phase = mirror_->timeout_phase;
    const int32_t suspect = mirror_->timeout_peer;
    wait_for_own_work();  // every wait is bounded, and the later kernels give up at once
    const int32_t world = layout_.world_size;
    std::vector<uint8_t> suspects(static_cast<size_t>(world), 0);
    if (suspect >= 0 && suspect < world && suspect != layout_.rank) suspects[static_cast<size_t>(suspect)] = 1;
    std::vector<int32_t> failed;
    std::string why = timeout_message(phase, suspect);
    std::vector<uint8_t> active = active_;
    try {
      std::vector<int32_t> seen(static_cast<size_t>(world), -1);
      masking_.store->allgather_suspecting(&suspect, seen.data(), sizeof suspect,
                                           "NVLINK_TWO_SIDED recovery after a timeout", suspects);
    } catch (const RankFailure& f) {
      active = f.active();
      failed = f.failed();
      why = f.what();
    }
    const bool changed = active != active_;
    resynchronise(&active, &failed, &why);
    set_mask(active, mask_epoch() + (changed || !failed.empty() ? 1 : 0));
    throw RankFailure(failed.empty() ? why +
                                           "; no rank was dropped: the group resynchronised, every pair in flight "
                                           "is ended, the next dispatch runs as before"
                                     : why,
                      active, failed);
  }

  // After an agreement among the survivors (they have all drained their
  // work): each resets its own workspace, then they meet once more, so that
  // no survivor writes into a peer that has not reset yet.  A failure at
  // that meeting drops more ranks and resets again.
  void resynchronise(std::vector<uint8_t>* active, std::vector<int32_t>* failed, std::string* why) {
    for (int attempt = 0;; ++attempt) {
      expel(*failed);
      reset_workspace(*active);
      try {
        meet_after_reset();
        break;
      } catch (const RankFailure& f) {
        *active = f.active();
        failed->insert(failed->end(), f.failed().begin(), f.failed().end());
        std::sort(failed->begin(), failed->end());
        *why = f.what();
        if (attempt > layout_.world_size) throw;
      }
    }
  }

  // The meeting after every participant reset its workspace: nobody writes
  // into a peer before it reset.
  void meet_after_reset() {
    const uint8_t mine = 1;
    std::vector<uint8_t> all(static_cast<size_t>(layout_.world_size), 0);
    masking_.store->allgather(&mine, all.data(), 1, "NVLINK_TWO_SIDED resynchronisation");
  }

  uint64_t mask_epoch() const { return masking_.mirror ? masking_.mirror->mask_epoch : 0; }

  // Writes "every pick dropped" into the control blocks of the ranks the
  // survivors dropped (a dead rank's memory stays mapped here, so the stores
  // are harmless): a dropped rank that is in fact alive then routes nothing,
  // and what it still writes into its segments here (padding, zero counts)
  // is what the survivors write themselves.  It still waits for every peer:
  // nobody publishes to it any more, so its next wait gives up and it finds
  // the verdict that dropped it.
  void expel(const std::vector<int32_t>& failed) {
    staged_expelled_ = ~uint64_t{0};
    for (int32_t r : failed) {
      if (r == layout_.rank || r < 0 || r >= layout_.world_size || !memory_->mapped(r)) continue;
      for (int32_t slot = 0; slot < slots_; ++slot) {
        char* at = static_cast<char*>(memory_->rank_base(r)) + slot_offsets_[slot].control +
                   offsetof(kernels::ControlBlock, masked_ranks);
        check_cuda(
            cudaMemcpyAsync(at, &staged_expelled_, sizeof staged_expelled_, cudaMemcpyHostToDevice, private_stream_),
            "expelling a dropped rank");
      }
    }
    check_cuda(cudaStreamSynchronize(private_stream_), "expelling the dropped ranks");
  }

  // This rank's workspace as create left it, under `active`: every flag and
  // counter at epoch 0, the control blocks' masks, the host-mapped mirror
  // clear, the watchdog stopped (the next receive half starts a fresh one).
  void reset_workspace(const std::vector<uint8_t>& active) {
    const DeviceGuard guard(device_);
    watchdog_.reset();
    if (watchdog_stream_) check_cuda(cudaStreamSynchronize(watchdog_stream_), "waiting for the watchdog's writes");
    char* base = memory_->local();
    check_cuda(cudaMemsetAsync(base, 0, memory_->size(), private_stream_), "zeroing the workspace");
    write_peer_tables_and_controls(masked_ranks(active, layout_.rank), absent_ranks(active, layout_.rank));
    check_cuda(cudaStreamSynchronize(private_stream_), "resetting the workspace");
    mirror_->timeout_peer = -1;
    for (kernels::ReceiveWatch& w : mirror_->watch) {
      w.completed = 0;
      w.waiting = 0;
    }
    mirror_->timeout_phase = kernels::kPhaseNone;
  }

  void set_mask(const std::vector<uint8_t>& active, uint64_t epoch) {
    active_ = active;
    if (masking_.mirror) {
      masking_.mirror->active = active;
      masking_.mirror->mask_epoch = epoch;
    }
  }

  // moe_ep_set_active_ranks under MASK: the change runs through the store
  // among the ranks active before or after it (store/membership_change.hpp),
  // once every participant's work has drained.  Ranks that come back
  // (a replacement process rejoining, or a masked rank made active again)
  // are then admitted: memory handles exchanged again among the ranks active
  // after the change (admit).  The participants then resynchronise under the
  // new mask.
  void change_mask(const std::vector<uint8_t>& active, moe_ep_status_t local_status, std::string local_message) {
    check_in_step();
    const size_t me = static_cast<size_t>(layout_.rank);
    if (local_status == MOE_EP_SUCCESS) local_status = check_one_newcomer(active_, active, &local_message);
    if (local_status == MOE_EP_SUCCESS && !active_[me] && !active[me]) {  // stays out: nothing to agree on
      set_mask(active, mask_epoch() + 1);
      return;
    }
    const DeviceGuard guard(device_);
    wait_for_own_work();  // no kernel of the participants runs while they change
    const std::vector<uint8_t> before = active_;
    const std::vector<uint8_t>& proposed = local_status == MOE_EP_SUCCESS ? active : active_;
    const MembershipState now{active_, 0, mask_epoch()};
    std::vector<uint8_t> next_active;
    try {
      next_active =
          change_membership(*masking_.store, now, proposed, local_status, local_message, masking_.fingerprint).active;
      if (next_active[me]) admit(rejoin_peers(before, next_active));
    } catch (const RankFailure& f) {
      resynchronise_and_throw(f.active(), f.failed(), f.what());
    } catch (const Error& e) {
      if (next_active.empty() || !any_joining(rejoin_peers(before, next_active))) throw;
      drop_failed_admission(before, next_active, e);
    }
    std::vector<int32_t> failed;
    std::string why;
    resynchronise(&next_active, &failed, &why);
    set_mask(next_active, mask_epoch() + 1);
    if (!failed.empty()) throw RankFailure(why, next_active, failed);
  }

  // The members' side of an admission (a replacement's: rejoin_group):
  // the settings check and the memory exchange.
  void admit(const HandlePeers& peers) {
    if (!any_joining(peers)) return;
    agree_on_rejoin_settings(*masking_.store, peers, rejoin_settings());
    memory_->admit(*masking_.store, peers, config_.timeout_ms);
  }

  // An admission that failed on every participant alike (a refused setting,
  // a handle that would not map): the joining ranks leave again.  They have
  // given up (their create failed, or their call returns the error), so the
  // members agree without them, after a short grace, as after a timeout.
  [[noreturn]] void drop_failed_admission(const std::vector<uint8_t>& before, const std::vector<uint8_t>& after,
                                          const Error& e) {
    const HandlePeers peers = rejoin_peers(before, after);
    std::vector<uint8_t> active = after;
    std::vector<int32_t> failed;
    if (peers.joining[static_cast<size_t>(layout_.rank)]) throw e;  // a returning rank: the members drop it
    try {
      const uint8_t mine = 1;
      std::vector<uint8_t> all(static_cast<size_t>(layout_.world_size), 0);
      masking_.store->allgather_suspecting(&mine, all.data(), 1, "NVLINK_TWO_SIDED: a failed admission", peers.joining);
    } catch (const RankFailure& f) {
      active = f.active();
      failed = f.failed();
    }
    std::string why = e.what();
    resynchronise(&active, &failed, &why);
    set_mask(active, mask_epoch() + 1);
    fail(e.status(), e.what(), " (the ranks that were to come back stay out of the mask)");
  }

  [[noreturn]] void resynchronise_and_throw(std::vector<uint8_t> survivors, std::vector<int32_t> failed,
                                            std::string why) {
    resynchronise(&survivors, &failed, &why);
    set_mask(survivors, mask_epoch() + 1);
    throw RankFailure(why, survivors, failed);
  }

  moe_ep_status_t poll_async_error(std::string* message) override {
    try {
      const DeviceGuard guard(device_);
      wait_for_own_work();
      std::vector<kernels::DeviceErrors> errors;
      for (int32_t slot = 0; slot < slots_; ++slot) {
        errors.push_back(
            read_from_device(&control_device(slot)->errors, private_stream_, "reading the device error record"));
      }
      for (const kernels::DeviceErrors& e : errors) {
        if (e.timeout_phase != kernels::kPhaseNone) {
          *message = timeout_message(e.timeout_phase, e.timeout_peer);
          return MOE_EP_ERROR_TIMEOUT;
        }
      }
      for (int32_t slot = 0; slot < slots_; ++slot) {
        const kernels::DeviceErrors& e = errors[static_cast<size_t>(slot)];
        if (e.bad_id_count != 0 || e.peer_count_errors != 0) {
          *message = input_errors_message(e);
          clear_input_errors(slot);
          return MOE_EP_ERROR_INVALID_INPUT;
        }
      }
      return MOE_EP_SUCCESS;
    } catch (...) {
      return status_of_current_exception(message);
    }
  }

  void shutdown() noexcept override {
    if (released_) return;
    released_ = true;
    int previous = -1;
    const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
    if (cudaSetDevice(device_) == cudaSuccess) {
      // Only this handle's own work: its last kernel, eager or replayed from
      // a graph (note_launch).  Our kernels end by themselves (every wait is
      // bounded), so this returns.
      // Each step is timed for MOE_EP_LOG=info: a step that waits for the
      // whole device (a driver's implicit synchronisation) shows up there.
      TeardownClock clock;
      wait_for_own_work_noexcept();  // a stream wait of a dead peer's is released by the watchdog meanwhile
      clock.step("own work");
      watchdog_.reset();
      if (watchdog_stream_) {
        cudaStreamSynchronize(watchdog_stream_);  // its writes land before the memory goes
        cudaStreamDestroy(watchdog_stream_);
      }
      clock.step("watchdog");
      memory_.reset();
      clock.step("unmap and release the workspace");
      own_work_.clear();
      if (private_stream_) cudaStreamDestroy(private_stream_);
      clock.step("stream and events");
      release_mirror_slot(mirror_);  // back to the pool: cudaFreeHost would wait for the device
      cudaGetLastError();            // nothing of this teardown may leak into the caller's error state
      try {
        log_info("rank ", layout_.rank, ": destroy ", clock.summary());
      } catch (...) {
      }
    }
    watchdog_.reset();
    watchdog_stream_ = nullptr;
    memory_.reset();
    own_work_.clear();
    private_stream_ = nullptr;
    mirror_ = nullptr;
    if (have_previous) cudaSetDevice(previous);
  }

 private:
  // What a slot's send half leaves for its receive half.
  struct SplitSlot {
    kernels::DispatchLaunch dispatch{};
    int32_t dispatch_path = 0;
    bool has_weights = false;
    CombineCall combine_call;
  };

  // The dispatch kernels' arguments for this call and `part`; *path is the
  // path selection's choice.  With the FP8 wire the send loop encodes the
  // caller's rows, or a quantize kernel launched here on `s` first writes
  // the codes the kernels send (the path decides).
  kernels::DispatchLaunch dispatch_launch(int32_t slot, const DispatchCall& caller, int32_t part, cudaStream_t s,
                                          int32_t* path) {
    DispatchPathCall pc;
    pc.num_tokens = caller.num_tokens;
    pc.tokens_per_rank = caller.tokens_per_rank;
    pc.num_blocks = kernels::dispatch_blocks(shape_, caller.num_tokens, caller.tokens_per_rank, sm_budget_);
    pc.hidden_row_bytes = shape_.hidden_row_bytes;
    pc.hidden = caller.hidden;
    pc.fp8_wire = layout_.fp8_dispatch();
    *path = select_dispatch_path(paths_, pc);
    const bool quantize = dispatch_path_quantizes(*path);
    const DispatchCall call = quantize ? caller : quantize_for_wire(slot, caller, s);
    kernels::DispatchLaunch a{};
    a.num_tokens = call.num_tokens;
    a.tokens_per_rank = call.tokens_per_rank;
    a.hidden = call.hidden;
    a.topk_ids = call.topk_ids;
    a.topk_weights = call.topk_weights;
    a.scales = call.scales;
    a.eplb_local = call.eplb_local;
    a.num_blocks = pc.num_blocks;
    a.max_blocks = sm_budget_ < kernels::kMaxDispatchBlocks ? sm_budget_ : kernels::kMaxDispatchBlocks;
    if (quantize) {
      a.quantize = 1;
      a.quantize_dtype = kernel_dtype(layout_.hidden_dtype);
      a.quantize_rule = layout_.wire_scale;
      a.quantize_row_bytes = static_cast<int64_t>(layout_.hidden_row_bytes);
    }
    a.lookback = dispatch_path_looks_back(*path) ? 1 : 0;
    // What a token sends to each destination: its row, scales, ids and weights.
    const int64_t token_bytes = shape_.hidden_row_bytes + shape_.scale_row_bytes + int64_t{8} * shape_.top_k;
    a.small_batch = dispatch_path_is_small(*path) ? 1 : 0;
    a.first_block_share =
        kernels::small_first_block_share(a.num_blocks, call.num_tokens, shape_.top_k, token_bytes, shape_.world_size);
    a.last_block_share =
        a.lookback != 0 ? kernels::kTokenShareUnit
                        : kernels::scan_last_block_share(a.num_blocks, shape_.top_k, token_bytes, shape_.world_size);
    a.pdl = paths_.pdl ? 1 : 0;
    a.bulk_rows = dispatch_path_is_bulk(*path) ? 1 : 0;
    a.part = part;
#ifdef MOE_EP_DIAGNOSTICS
    a.diagnostic = dispatch_diagnostic_;
#endif
    return a;
  }

  // Slot `slot`'s dispatch results.
  DispatchBuffers dispatch_buffers(int32_t slot, bool has_weights) const {
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* base = memory_->local();
    DispatchBuffers b;
    const ReceivedRows rows = received_rows(slot);
    b.hidden = rows.hidden;
    b.topk_ids = reinterpret_cast<int32_t*>(base + o.recv_ids);
    b.topk_weights = has_weights ? reinterpret_cast<float*>(base + o.recv_weights) : nullptr;
    b.scales = rows.scales;
    b.recv_counts = reinterpret_cast<int32_t*>(base + o.recv_counts);
    b.local_expert_counts = reinterpret_cast<int32_t*>(base + o.local_expert_counts);
    b.eplb_gathered = layout_.eplb_stats ? reinterpret_cast<int32_t*>(base + o.eplb_gathered) : nullptr;
    b.combine_input = layout_.zero_copy_combine ? base + o.combine_input : nullptr;
    if (layout_.expert_layout()) {  // the expert rows replace the rank-major rows, ids and weights
      const kernels::ExpertRowsBuffers x = expert_rows(slot);
      b.hidden = x.hidden;
      b.scales = x.scales;
      b.topk_ids = nullptr;
      b.topk_weights = nullptr;
      b.combine_input = layout_.zero_copy_combine ? base + o.expert_combine_input : nullptr;
      b.expert_counts = x.counts;
      b.expert_offsets = layout_.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED ? x.offsets : nullptr;
      b.row_sources = x.sources;
      b.row_weights = x.weights;
      b.dropped_pairs = x.dropped;
    }
    return b;
  }

  // The combine kernels' arguments (part left fused) for this call on
  // `slot` into `output` (NULL = the slot's own output).  A split call
  // (`split`) runs the serial schedule: its halves are the push and the wait.
  kernels::CombineLaunch combine_launch(int32_t slot, const CombineCall& call, void* output, bool split,
                                        int32_t* path) const {
    kernels::CombineLaunch a{};
    a.num_tokens = call.num_tokens;
    a.tokens_per_rank = call.tokens_per_rank;
    a.expert_output = call.expert_output;
    a.output = output ? output : memory_->local() + slot_offsets_[slot].combine_out;
    a.num_blocks = kernels::combine_blocks(shape_, call.num_tokens, call.tokens_per_rank, sm_budget_);
    // config.zero_copy_combine (the same on every rank): every combine of the
    // group pulls from the peers' combine_input views, so an expert_output
    // elsewhere is first copied into this rank's view (the peers' rows only;
    // the own rows are read where they are).
    CombinePathCall pc;
    pc.zero_copy_combine = layout_.zero_copy_combine && !layout_.fp8_combine();  // wire rows are pushed
    pc.world_size = layout_.world_size;
    pc.group_min_sm_budget = group_min_sm_budget_;
    pc.tokens_per_rank = call.tokens_per_rank;
    pc.combine_row_bytes = shape_.combine_row_bytes;
    pc.expert_output = a.expert_output;
    pc.output = a.output;
    pc.split = split;
    *path = select_combine_path(paths_, pc);
    a.pull = combine_path_pulls(*path) ? 1 : 0;
    a.schedule = combine_path_schedule(*path);
    a.pull_registers = *path == MOE_EP_PATH_COMBINE_PULL_REGISTERS ? 1 : 0;
    a.pull_rows = *path == MOE_EP_PATH_COMBINE_PULL_ROWS ? 1 : 0;
    a.pull_copy_bytes = kPullCopyBytes;
    a.pull_producers = pull_producers_;
#ifdef MOE_EP_DIAGNOSTICS
    a.pull_diagnostic = pull_diagnostic_;
#endif
    if (a.pull) a.num_blocks = kernels::combine_pull_blocks(call.num_tokens, sm_budget_);
    a.phases = combine_phases_;
    a.reduce_blocks = 0;  // the kernel's own split of the grid
    a.pdl = paths_.pdl ? 1 : 0;
    a.small_batch = *path == MOE_EP_PATH_COMBINE_SMALL_PUSH ? 1 : 0;
    a.part = kernels::kPartFused;
    return a;
  }

  kernels::HandleState slot_state(int32_t slot) const {
    kernels::HandleState st = state_;
    st.slot = slot;
    return st;
  }

  // Before a receive kernel: the stream waits, holding no SM, until every
  // peer's send half has published on the slot's ready word at
  // `ready_offset` (common/split_ready.cuh), with the slot's watch raised
  // for the watchdog.  Returns false where there is no stream wait (one
  // rank, MOE_EP_STREAM_WAIT=0, or a driver without stream memory
  // operations): the receive kernel then waits by itself.
  bool wait_for_ready(int32_t slot, uint64_t ready_offset, cudaStream_t s) {
    if (!stream_wait_ || layout_.world_size == 1) return false;
    if (!watchdog_) start_watchdog();
    const DriverApi& api = driver_api();
    const CUstream cs = reinterpret_cast<CUstream>(s);
    const CUdeviceptr waiting = reinterpret_cast<CUdeviceptr>(&state_.mirror->watch[slot].waiting);
    check_driver(api.stream_write_value32(cs, waiting, 1, CU_STREAM_WRITE_VALUE_DEFAULT),
                 "cuStreamWriteValue32(receive watch)");
    const CUdeviceptr ready = reinterpret_cast<CUdeviceptr>(memory_->local() + ready_offset);
    check_driver(
        api.stream_wait_value32(cs, ready, kernels::ready_target(layout_.world_size), CU_STREAM_WAIT_VALUE_GEQ),
        "cuStreamWaitValue32(ready word)");
    return true;
  }

  // The watchdog of the stream waits (nvlink/receive_watchdog.hpp): its
  // thread starts with the first receive half, so that fused-only handles run
  // none; its stream exists from create on, since a receive half may be
  // issued while the caller captures a graph.
  void start_watchdog() {
    watchdog_ = std::make_unique<ReceiveWatchdog>(mirror_, slots_, config_.timeout_ms,
                                                  [this](int32_t slot) { release_stream_waits(slot); });
  }

  // On the watchdog's thread, after timeout_ms of a slot's stream wait: marks
  // the slot released (its receive kernel then gives up on the missing peers
  // at once, recording the timeout) and fills both ready words, which ends
  // the wait.  The handle is out of step from then on, like any timeout.
  void release_stream_waits(int32_t slot) noexcept {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    const DriverApi& api = driver_api();
    const CUstream cs = reinterpret_cast<CUstream>(watchdog_stream_);
    const kernels::WorkspaceOffsets& o = slot_offsets_[slot];
    char* base = memory_->local();
    const uint32_t target = kernels::ready_target(layout_.world_size);
    api.stream_write_value32(
        cs, reinterpret_cast<CUdeviceptr>(base + o.control + offsetof(kernels::ControlBlock, watchdog_released)), 1,
        CU_STREAM_WRITE_VALUE_DEFAULT);
    api.stream_write_value32(cs, reinterpret_cast<CUdeviceptr>(base + o.dispatch_ready), target,
                             CU_STREAM_WRITE_VALUE_DEFAULT);
    api.stream_write_value32(cs, reinterpret_cast<CUdeviceptr>(base + o.combine_ready), target,
                             CU_STREAM_WRITE_VALUE_DEFAULT);
    cudaGetLastError();
    try {
      log_info("rank ", layout_.rank, ": a receive half of slot ", slot, " waited ", config_.timeout_ms,
               " ms for its peers; its stream wait is released and the call fails with TIMEOUT");
    } catch (...) {
    }
  }

  // Local checks and sizes; nothing collective yet.
  void prepare_locally() {
    device_ = resolve_device(config_.device);
    const DeviceGuard guard(device_);
    check_cuda(cudaFree(nullptr), "initialising the CUDA context");
    if (layout_.world_size > kernels::kMaxWorldSize) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "bootstrap->world_size: NVLINK_TWO_SIDED supports at most ",
           kernels::kMaxWorldSize, " ranks, got ", layout_.world_size);
    }
    driver_api();  // throws UNSUPPORTED naming a missing entry point
    const int cc =
        10 * device_attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "COMPUTE_CAPABILITY_MAJOR") +
        device_attribute(device_, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "COMPUTE_CAPABILITY_MINOR");
    if (cc < kernels::lowest_compiled_arch()) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "device ", device_, " has compute capability ", cc / 10, ".", cc % 10,
           "; this build's kernels need ", kernels::lowest_compiled_arch() / 10, ".",
           kernels::lowest_compiled_arch() % 10, " or newer");
    }
    sm_count_ = device_attribute(device_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "MULTIPROCESSOR_COUNT");
    sm_budget_ = config_.num_sms > 0 && config_.num_sms < sm_count_ ? config_.num_sms : sm_count_;
    shape_ = group_shape(wire_layout(layout_));  // the rows as dispatch moves them
    ExpertRowsOffsets expert_rows_first;
    offsets_ = plan_workspace(layout_, &expert_rows_first);
    if (layout_.expert_layout()) expert_shape_ = expert_layout_shape(layout_);
    slots_ = config_.micro_batches < 1 ? 1 : config_.micro_batches;
    for (int32_t slot = 0; slot < slots_; ++slot) {
      slot_offsets_.push_back(slot_offsets(offsets_, slot));
      slot_expert_rows_.push_back(slot_expert_rows(expert_rows_first, offsets_.total_bytes, slot));
    }
    split_.resize(static_cast<size_t>(slots_));
    stream_wait_ = knob_bool(Knob::kStreamWait) && driver_api().stream_wait_value32 != nullptr;
    paths_ = read_nvlink_path_settings(cc, sm_budget_);
    combine_phases_ = knob_int(Knob::kCombinePhases);
    pull_producers_ = knob_int(Knob::kPullProducers);
#ifdef MOE_EP_DIAGNOSTICS
    pull_diagnostic_ = knob_int(Knob::kPullDiagnostic);
    dispatch_diagnostic_ = knob_int(Knob::kDispatchDiagnostic);
#endif
  }

  // Zeroes the workspace (flags at epoch 0; the expansion's tickets, which
  // must start at zero), writes the peer table and the control block with
  // the masks (none at create; the group's mask for a replacement), and
  // allocates the host-side helpers.
  void initialise_workspace(uint64_t masked, uint64_t absent) {
    const DeviceGuard guard(device_);
    check_cuda(cudaStreamCreateWithFlags(&private_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(kernels::prepare_dispatch(paths_.dispatch_bulk ? 1 : 0,
                                         layout_.fp8_dispatch() && paths_.quantize_in_send ? 1 : 0),
               "raising the dispatch kernels' shared-memory limit");
    for (int32_t slot = 0; slot < slots_; ++slot) own_work_.push_back(std::make_unique<OwnWork>());
    const MirrorSlot mirror = acquire_mirror_slot();
    mirror_ = mirror.host;

    char* base = memory_->local();
    check_cuda(cudaMemsetAsync(base, 0, memory_->size(), private_stream_), "zeroing the workspace");
    write_peer_tables_and_controls(masked, absent);
    check_cuda(cudaStreamSynchronize(private_stream_), "initialising the workspace");

    if (stream_wait_ && layout_.world_size > 1) {
      check_cuda(cudaStreamCreateWithFlags(&watchdog_stream_, cudaStreamNonBlocking), "creating the watchdog's stream");
    }
    state_.local_base = base;
    state_.mirror = mirror.device;
    state_.timeout_ns = static_cast<int64_t>(config_.timeout_ms) * 1000000;
    state_.slot = 0;
  }

  // Every slot's peer table and control block (epoch 0, no error, the
  // masks), on the private stream; the host copies are staged in members so
  // that they outlive the asynchronous copies.
  void write_peer_tables_and_controls(uint64_t masked, uint64_t absent) {
    char* base = memory_->local();
    staged_bases_.assign(static_cast<size_t>(layout_.world_size), 0);
    for (int r = 0; r < layout_.world_size; ++r) {
      staged_bases_[static_cast<size_t>(r)] = reinterpret_cast<uintptr_t>(memory_->rank_base(r));
    }
    staged_control_ = kernels::ControlBlock{};
    staged_control_.epoch = 0;  // the first dispatch is epoch 1; flags and counters start at 0
    staged_control_.errors.timeout_peer = -1;
    staged_control_.errors.bad_id_first = ~uint64_t{0};
    staged_control_.errors.first_peer_count_error.source = -1;
    staged_control_.masked_ranks = masked;
    staged_control_.absent_ranks = absent;
    for (int32_t slot = 0; slot < slots_; ++slot) {  // each slot its own copy (its own epochs)
      check_cuda(cudaMemcpyAsync(base + slot_offsets_[slot].peer_bases, staged_bases_.data(),
                                 staged_bases_.size() * sizeof(uint64_t), cudaMemcpyHostToDevice, private_stream_),
                 "writing the peer table");
      check_cuda(cudaMemcpyAsync(control_device(slot), &staged_control_, sizeof(staged_control_),
                                 cudaMemcpyHostToDevice, private_stream_),
                 "writing the control block");
    }
  }

  kernels::ControlBlock* control_device(int32_t slot) const {
    return reinterpret_cast<kernels::ControlBlock*>(memory_->local() + slot_offsets_[slot].control);
  }

  // A timed-out group is out of step: every later call fails at once.
  void refuse_after_timeout() const {
    const uint32_t phase = mirror_->timeout_phase;
    if (phase != kernels::kPhaseNone) fail(MOE_EP_ERROR_TIMEOUT, timeout_message(phase, mirror_->timeout_peer));
  }

  // After each call: waiting for the handle's work waits for this handle only
  // (its last eager call and its last graph replay; gpu/own_work.hpp).
  // Per slot: two slots' halves may run on two streams.
  void note_launch(int32_t slot, cudaStream_t stream) { own_work_[static_cast<size_t>(slot)]->note(stream); }

  cudaError_t wait_for_own_work_noexcept() noexcept {
    cudaError_t first = cudaSuccess;
    for (const std::unique_ptr<OwnWork>& w : own_work_) {
      const cudaError_t e = w->synchronize();
      if (first == cudaSuccess) first = e;
    }
    return first;
  }

  void wait_for_own_work() { check_cuda(wait_for_own_work_noexcept(), "waiting for the handle's last kernel"); }

  // Clears the input-error part of the record (bad ids, refused peer counts).
  void clear_input_errors(int32_t slot) {
    kernels::DeviceErrors cleared{};
    cleared.bad_id_first = ~uint64_t{0};
    cleared.first_peer_count_error.source = -1;
    char* at = reinterpret_cast<char*>(&control_device(slot)->errors);
    const size_t from = offsetof(kernels::DeviceErrors, bad_id_count);
    write_to_device(at + from, reinterpret_cast<const char*>(&cleared) + from, sizeof(cleared) - from, private_stream_,
                    "clearing the input error record");
  }

  std::string timeout_message(uint32_t phase, int32_t peer) const {
    const std::string whom = peer >= 0 ? "rank " + std::to_string(peer) : std::string("its copies of the peers' rows");
    return phase_name(phase) + " waiting for " + whom +
           ": no answer within timeout_ms = " + std::to_string(config_.timeout_ms) + " on rank " +
           std::to_string(layout_.rank) +
           (masking_.store ? " (failure_policy MASK: the results of the calls since are invalid; the next call "
                             "recovers, dropping the ranks that are gone)"
                           : " (the group is out of step; destroy this handle)");
  }

  std::string input_errors_message(const kernels::DeviceErrors& e) const {
    std::string message;
    if (e.peer_count_errors != 0) {
      const kernels::PeerCountError& f = e.first_peer_count_error;
      message = "dispatch on rank " + std::to_string(layout_.rank) + ": rank " + std::to_string(f.source) +
                " dispatched with tokens_per_rank " + std::to_string(f.source_tokens_per_rank) + " and sent " +
                std::to_string(f.source_rows) + " rows, this rank with tokens_per_rank " +
                std::to_string(f.own_tokens_per_rank) +
                " (args->runtime_max_tokens_per_rank must be the same on every rank of a call); no rows were taken "
                "from that rank (" +
                std::to_string(e.peer_count_errors) + " refused in all), the results of that call are invalid";
    }
    if (e.bad_id_count != 0) {
      const uint64_t position = e.bad_id_first >> 32;
      const int32_t value = static_cast<int32_t>(static_cast<uint32_t>(e.bad_id_first & 0xFFFFFFFFu));
      if (!message.empty()) message += "; ";
      message += bad_ids_message(layout_, e.bad_id_count, static_cast<int64_t>(position / layout_.top_k),
                                 static_cast<int32_t>(position % layout_.top_k), value);
    }
    return message;
  }

  Layout layout_;
  moe_ep_config_t config_;
  // Valid until destroy (moe_ep_bootstrap_t): set_active_ranks agrees through
  // it under FAIL_HANDLE.  A replacement process (config->rejoin) has none.
  std::optional<Bootstrap> bootstrap_;
  NvlinkMasking masking_;               // failure_policy MASK: the store; empty otherwise
  std::vector<uint8_t> active_;         // failure_policy MASK: the mask the workspace was reset to
  std::vector<uint64_t> staged_bases_;  // write_peer_tables_and_controls' host copies
  kernels::ControlBlock staged_control_{};
  uint64_t staged_expelled_ = 0;  // expel's host copy of a dropped rank's masked_ranks
  int device_ = 0;
  int sm_count_ = 0;
  int sm_budget_ = 0;
  kernels::GroupShape shape_{};
  kernels::WorkspaceOffsets offsets_{};  // slot 0's
  int32_t slots_ = 1;                    // config.micro_batches
  std::vector<kernels::WorkspaceOffsets> slot_offsets_;
  std::vector<ExpertRowsOffsets> slot_expert_rows_;  // per slot: the expansion's regions (expert layouts)
  kernels::ExpertLayoutShape expert_shape_{};        // expert layouts only
  std::vector<SplitSlot> split_;
  bool stream_wait_ = false;  // receive halves wait with a stream memory operation (MOE_EP_STREAM_WAIT)
  std::unique_ptr<ReceiveWatchdog> watchdog_;
  cudaStream_t watchdog_stream_ = nullptr;
  kernels::HandleState state_{};  // slot 0's (slot_state)
  std::unique_ptr<SharedMemory> memory_;
  kernels::HostTimeoutMirror* mirror_ = nullptr;
  cudaStream_t private_stream_ = nullptr;
  std::vector<std::unique_ptr<OwnWork>> own_work_;  // per slot: its last eager call and graph replay
  NvlinkPathSettings paths_;           // what the path selectors read (nvlink/path_selection.hpp)
  int32_t combine_phases_ = 0;         // MOE_EP_COMBINE_PHASES
  int32_t group_min_sm_budget_ = 0;
  int32_t pull_producers_ = 0;  // MOE_EP_PULL_PRODUCERS
#ifdef MOE_EP_DIAGNOSTICS
  int32_t pull_diagnostic_ = 0;                      // MOE_EP_PULL_DIAGNOSTIC (diagnostic builds only)
  int32_t dispatch_diagnostic_ = 0;                  // MOE_EP_DISPATCH_DIAGNOSTIC (diagnostic builds only)
#endif
  bool released_ = false;
};

}  // namespace

bool nvlink_platform_supported(int32_t device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  if (device < -1 || device >= count) return false;
  int d = device;
  if (d == -1 && cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (10 * major + minor < kernels::lowest_compiled_arch()) return false;
  const DriverApi* api = try_driver_api();
  if (api == nullptr) return false;
  CUdevice cu = 0;
  if (api->device_get(&cu, d) != CUDA_SUCCESS) return false;
  int vmm = 0, posix = 0, fabric = 0;
  api->device_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu);
  api->device_attribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cu);
  api->device_attribute(&fabric, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, cu);
  return vmm != 0 && (posix != 0 || fabric != 0);
}

uint64_t nvlink_workspace_bytes(const Layout& layout, const moe_ep_config_t& config) {
  const int device = resolve_device(config.device);
  return SharedMemory::allocation_size(device, slots_total_bytes(plan_workspace(layout), config.micro_batches));
}

std::unique_ptr<Backend> make_nvlink_backend(const Layout& layout, const moe_ep_config_t& config,
                                             const Bootstrap& bootstrap) {
  return std::make_unique<NvlinkBackend>(layout, config, bootstrap, NvlinkMasking{});
}

std::unique_ptr<Backend> make_masking_nvlink_backend(const Layout& layout, const moe_ep_config_t& config,
                                                     const Bootstrap& bootstrap, NvlinkMasking masking) {
  return std::make_unique<NvlinkBackend>(layout, config, bootstrap, std::move(masking));
}

std::unique_ptr<Backend> make_rejoining_nvlink_backend(const Layout& layout, const moe_ep_config_t& config,
                                                       NvlinkMasking masking) {
  return std::make_unique<NvlinkBackend>(layout, config, std::move(masking));
}

}  // namespace moe_ep
