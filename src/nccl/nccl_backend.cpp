// The NCCL backend.  Dispatch: kernels route and pack this rank's rows into
// one fixed-size segment of tokens_per_rank rows per destination (and one
// metadata block: header, ids, weights, scales), one grouped ncclSend/ncclRecv
// exchanges them (the rows straight into the result rows), and a finish
// kernel checks the headers, writes the counts and unpacks the metadata.  Combine: one
// grouped ncclSend/ncclRecv returns every rank's expert output segments, and a
// kernel sums them in ascending rank order.  No host synchronisation inside
// either call; every wait on the host is bounded by timeout_ms.
//
// Split phases (docs/overlap.md): each call in two halves on a buffer slot
// (config->micro_batches), each slot with its own part of the workspace,
// streams and events.  dispatch_send = route, pack and the NCCL group;
// dispatch_recv = the finish kernel.  combine_send = the NCCL group (after
// staging this rank's own rows when expert_output is not the slot's view, so
// that the caller's tensor is free once the send half's work is done);
// combine_recv = the reduction.  The fused calls run the same pieces back to
// back on slot 0.  NCCL's operations are posted in the order of the calls, on
// one communicator.
// docs/nccl_backend.md has the design, the byte model and what is bounded.
#include "nccl/nccl_backend.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "bounded_exchange.hpp"
#include "collective_step.hpp"
#include "common/cuda_check.hpp"
#include "common/host_identity.hpp"
#include "common/log.hpp"
#include "common/tuning_registry.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "expert_layout_kernels.h"
#include "gpu/device_copy.hpp"
#include "gpu/own_work.hpp"
#include "gpu/peer_segments_copy.hpp"
#include "gpu/routing_mask.hpp"
#include "gpu/wire_rows_plan.hpp"
#include "mask_agreement.hpp"
#include "nccl/nccl_chunk_plan.hpp"
#include "nccl/nccl_communicator.hpp"
#include "nccl/nccl_library.hpp"
#include "nccl/nccl_stage_profile.hpp"
#include "nccl/nccl_workspace.hpp"
#include "nccl/nccl_workspace_memory.hpp"
#include "nccl_kernels.h"
#include "wire_kernels.h"

namespace moe_ep {

namespace {

// Where a rank runs, to refuse what NCCL refuses (two ranks on one GPU of
// one host) with a clear message before NCCL is asked.  NCCL tells hosts
// apart by NCCL_HOSTID where it is set: ranks with distinct values are
// separate nodes to NCCL, which then accepts them on one GPU and connects
// them through its network transport (how several nodes are emulated on
// one machine; docs/nccl_backend.md).
struct GpuPlace {
  HostIdentity host;
  char pci_bus_id[32];
  char nccl_host_id[64];  // NCCL_HOSTID, "" where unset
};

void check_one_rank_per_gpu(const Bootstrap& bootstrap, int device) {
  GpuPlace mine{};
  mine.host = local_host_identity();
  check_cuda(cudaDeviceGetPCIBusId(mine.pci_bus_id, sizeof(mine.pci_bus_id), device), "cudaDeviceGetPCIBusId");
  if (const char* id = std::getenv("NCCL_HOSTID")) std::strncpy(mine.nccl_host_id, id, sizeof(mine.nccl_host_id) - 1);
  const std::vector<GpuPlace> all = bootstrap.allgather_value(mine);
  for (int32_t a = 0; a < bootstrap.world_size(); ++a) {
    for (int32_t b = a + 1; b < bootstrap.world_size(); ++b) {
      if (same_host(all[a].host, all[b].host) &&
          std::strncmp(all[a].nccl_host_id, all[b].nccl_host_id, sizeof(mine.nccl_host_id)) == 0 &&
          std::strncmp(all[a].pci_bus_id, all[b].pci_bus_id, sizeof(mine.pci_bus_id)) == 0) {
        fail(MOE_EP_ERROR_UNSUPPORTED, "NCCL backend: ranks ", a, " and ", b, " both use GPU ",
             peer_text(all[a].pci_bus_id, sizeof(all[a].pci_bus_id)),
             " on ", describe_host(all[a].host),
             "; NCCL allows one rank per GPU (use NVLINK_TWO_SIDED or HOST to run several ranks on one GPU)");
      }
    }
  }
}

// Pipelining (docs/nccl_backend.md): MOE_EP_NCCL_DISPATCH_CHUNKS = n cuts
// dispatch's exchange into n row ranges, the packing of range c + 1 running
// while NCCL moves range c; MOE_EP_NCCL_COMBINE_CHUNKS = n does the same for
// combine, the reduction of range c running while NCCL moves range c + 1.
// 1..16, default 1 (one NCCL group, no overlap).  They change no result, but
// every rank must issue the same NCCL calls: create checks that the values
// are the same everywhere.
const char* const kDispatchChunksVariable = "MOE_EP_NCCL_DISPATCH_CHUNKS";
const char* const kCombineChunksVariable = "MOE_EP_NCCL_COMBINE_CHUNKS";

// A stream's capture: 0 when eager, the capture's id while capturing, and
// kNoCapture for a capture that was invalidated (matches nothing).
constexpr unsigned long long kNoCapture = ~0ull;
unsigned long long capture_of(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  check_cuda(cudaStreamGetCaptureInfo(stream, &status, &id), "cudaStreamGetCaptureInfo");
  if (status == cudaStreamCaptureStatusNone) return 0;
  return status == cudaStreamCaptureStatusActive ? id : kNoCapture;
}

// One buffer slot: its part of the workspace, the streams and events of its
// calls, and what a send half hands its receive half.  With micro_batches = 1
// there is one, exactly the backend's state before it had slots.
struct NcclSlot {
  kernels::NcclBuffers buffers{};
  kernels::ExpertRowsBuffers expert{};            // the expert layout's results and state (all NULL for RANK_MAJOR)
  char* expert_combine_rows = nullptr;            // expert layouts: the folded rank-major rows combine sends
  char* view = nullptr;                           // its combine_input view (zero_copy_combine), else NULL
  NcclWireBuffers wire{};                         // the FP8 wire's buffers (NULL where AS_IS)
  std::unique_ptr<OwnWork> own_work;              // its last eager call and graph replay
  cudaStream_t side_stream = nullptr;             // own-row packing (lowest priority)
  cudaStream_t nccl_stream = nullptr;             // NCCL groups of a pipelined call (greatest priority)
  cudaEvent_t range_events[kMaxNcclChunks] = {};  // range c packed (dispatch) / moved (combine)
  cudaEvent_t fork_event = nullptr;
  cudaEvent_t join_event = nullptr;
  // Recorded after a send half's work, so that a receive half on another
  // stream of the same capture (or eagerly on another stream) runs after it.
  cudaEvent_t sent_event = nullptr;
  cudaStream_t sent_stream = nullptr;
  unsigned long long sent_capture = 0;
  // Between the halves: the sizes of the pair, and where the reduction reads
  // this rank's own expert rows (rank-major: row rank x tpr + slot).
  int32_t num_tokens = 0;
  int32_t tokens_per_rank = 0;
  bool has_weights = false;
  const char* own_rows = nullptr;
  bool combine_profiled = false;  // combine_send began a profiled call (MOE_EP_NCCL_PROFILE=1)
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(const Layout& layout, const moe_ep_config_t& config, const Bootstrap& bootstrap)
      : layout_(layout), config_(config), bootstrap_(bootstrap) {
    // Each local step is agreed on (run_then_agree: a failure of any type on
    // one rank fails create on every rank); whatever was acquired before a
    // failure is released here (the destructor does not run).
    try {
      run_then_agree(bootstrap, [&] { prepare_locally(); });
      check_same_on_every_rank(
          bootstrap, {{kDispatchChunksVariable, dispatch_chunks_}, {kCombineChunksVariable, combine_chunks_}});
      {
        const DeviceGuard guard(device_);
        run_then_agree(bootstrap, [&] { check_one_rank_per_gpu(bootstrap, device_); });
        comm_ = std::make_unique<NcclCommunicator>(*api_, bootstrap, config_.timeout_ms);
      }
      run_then_agree(bootstrap, [&] { create_streams(); });
      allocate_workspace(bootstrap);
      run_then_agree(bootstrap, [&] {
        prepare_workspace();
        connect_peers();
      });
    } catch (...) {
      shutdown();
      throw;
    }
    log_info("rank ", layout_.rank, ": NCCL ", api_->version(), " (", api_->path, ") on device ", device_, ", ",
             sm_budget_, " SMs for the kernels, workspace ", total_bytes_, " bytes (", slots_.size(),
             " buffer slot(s)), timeout ", config_.timeout_ms, " ms, dispatch in ", dispatch_chunks_,
             " and combine in ", combine_chunks_, " row range(s), ",
             memory_->is_registered() ? "buffers registered with NCCL" : "buffers not registered with NCCL",
             registration_note_);
  }

  ~NcclBackend() override { shutdown(); }

  const char* name() const override { return "nccl"; }
  moe_ep_device_t device() const override { return moe_ep_device_t{MOE_EP_DEVICE_CUDA, device_}; }

  bool split_phases() const override { return true; }
  // The fused combine skips the halves' staging copy of the own rows (the
  // caller's tensor stays untouched until the call's work is done) and keeps
  // a pipelined combine's reductions next to the transfer.
  bool fused_calls_are_faster() const override { return true; }

  // The fused calls: the pieces of the halves back to back on slot 0.
  // Dispatch is exactly send + receive.  Combine reads this rank's own rows
  // where the caller left them, as the halves would after staging them, and
  // keeps the reductions of a pipelined combine next to the transfer: the
  // same bits as combine_send + combine_recv on slot 0.
  DispatchBuffers dispatch(const DispatchCall& call, void* stream) override {
    refuse_after_abort();
    const DeviceGuard guard(device_);
    paths.note(MOE_EP_PHASE_DISPATCH, MOE_EP_PATH_NCCL, layout_.rank);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    NcclSlot& slot = slots_[0];
    post_dispatch(slot, call, s);
    finish_dispatch(slot, call.tokens_per_rank, call.has_weights, s);
    slot.own_work->note(s);
    return dispatch_results(slot, call.has_weights);
  }

  void* combine(const CombineCall& call, void* stream) override {
    refuse_after_abort();
    const DeviceGuard guard(device_);
    paths.note(MOE_EP_PHASE_COMBINE, MOE_EP_PATH_NCCL, layout_.rank);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    NcclSlot& slot = slots_[0];
    const int64_t tpr = call.tokens_per_rank;
    const char* expert_output = combine_source(slot, call, s);
    kernels::NcclCombineLaunch a{};
    a.num_tokens = call.num_tokens;
    a.tokens_per_rank = call.tokens_per_rank;
    // The own rows, read in place (expert layouts: in the folded rows; an
    // FP8 combine wire: in the quantized rows).
    a.expert_output = layout_.expert_layout() || layout_.fp8_combine() ? expert_output : call.expert_output;
    a.output = call.output ? call.output : slot.buffers.combine_out;
    const NcclChunkPlan plan = plan_nccl_chunks(call.tokens_per_rank, layout_.world_size > 1 ? combine_chunks_ : 1);
    if (plan.count == 1) {
      // One range: NCCL, then the reduction alone with every SM, on the caller's stream.
      if (combine_profile_) combine_profile_->begin(s);
      exchange_combine_rows(slot, expert_output, tpr, plan.ranges[0], s);
      if (combine_profile_) combine_profile_->mark(s);
      reduce(slot, a, s);
      if (combine_profile_) combine_profile_->mark(s);
    } else {
      pipeline_combine(slot, a, expert_output, tpr, plan, s);
    }
    slot.own_work->note(s);
    return a.output;
  }

  // Route, pack and the NCCL group, posted on `stream`; returns without
  // waiting.  The inputs are free once this work is done.
  void dispatch_send(int32_t index, const DispatchCall& call, void* stream) override {
    refuse_after_abort();
    const DeviceGuard guard(device_);
    paths.note(MOE_EP_PHASE_DISPATCH, MOE_EP_PATH_NCCL, layout_.rank);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    NcclSlot& slot = slot_at(index);
    post_dispatch(slot, call, s);
    slot.tokens_per_rank = call.tokens_per_rank;
    slot.has_weights = call.has_weights;
    sent(slot, s);
  }

  // The finish kernel, stream-ordered after the slot's group.
  DispatchBuffers dispatch_recv(int32_t index, void* stream) override {
    refuse_after_abort();
    const DeviceGuard guard(device_);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    NcclSlot& slot = slot_at(index);
    after_send(slot, s);
    finish_dispatch(slot, slot.tokens_per_rank, slot.has_weights, s);
    slot.own_work->note(s);
    return dispatch_results(slot, slot.has_weights);
  }

  // The NCCL group(s) of the combine, posted on `stream`.  The reduction of
  // combine_recv reads this rank's own rows; unless they are in the slot's
  // view (valid until the slot's next dispatch), they are staged first, so
  // that the caller's expert_output is free once this work is done.
  void combine_send(int32_t index, const CombineCall& call, void* stream) override {
    refuse_after_abort();
    const DeviceGuard guard(device_);
    paths.note(MOE_EP_PHASE_COMBINE, MOE_EP_PATH_NCCL, layout_.rank);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    NcclSlot& slot = slot_at(index);
    const int64_t tpr = call.tokens_per_rank;
    const char* expert_output = static_cast<const char*>(call.expert_output);
    if (layout_.fp8_combine()) {
      // Quantized into the slot's wire rows (after the fold in an expert
      // layout), which stay put until the slot's next combine: the caller's
      // tensor (or the view) is read by those kernels only.
      expert_output = slot.own_rows = combine_source(slot, call, s);
    } else if (layout_.expert_layout()) {
      // Folded into the slot's own rank-major rows: the caller's tensor (or
      // the view) is read by the fold only, and the folded rows stay put
      // until the slot's next combine.
      expert_output = slot.own_rows = fold_expert_rows(slot, call, s);
    } else if (call.expert_output_is_workspace) {
      slot.own_rows = expert_output;  // the slot's view, read in place
    } else if (memory_->is_registered()) {
      // NCCL sends from the view: every segment, the own one included, goes
      // there in one copy and the reduction reads the own rows from it.
      const size_t all = static_cast<size_t>(layout_.world_size) * static_cast<size_t>(tpr) *
                         static_cast<size_t>(layout_.combine_row_bytes);
      if (all != 0) {
        check_cuda(cudaMemcpyAsync(slot.view, expert_output, all, cudaMemcpyDeviceToDevice, s),
                   "copying expert_output into the combine_input view");
      }
      expert_output = slot.own_rows = slot.view;
    } else {
      slot.own_rows = stage_own_rows(slot, expert_output, tpr, s);
    }
    // Every range's group in order on `stream`: the sends have read the
    // caller's tensor when this stream's work is done (a pipelined combine
    // overlaps its reductions with the transfer only in the fused call).
    const NcclChunkPlan plan = plan_nccl_chunks(call.tokens_per_rank, layout_.world_size > 1 ? combine_chunks_ : 1);
    slot.combine_profiled = combine_profile_ && plan.count == 1;  // (the profile's stages are those of one range)
    if (slot.combine_profiled) combine_profile_->begin(s);
    for (int32_t c = 0; c < plan.count; ++c) exchange_combine_rows(slot, expert_output, tpr, plan.ranges[c], s);
    if (slot.combine_profiled) combine_profile_->mark(s);
    slot.num_tokens = call.num_tokens;
    slot.tokens_per_rank = call.tokens_per_rank;
    sent(slot, s);
  }

  // The reduction, stream-ordered after the slot's group(s).
  void* combine_recv(int32_t index, void* output, void* stream) override {
    refuse_after_abort();
    const DeviceGuard guard(device_);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    NcclSlot& slot = slot_at(index);
    after_send(slot, s);
    kernels::NcclCombineLaunch a{};
    a.num_tokens = slot.num_tokens;
    a.tokens_per_rank = slot.tokens_per_rank;
    a.expert_output = slot.own_rows;
    a.output = output ? output : slot.buffers.combine_out;
    reduce(slot, a, s);
    if (slot.combine_profiled) combine_profile_->mark(s);
    slot.own_work->note(s);
    return a.output;
  }

  // Collective over the whole group, inactive ranks included (they still
  // make every call, and take part in every NCCL exchange with nothing to
  // send): the ranks agree through the bootstrap; then each writes the mask
  // into its slots' routing word once its own work is done, so no call in
  // flight sees it change, and every later dispatch (a graph replay too)
  // routes by it.
  void set_active_ranks(const std::vector<uint8_t>& active, moe_ep_status_t local_status,
                        const std::string& local_message) override {
    refuse_after_abort();
    {
      const BoundedExchange exchange(bootstrap_, config_.timeout_ms);
      agree_on_mask(exchange, active, local_status, local_message, "NCCL set_active_ranks: masks");
    }
    const DeviceGuard guard(device_);
    wait_for_own_work();
    staged_mask_ = masked_ranks(active, layout_.rank);
    for (const NcclSlot& slot : slots_) {
      write_to_device(const_cast<uint64_t*>(slot.buffers.masked_ranks), &staged_mask_, sizeof staged_mask_,
                      private_stream_, "writing the active-rank mask");
    }
  }

  moe_ep_status_t poll_async_error(std::string* message) override {
    try {
      const DeviceGuard guard(device_);
      wait_for_own_work();
      message->clear();
      for (size_t k = 0; k < slots_.size(); ++k) {
        const kernels::NcclDeviceErrors e =
            read_from_device(slots_[k].buffers.errors, private_stream_, "reading the device error record");
        if (e.bad_id_count == 0 && e.bad_peer_count == 0) continue;
        const std::string where = slots_.size() > 1 ? " (slot " + std::to_string(k) + ")" : "";
        if (e.bad_id_count != 0) *message += (message->empty() ? "" : "; ") + bad_ids_message(e) + where;
        if (e.bad_peer_count != 0) *message += (message->empty() ? "" : "; ") + bad_peer_message(e) + where;
        reset_device_errors(slots_[k]);
      }
      return message->empty() ? MOE_EP_SUCCESS : MOE_EP_ERROR_INVALID_INPUT;
    } catch (const Error& e) {
      *message = e.what();
      return e.status();
    }
  }

  void shutdown() noexcept override {
    if (released_) return;
    released_ = true;
    int previous = -1;
    const bool have_previous = cudaGetDevice(&previous) == cudaSuccess;
    if (cudaSetDevice(device_) == cudaSuccess) {
      bool healthy = !own_work_abandoned_;
      if (healthy && comm_) {
        try {
          wait_for_own_work();  // bounded: aborts the communicator when timeout_ms passes
        } catch (...) {
          healthy = false;
        }
      }
      if (healthy && dispatch_profile_) {
        log_info("rank ", layout_.rank, ": ", dispatch_profile_->summary());
        log_info("rank ", layout_.rank, ": ", combine_profile_->summary(), " (combine in one range only)");
      }
      dispatch_profile_.reset();
      combine_profile_.reset();
      if (comm_) comm_->close(healthy && !comm_->aborted());  // releases a registration of the workspace
      memory_.reset();
      for (NcclSlot& slot : slots_) {
        slot.own_work.reset();
        for (cudaEvent_t e : slot.range_events) {
          if (e) cudaEventDestroy(e);
        }
        if (slot.fork_event) cudaEventDestroy(slot.fork_event);
        if (slot.join_event) cudaEventDestroy(slot.join_event);
        if (slot.sent_event) cudaEventDestroy(slot.sent_event);
        if (slot.side_stream) cudaStreamDestroy(slot.side_stream);
        if (slot.nccl_stream) cudaStreamDestroy(slot.nccl_stream);
      }
      if (private_stream_) cudaStreamDestroy(private_stream_);
      if (last_group_) cudaEventDestroy(last_group_);
      cudaGetLastError();  // nothing of this teardown may leak into the caller's error state
    }
    comm_.reset();
    memory_.reset();
    slots_.clear();
    private_stream_ = nullptr;
    last_group_ = nullptr;
    if (have_previous) cudaSetDevice(previous);
  }

 private:
  void prepare_locally() {
    std::string why;
    api_ = nccl::load(&why);
    if (api_ == nullptr) fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NCCL: ", why);
    device_ = resolve_device(config_.device);
    const DeviceGuard guard(device_);
    check_cuda(cudaFree(nullptr), "initialising the CUDA context");
    if (layout_.world_size > kernels::kMaxWorldSize) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "bootstrap->world_size: the NCCL backend supports at most ",
           kernels::kMaxWorldSize, " ranks, got ", layout_.world_size);
    }
    int major = 0, minor = 0, sms = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_), "cudaDeviceGetAttribute");
    if (10 * major + minor < kernels::lowest_compiled_arch()) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "device ", device_, " has compute capability ", major, ".", minor,
           "; this build's kernels need ", kernels::lowest_compiled_arch() / 10, ".",
           kernels::lowest_compiled_arch() % 10, " or newer");
    }
    sm_budget_ = config_.num_sms > 0 && config_.num_sms < sms ? config_.num_sms : sms;
    shape_ = nccl_shape(layout_);
    if (layout_.expert_layout()) expert_shape_ = expert_layout_shape(layout_);
    plan_ = plan_nccl_workspace(layout_);
    if (plan_.meta_stride != static_cast<uint64_t>(kernels::nccl_meta_stride(shape_)) ||
        plan_.meta_gap != static_cast<uint64_t>(kernels::nccl_meta_gap(shape_)) ||
        plan_.send_segment_stride != static_cast<uint64_t>(kernels::nccl_send_segment_stride(shape_))) {
      fail(MOE_EP_ERROR_INTERNAL, "NCCL backend: the workspace plan and the kernels disagree on the metadata layout");
    }
    total_bytes_ = nccl_workspace_total(plan_, config_.micro_batches);
    dispatch_chunks_ = knob_int(Knob::kNcclDispatchChunks);
    combine_chunks_ = knob_int(Knob::kNcclCombineChunks);
    // The stage profile follows one call at a time: with two slots the
    // halves of two calls interleave, so it is kept to one slot.
    if (NcclStageProfile::enabled() && config_.micro_batches == 1) {
      dispatch_profile_ = std::make_unique<NcclStageProfile>(
          "dispatch", std::vector<std::string>{"route", "pack", "nccl", "join+finish"});
      combine_profile_ = std::make_unique<NcclStageProfile>("combine", std::vector<std::string>{"nccl", "reduce"});
    }
  }

  void create_streams() {
    const DeviceGuard guard(device_);
    check_cuda(cudaStreamCreateWithFlags(&private_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&last_group_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    int lowest = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&lowest, &greatest), "cudaDeviceGetStreamPriorityRange");
    slots_.resize(static_cast<size_t>(config_.micro_batches));
    // Each slot its own streams and events: the halves of two micro-batches
    // may run on different streams or be captured into different graphs.
    for (NcclSlot& slot : slots_) {
      slot.own_work = std::make_unique<OwnWork>();
      // Lowest priority: the side stream's kernels must not keep SMs from NCCL's.
      check_cuda(cudaStreamCreateWithPriority(&slot.side_stream, cudaStreamNonBlocking, lowest),
                 "cudaStreamCreateWithPriority");
      // Greatest priority: when a range's pack or reduction and NCCL's next
      // kernel wait for SMs at once, NCCL's blocks are placed first.
      check_cuda(cudaStreamCreateWithPriority(&slot.nccl_stream, cudaStreamNonBlocking, greatest),
                 "cudaStreamCreateWithPriority");
      for (cudaEvent_t& e : slot.range_events) {
        check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      }
      check_cuda(cudaEventCreateWithFlags(&slot.fork_event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      check_cuda(cudaEventCreateWithFlags(&slot.join_event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      check_cuda(cudaEventCreateWithFlags(&slot.sent_event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
  }

  // The workspace, registered with NCCL where every rank wants it and every
  // rank manages it (both agreed over the bootstrap, since NCCL needs both
  // sides of a transfer registered or neither), else plain device memory.
  void allocate_workspace(const Bootstrap& bootstrap) {
    const DeviceGuard guard(device_);
    const bool wanted = all_ranks(bootstrap, nccl_registration_wanted(*api_, layout_.zero_copy_combine));
    if (wanted) {
      std::string why;
      run_then_agree(bootstrap,
                     [&] { memory_ = NcclWorkspaceMemory::registered(*api_, comm_->get(), total_bytes_, &why); });
      if (!all_ranks(bootstrap, memory_ != nullptr)) {
        registration_note_ =
            memory_ == nullptr ? " (registration failed: " + why + ")" : " (registration failed on another rank)";
        if (memory_) memory_->release_registration();
        memory_.reset();
      }
    } else if (layout_.zero_copy_combine) {
      registration_note_ =
          api_->can_register() ? " (MOE_EP_NCCL_REGISTER=0 on some rank)" : " (this NCCL has no ncclCommRegister)";
    }
    run_then_agree(bootstrap, [&] {
      if (!memory_) memory_ = NcclWorkspaceMemory::plain(total_bytes_);
    });
  }

  void prepare_workspace() {
    const DeviceGuard guard(device_);
    for (size_t k = 0; k < slots_.size(); ++k) {
      char* base = workspace() + k * plan_.total_bytes;
      slots_[k].buffers = nccl_buffers_at(base, plan_, layout_);
      slots_[k].expert = nccl_expert_rows_at(base, plan_, layout_);
      slots_[k].expert_combine_rows = layout_.expert_layout() ? base + plan_.expert_combine_rows : nullptr;
      slots_[k].view = layout_.zero_copy_combine ? base + plan_.combine_input : nullptr;
      slots_[k].wire = nccl_wire_buffers_at(base, plan_, layout_);
    }
    // (This also leaves the expansion's ticket zero, as its first call needs.)
    check_cuda(cudaMemsetAsync(workspace(), 0, total_bytes_, private_stream_), "zeroing the workspace");
    for (NcclSlot& slot : slots_) reset_device_errors(slot);
  }

  static bool all_ranks(const Bootstrap& bootstrap, bool mine) {
    const std::vector<int32_t> all = bootstrap.allgather_value(static_cast<int32_t>(mine ? 1 : 0));
    return std::all_of(all.begin(), all.end(), [](int32_t v) { return v == 1; });
  }

  char* workspace() const { return memory_->base(); }

  // One tiny exchange with every peer, so that NCCL sets up its connections
  // here (bounded by timeout_ms) and not inside a dispatch or a graph capture.
  void connect_peers() {
    const DeviceGuard guard(device_);
    const kernels::NcclBuffers& b = slots_[0].buffers;
    group_start();
    for (int32_t p = 0; p < layout_.world_size; ++p) {
      if (p == layout_.rank) continue;
      send(b.send_segments + p * plan_.send_segment_stride, sizeof(int32_t), p, private_stream_);
      recv(b.recv_meta + p * plan_.meta_stride, sizeof(int32_t), p, private_stream_);
    }
    group_end();
    slots_[0].own_work->note(private_stream_);
    wait_for_own_work();
    check_cuda(cudaMemsetAsync(workspace(), 0, plan_.recv_counts, private_stream_), "zeroing the headers");
    check_cuda(cudaStreamSynchronize(private_stream_), "zeroing the headers");
  }

  NcclSlot& slot_at(int32_t index) { return slots_[static_cast<size_t>(index)]; }

  // Dispatch up to and including the NCCL group, on `s`: route, then the
  // peers' rows packed first with every SM and nothing else running (NCCL
  // waits for them); then the own rows packed on the side stream with a
  // quarter of the SMs while NCCL moves the peers' rows (the transfer leaves
  // most of the memory bandwidth unused), joined back into `s` so that a
  // capture of this work alone is complete.
  void post_dispatch(NcclSlot& slot, const DispatchCall& call, cudaStream_t s) {
    const int32_t tpr = call.tokens_per_rank;
    kernels::NcclDispatchLaunch a{};
    a.num_tokens = call.num_tokens;
    a.tokens_per_rank = tpr;
    a.hidden = call.hidden;
    a.topk_ids = call.topk_ids;
    a.topk_weights = call.topk_weights;
    a.scales = call.scales;
    a.eplb_local = call.eplb_local;
    a.max_blocks = sm_budget_;
    if (dispatch_profile_) dispatch_profile_->begin(s);
    if (layout_.fp8_dispatch()) {
      // The caller's rows quantized into the slot's staging rows, which the
      // pack then moves as the rows (codes) and the scales (the metadata).
      quantize_dispatch_rows(slot, call, s);
      a.hidden = slot.wire.codes;
      a.scales = slot.wire.scales;
    }
    check_cuda(kernels::launch_nccl_dispatch_route(shape_, slot.buffers, a, s), "launching the NCCL dispatch routing");
    if (dispatch_profile_) dispatch_profile_->mark(s);
    const NcclChunkPlan plan = plan_nccl_chunks(tpr, layout_.world_size > 1 ? dispatch_chunks_ : 1);
    if (plan.count == 1) {
      check_cuda(kernels::launch_nccl_dispatch_pack(shape_, slot.buffers, a, kernels::kPackPeers, 0, tpr, s),
                 "launching the NCCL dispatch pack (peer rows)");
      if (dispatch_profile_) dispatch_profile_->mark(s);
      fork(slot, s, slot.side_stream);
      pack_own_rows(slot, a, own_pack_blocks(), slot.side_stream);
      exchange_dispatch_rows(slot, tpr, plan.ranges[0], true, s);
      if (dispatch_profile_) dispatch_profile_->mark(s);
      join(slot, slot.side_stream, s);
    } else {
      pipeline_dispatch(slot, a, plan, s);
    }
  }

  // After the group, on `s`: the headers checked, the counts and the
  // received metadata moved into the results; in an expert layout, the
  // rank-major receive then expanded into the slot's expert rows (in the
  // profile's last stage).
  void finish_dispatch(NcclSlot& slot, int32_t tpr, bool has_weights, cudaStream_t s) {
    check_cuda(kernels::launch_nccl_dispatch_finish(shape_, slot.buffers, tpr, sm_budget_, s),
               "launching the NCCL dispatch finish");
    if (slot.wire.dequantized != nullptr) dequantize_received_rows(slot, tpr, s);
    if (layout_.expert_layout()) {
      check_cuda(kernels::launch_expand_to_expert_rows(expert_shape_, rank_major_receive(slot, tpr, has_weights),
                                                       slot.expert, sm_budget_, /*pdl=*/0, s),
                 "launching the expansion into expert rows");
    }
    if (dispatch_profile_) dispatch_profile_->mark(s);
  }

  // Bytes of a dispatch row as it crosses (an FP8 wire's codes: hidden_row_elems).
  uint64_t wire_row_bytes() const { return static_cast<uint64_t>(shape_.hidden_row_bytes); }

  // The rank-major result rows: an FP8 wire's codes and scales as they
  // arrived, or with dispatch_dequantize the rows back in hidden_dtype
  // without scales.
  char* received_hidden(const NcclSlot& slot) const {
    return slot.wire.dequantized != nullptr ? slot.wire.dequantized : slot.buffers.recv_hidden;
  }
  char* received_scales(const NcclSlot& slot) const {
    return slot.wire.dequantized != nullptr ? nullptr : slot.buffers.recv_scales;
  }

  // FP8 dispatch wire, first on `s`: the caller's num_tokens rows into e4m3
  // codes [T, R] and fp32 scales [T, ceil(R / 128)] in the slot's staging rows.
  void quantize_dispatch_rows(const NcclSlot& slot, const DispatchCall& call, cudaStream_t s) const {
    kernels::WireRowSet rows{};
    rows.rows = call.num_tokens;
    check_cuda(
        kernels::launch_quantize_rows(dispatch_quantize_rows(layout_, call.hidden, slot.wire.codes, slot.wire.scales),
                                      rows, sm_budget_, /*pdl=*/0, s),
        "launching the FP8 quantization of the dispatch rows");
  }

  // FP8 dispatch wire with dispatch_dequantize, after the finish kernel on
  // `s`: the received rows of every source (recv_counts of them) back in
  // hidden_dtype, into the slot's dequantized rows.
  void dequantize_received_rows(const NcclSlot& slot, int32_t tpr, cudaStream_t s) const {
    check_cuda(kernels::launch_dequantize_rows(
                   dispatch_dequantize_rows(layout_, slot.buffers.recv_hidden, slot.buffers.recv_scales,
                                            slot.wire.dequantized),
                   received_row_set(slot.buffers.recv_counts, layout_.world_size, tpr), sm_budget_, /*pdl=*/0, s),
               "launching the FP8 dequantization of the received rows");
  }

  // FP8 combine wire, on `s`: the rank-major rows this rank sends (each
  // source's recv_counts rows of `rows`, the own segment included, so that
  // the sum does not depend on which rank is local) quantized over
  // hidden_size into the slot's wire rows, which combine then moves and
  // reduces instead.  Returns them.
  const char* quantize_combine_rows(const NcclSlot& slot, const void* rows, int32_t tpr, cudaStream_t s) const {
    const kernels::WireQuantizeRows q = combine_quantize_rows(layout_, rows, slot.wire.combine_rows);
    check_cuda(kernels::launch_quantize_rows(q, received_row_set(slot.buffers.recv_counts, layout_.world_size, tpr),
                                             sm_budget_, /*pdl=*/0, s),
               "launching the FP8 quantization of the combine rows");
    return slot.wire.combine_rows;
  }

  // The slot's rank-major receive as the expert layouts' kernels read it:
  // the weights only where the call passed them (every row weight 1.0 else).
  kernels::RankMajorReceive rank_major_receive(const NcclSlot& slot, int32_t tpr, bool has_weights) const {
    kernels::RankMajorReceive in{};
    in.tokens_per_rank = tpr;
    in.hidden = received_hidden(slot);
    in.scales = received_scales(slot);
    in.ids = slot.buffers.recv_ids;
    in.weights = has_weights ? slot.buffers.recv_weights : nullptr;
    in.recv_counts = slot.buffers.recv_counts;
    in.source_tokens = slot.buffers.recv_tokens;
    return in;
  }

  DispatchBuffers dispatch_results(const NcclSlot& slot, bool has_weights) const {
    DispatchBuffers b;
    b.hidden = received_hidden(slot);
    b.topk_ids = slot.buffers.recv_ids;
    b.topk_weights = has_weights ? slot.buffers.recv_weights : nullptr;
    b.scales = received_scales(slot);
    b.recv_counts = slot.buffers.recv_counts;
    b.local_expert_counts = slot.buffers.local_expert_counts;
    b.eplb_gathered = slot.buffers.eplb_gathered;
    b.combine_input = slot.view;    // combine_rows(max_tpr) rows: the expert layout's shape there
    if (layout_.expert_layout()) {  // as the HOST backend returns them
      const kernels::ExpertRowsBuffers& x = slot.expert;
      b.hidden = x.hidden;
      b.scales = x.scales;
      b.topk_ids = nullptr;
      b.topk_weights = nullptr;
      b.expert_counts = x.counts;
      b.expert_offsets = layout_.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED ? x.offsets : nullptr;
      b.row_sources = x.sources;
      b.row_weights = x.weights;
      b.dropped_pairs = x.dropped;
    }
    return b;
  }

  // Expert layouts, before combine's exchange: the weighted reduction of the
  // caller's expert rows (call.expert_output, or the slot's view, read in
  // place) into one rank-major row per received token, in the slot's
  // expert_combine_rows, on `s`.  Those rows lie in the workspace, so
  // combine's sends read them there, registered or not, and its reduction
  // reads the own rows there too.
  const char* fold_expert_rows(NcclSlot& slot, const CombineCall& call, cudaStream_t s) {
    check_cuda(kernels::launch_reduce_expert_rows(expert_shape_, rank_major_receive(slot, call.tokens_per_rank, false),
                                                  slot.expert, call.expert_output, slot.expert_combine_rows, sm_budget_,
                                                  /*pdl=*/0, s),
               "launching the reduction of expert rows");
    return slot.expert_combine_rows;
  }

  // What combine's NCCL sends read: the caller's expert_output, or with
  // registered buffers always the slot's view (both sides of every NCCL
  // transfer must be registered), the peers' segments copied there first
  // when the caller's expert_output is elsewhere.  Expert layouts: the
  // folded rows (fold_expert_rows), in the workspace either way.
  const char* combine_source(NcclSlot& slot, const CombineCall& call, cudaStream_t s) {
    if (layout_.fp8_combine()) {
      // The quantized rows, in the workspace (registered or not).
      const void* rows = layout_.expert_layout() ? fold_expert_rows(slot, call, s) : call.expert_output;
      return quantize_combine_rows(slot, rows, call.tokens_per_rank, s);
    }
    if (layout_.expert_layout()) return fold_expert_rows(slot, call, s);
    const char* expert_output = static_cast<const char*>(call.expert_output);
    if (!memory_->is_registered()) return expert_output;
    if (!call.expert_output_is_workspace) {
      copy_peer_segments(slot.view, expert_output, layout_.rank, layout_.world_size,
                         static_cast<size_t>(call.tokens_per_rank) * static_cast<size_t>(layout_.combine_row_bytes), s);
    }
    return slot.view;
  }

  // Copies this rank's own segment of `expert_output` (rows rank x tpr ..)
  // to the same rows of the slot's combine_in, which NCCL never writes (no
  // transfer to itself), and returns combine_in: the reduction reads the
  // same bytes from there.
  const char* stage_own_rows(NcclSlot& slot, const char* expert_output, int64_t tpr, cudaStream_t s) {
    const size_t segment = static_cast<size_t>(tpr) * static_cast<size_t>(layout_.combine_row_bytes);
    const size_t at = static_cast<size_t>(layout_.rank) * segment;
    if (segment != 0) {
      check_cuda(
          cudaMemcpyAsync(slot.buffers.combine_in + at, expert_output + at, segment, cudaMemcpyDeviceToDevice, s),
          "staging this rank's expert_output rows for combine");
    }
    return slot.buffers.combine_in;
  }

  // The reduction of every token alone with every SM, on `s`.
  void reduce(const NcclSlot& slot, kernels::NcclCombineLaunch a, cudaStream_t s) {
    a.token_begin = 0;
    a.token_end = a.num_tokens;
    a.max_blocks = sm_budget_;
    check_cuda(kernels::launch_nccl_combine_reduce(shape_, slot.buffers, a, s), "launching the NCCL combine reduction");
  }

  // The end of a send half on `s`: an event for its receive half, and the
  // handle's record of its work (the bounded waits cover each half).
  void sent(NcclSlot& slot, cudaStream_t s) {
    check_cuda(cudaEventRecord(slot.sent_event, s), "cudaEventRecord");
    slot.sent_stream = s;
    slot.sent_capture = capture_of(s);
    slot.own_work->note(s);
  }

  // A receive half on `s` runs after its send half's work: by stream order
  // on the same stream, else by the send half's event where both are eager
  // or in one capture.  (Between an eager half and a captured one, or two
  // captures, the caller orders them: an event of one capture cannot be
  // waited on outside it.)
  void after_send(const NcclSlot& slot, cudaStream_t s) {
    if (s == slot.sent_stream || slot.sent_capture == kNoCapture || capture_of(s) != slot.sent_capture) return;
    check_cuda(cudaStreamWaitEvent(s, slot.sent_event, 0), "cudaStreamWaitEvent");
  }

  // Dispatch in row ranges: the peers' rows of range c are packed on the
  // caller's stream, then NCCL moves them on the slot's NCCL stream while the
  // caller's stream packs range c + 1.  The first range packs alone with
  // every SM; the later ranges, then the own rows (needed only by the finish
  // kernel), run one kernel at a time next to NCCL's with half the SMs.  The
  // metadata blocks (headers, ids, weights, scales: small, complete only
  // after the last pack) travel with the last range; the earlier groups move
  // hidden rows only.
  void pipeline_dispatch(NcclSlot& slot, const kernels::NcclDispatchLaunch& a, const NcclChunkPlan& plan,
                         cudaStream_t s) {
    kernels::NcclDispatchLaunch peers = a;
    for (int32_t c = 0; c < plan.count; ++c) {
      const NcclRowRange& r = plan.ranges[c];
      peers.max_blocks = c == 0 ? sm_budget_ : overlap_blocks();
      check_cuda(
          kernels::launch_nccl_dispatch_pack(shape_, slot.buffers, peers, kernels::kPackPeers,
                                             static_cast<int32_t>(r.first), static_cast<int32_t>(r.first + r.rows), s),
          "launching the NCCL dispatch pack (peer rows of a range)");
      // (range 0: forks the NCCL stream from the caller's stream)
      signal(s, slot.range_events[c], slot.nccl_stream);
      exchange_dispatch_rows(slot, a.tokens_per_rank, r, c + 1 == plan.count, slot.nccl_stream);
    }
    pack_own_rows(slot, a, overlap_blocks(), s);
    if (dispatch_profile_) dispatch_profile_->mark(s);  // packing done; "nccl" = what is left of the transfer
    join(slot, slot.nccl_stream, s);
    if (dispatch_profile_) dispatch_profile_->mark(s);
  }

  // Combine in row ranges (the fused call): NCCL moves range c on the slot's
  // NCCL stream; the caller's stream sums the tokens range c completes while
  // NCCL moves range c + 1, with half the SMs so that NCCL's kernels find
  // room, and the last range (on the critical path) with every SM.
  void pipeline_combine(NcclSlot& slot, kernels::NcclCombineLaunch a, const char* expert_output, int64_t tpr,
                        const NcclChunkPlan& plan, cudaStream_t s) {
    fork(slot, s, slot.nccl_stream);
    for (int32_t c = 0; c < plan.count; ++c) {
      exchange_combine_rows(slot, expert_output, tpr, plan.ranges[c], slot.nccl_stream);
      signal(slot.nccl_stream, slot.range_events[c], s);
      const NcclTokenRange tokens = nccl_tokens_complete_after(plan, c, a.num_tokens);
      if (tokens.begin == tokens.end) continue;
      a.token_begin = tokens.begin;
      a.token_end = tokens.end;
      // The reduction runs up to 2 x max_blocks blocks: overlap_blocks() / 2 keeps it to overlap_blocks().
      a.max_blocks = c + 1 == plan.count ? sm_budget_ : std::max(1, overlap_blocks() / 2);
      check_cuda(kernels::launch_nccl_combine_reduce(shape_, slot.buffers, a, s),
                 "launching the NCCL combine reduction");
    }
    join(slot, slot.nccl_stream, s);  // (already ordered by the last range's event; a capture must join what it forked)
  }

  void pack_own_rows(const NcclSlot& slot, const kernels::NcclDispatchLaunch& a, int32_t blocks, cudaStream_t side) {
    kernels::NcclDispatchLaunch own = a;
    own.max_blocks = blocks;
    check_cuda(
        kernels::launch_nccl_dispatch_pack(shape_, slot.buffers, own, kernels::kPackOwn, 0, a.tokens_per_rank, side),
        "launching the NCCL dispatch pack (own rows)");
  }

  // One NCCL group on `s`: hidden rows [r.first, r.first + r.rows) of every
  // peer's segment, straight into the result rows; with `with_metadata` also
  // the segment's metadata block (header, ids, weights, scales; the finish
  // kernel moves it into the results).  A block rides in its rows' operation
  // where the receive rows leave room for it (kernels::nccl_meta_joins_rows:
  // at 2 ranks, every peer), otherwise it is one more send and receive per
  // peer.  Both sides decide from the source's rank, so the operations pair up.
  void exchange_dispatch_rows(const NcclSlot& slot, int32_t tpr, const NcclRowRange& r, bool with_metadata,
                              cudaStream_t s) {
    const kernels::NcclBuffers& b = slot.buffers;
    in_call_order(s);
    group_start();
    for (int32_t p = 0; p < layout_.world_size; ++p) {
      if (p == layout_.rank) continue;  // the own segment was written in place
      const char* segment = b.send_segments + p * plan_.send_segment_stride;
      transfer_segment(layout_.rank, segment + kernels::nccl_send_rows_offset(shape_),
                       segment + kernels::nccl_send_meta_offset(shape_, tpr), tpr, r, with_metadata, p, true, s);
      char* rows = b.recv_hidden + static_cast<uint64_t>(p) * static_cast<uint64_t>(tpr) * wire_row_bytes();
      const int64_t at = kernels::nccl_recv_meta_offset(shape_, p, tpr);
      char* meta = at == -1 ? b.recv_meta + p * plan_.meta_stride : b.recv_hidden + at;
      transfer_segment(p, rows, meta, tpr, r, with_metadata, p, false, s);
    }
    group_end();
    posted(s);
  }

  // The operations of one segment of source `src` (this rank when sending,
  // the peer when receiving): rows [r.first, r.first + r.rows) from/to
  // `rows` (the segment's row 0) and, with `with_metadata`, the block at
  // `meta`.  The block goes first where it is its own operation, so that a
  // peer that posted other sizes (a different runtime max) still finds the
  // header where it looks; where it joins the rows, the tag in the header
  // tells a header from row bytes.
  void transfer_segment(int32_t src, const char* rows, const char* meta, int32_t tpr, const NcclRowRange& r,
                        bool with_metadata, int32_t peer, bool sending, cudaStream_t s) {
    const uint64_t row_bytes = wire_row_bytes();
    const uint64_t first = static_cast<uint64_t>(r.first) * row_bytes,
                   bytes = static_cast<uint64_t>(r.rows) * row_bytes;
    const uint64_t meta_bytes = static_cast<uint64_t>(kernels::nccl_meta_bytes(shape_, tpr));
    const bool joined = with_metadata && kernels::nccl_meta_joins_rows(shape_, src);
    const bool after = kernels::nccl_meta_after_rows(shape_, src);
    auto move = [&](const char* data, uint64_t n) {
      if (sending) {
        send(data, n, peer, s);
      } else {
        recv(const_cast<char*>(data), n, peer, s);
      }
    };
    if (joined && after && r.first + r.rows == tpr) {  // [rows | block]: the block starts where the rows end
      move(rows + first, bytes + meta_bytes);
    } else if (joined && !after && r.first == 0 && r.rows == tpr) {  // [block | rows], the block 256-byte rounded
      const uint64_t span = static_cast<uint64_t>(kernels::nccl_meta_lead(shape_, tpr));
      move(rows - span, span + bytes);
    } else {
      if (with_metadata) move(meta, meta_bytes);
      move(rows + first, bytes);
    }
  }

  // Combine rows [r.first, r.first + r.rows) of every peer's segment: the
  // caller's expert_output is already rank-major, sent as it is (an FP8
  // combine wire: the slot's quantized rows); the peer's rows for this rank
  // land in the slot's combine_in.  One NCCL group on `s`.
  void exchange_combine_rows(const NcclSlot& slot, const char* expert_output, int64_t tpr, const NcclRowRange& r,
                             cudaStream_t s) {
    const uint64_t row_bytes = static_cast<uint64_t>(kernels::nccl_combine_transfer_row_bytes(shape_));
    in_call_order(s);
    group_start();
    for (int32_t p = 0; p < layout_.world_size; ++p) {
      if (p == layout_.rank) continue;  // the own rows are read in place by the reduction
      const uint64_t row = static_cast<uint64_t>(p * tpr + r.first);
      send(expert_output + row * row_bytes, r.rows * row_bytes, p, s);
      recv(slot.buffers.combine_in + row * row_bytes, r.rows * row_bytes, p, s);
    }
    group_end();
    posted(s);
  }

  // `to` waits for the work issued on `from` so far.  Events, so that a CUDA
  // graph capture follows every fork and join; a capture must join into the
  // caller's stream everything it forked from it.
  void signal(cudaStream_t from, cudaEvent_t event, cudaStream_t to) {
    check_cuda(cudaEventRecord(event, from), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(to, event, 0), "cudaStreamWaitEvent");
  }
  void fork(NcclSlot& slot, cudaStream_t stream, cudaStream_t side) { signal(stream, slot.fork_event, side); }
  void join(NcclSlot& slot, cudaStream_t side, cudaStream_t stream) { signal(side, slot.join_event, stream); }
  // Blocks of the own rows' pack, which runs next to NCCL's transfer: about
  // 1 TB/s of copying (a quarter of the SMs) ends it well inside the transfer
  // at 4096 tokens while leaving NCCL SMs and most of the memory bandwidth.
  int32_t own_pack_blocks() const { return sm_budget_ > 8 ? sm_budget_ / 4 : sm_budget_; }
  // A pipelined call runs one kernel at a time next to NCCL's (a range's pack
  // or reduction) with at most this many blocks: a 512-thread block of ours and
  // one of NCCL's may not fit one SM together (registers), and our blocks stay
  // resident for the whole kernel, so NCCL's next group must find SMs that
  // none of ours occupies.
  int32_t overlap_blocks() const { return std::max(1, sm_budget_ / 2); }

  // NCCL's groups run in the order they were posted, whatever streams the
  // caller gives the halves of two micro-batches: NCCL promises no progress to
  // two operations of one communicator in flight at once, so a group posted
  // on another stream than the previous one waits for it (both eager or in
  // one capture; otherwise the caller orders the streams).  On one stream,
  // stream order already does it.
  void in_call_order(cudaStream_t s) {
    if (s == last_group_stream_ || last_group_capture_ == kNoCapture || capture_of(s) != last_group_capture_) return;
    check_cuda(cudaStreamWaitEvent(s, last_group_, 0), "cudaStreamWaitEvent");
  }
  void posted(cudaStream_t s) {
    check_cuda(cudaEventRecord(last_group_, s), "cudaEventRecord");
    last_group_stream_ = s;
    last_group_capture_ = capture_of(s);
  }

  void group_start() { comm_->complete("ncclGroupStart", api_->GroupStart()); }
  void group_end() { comm_->complete("ncclGroupEnd", api_->GroupEnd()); }
  void send(const void* data, uint64_t bytes, int32_t peer, cudaStream_t s) {
    comm_->complete("ncclSend", api_->Send(data, bytes, nccl::kInt8, peer, comm_->get(), s));
  }
  void recv(void* data, uint64_t bytes, int32_t peer, cudaStream_t s) {
    comm_->complete("ncclRecv", api_->Recv(data, bytes, nccl::kInt8, peer, comm_->get(), s));
  }

  // The handle refuses calls once it is broken (handle_health.hpp); this is
  // the communicator's own state, for a call that reaches it after an abort.
  void refuse_after_abort() {
    if (comm_ == nullptr || comm_->aborted()) {
      fail(MOE_EP_ERROR_INVALID_STATE, "the NCCL communicator of this handle was aborted; destroy the handle");
    }
  }

  // Waits for this handle's work, bounded by timeout_ms: NCCL's kernels wait
  // for peers without a bound of their own, so when the deadline passes (or
  // NCCL reports an error) the communicator is aborted, which makes them exit,
  // and the call fails with TIMEOUT, which breaks the handle (sticky).
  void wait_for_own_work() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(config_.timeout_ms);
    while (true) {
      const cudaError_t q = query_own_work();
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, "waiting for the handle's work");
      const nccl::Result nccl_state = comm_->async_error();
      const bool expired = std::chrono::steady_clock::now() > deadline;
      if ((nccl_state != nccl::kSuccess && nccl_state != nccl::kInProgress) || expired) {
        const std::string what =
            expired ? "no completion within timeout_ms = " + std::to_string(config_.timeout_ms)
                    : "NCCL reported " + std::string(api_->GetErrorString(nccl_state));
        comm_->abort();  // NCCL's kernels exit
        abandon_work(MOE_EP_ERROR_TIMEOUT, "dispatch/combine on rank " + std::to_string(layout_.rank) + ": " + what +
                                               " (a peer died, stalled, or issued different calls); the NCCL "
                                               "communicator was aborted; destroy this handle");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Every slot's last eager half and graph replay (gpu/own_work.hpp): waiting
  // for the handle's work waits for this handle only, every half of every
  // slot included, whatever streams they ran on.
  cudaError_t query_own_work() const noexcept {
    for (const NcclSlot& slot : slots_) {
      if (!slot.own_work) continue;  // create stopped before it
      const cudaError_t q = slot.own_work->query();
      if (q != cudaSuccess) return q;
    }
    return cudaSuccess;
  }

  // The wait for the handle's work gave up: shutdown does not wait again.
  [[noreturn]] void abandon_work(moe_ep_status_t status, const std::string& message) {
    own_work_abandoned_ = true;
    throw Error(status, message);
  }

  void reset_device_errors(const NcclSlot& slot) {
    kernels::NcclDeviceErrors cleared{};
    cleared.bad_id_first = ~uint64_t{0};
    cleared.bad_peer_first = std::numeric_limits<int32_t>::max();
    write_to_device(slot.buffers.errors, &cleared, sizeof(cleared), private_stream_,
                    "clearing the device error record");
  }

  std::string bad_ids_message(const kernels::NcclDeviceErrors& e) const {
    const uint64_t position = e.bad_id_first >> 32;
    const int32_t value = static_cast<int32_t>(static_cast<uint32_t>(e.bad_id_first & 0xFFFFFFFFu));
    return "dispatch on rank " + std::to_string(layout_.rank) + ": " + std::to_string(e.bad_id_count) +
           " topk_ids outside [0, " + std::to_string(layout_.num_experts) + ") and not invalid_expert_id (" +
           std::to_string(layout_.invalid_expert_id) + "), first at token " +
           std::to_string(position / layout_.top_k) + " pick " + std::to_string(position % layout_.top_k) + ": " +
           std::to_string(value) + "; those picks were dropped";
  }

  std::string bad_peer_message(const kernels::NcclDeviceErrors& e) const {
    return "dispatch on rank " + std::to_string(layout_.rank) + ": rank " + std::to_string(e.bad_peer_first) +
           " sent a segment for tokens_per_rank " + std::to_string(e.bad_peer_tpr) + " holding " +
           std::to_string(e.bad_peer_rows) +
           " rows, which does not fit this rank's tokens_per_rank (runtime_max_tokens_per_rank must be the same on "
           "every rank); its rows were dropped (" +
           std::to_string(e.bad_peer_count) + " segment(s) rejected)";
  }

  Layout layout_;
  moe_ep_config_t config_;
  Bootstrap bootstrap_;       // valid until destroy (moe_ep_bootstrap_t): set_active_ranks agrees through it
  uint64_t staged_mask_ = 0;  // set_active_ranks' host copy of the routing word
  const nccl::Api* api_ = nullptr;
  int device_ = 0;
  int sm_budget_ = 0;
  kernels::NcclShape shape_{};
  kernels::ExpertLayoutShape expert_shape_{};    // expert layouts only
  NcclWorkspacePlan plan_{};                     // one slot's
  uint64_t total_bytes_ = 0;                     // every slot's: the allocation
  std::unique_ptr<NcclCommunicator> comm_;       // shared by the slots
  std::unique_ptr<NcclWorkspaceMemory> memory_;  // registered with NCCL or plain
  std::string registration_note_;                // why the workspace is not registered, for the log
  std::vector<NcclSlot> slots_;                  // config->micro_batches of them
  cudaStream_t private_stream_ = nullptr;
  cudaEvent_t last_group_ = nullptr;  // after the last NCCL group a call posted
  cudaStream_t last_group_stream_ = nullptr;
  unsigned long long last_group_capture_ = kNoCapture;  // (kNoCapture until a call posts one)
  int32_t dispatch_chunks_ = 1;                 // MOE_EP_NCCL_DISPATCH_CHUNKS
  int32_t combine_chunks_ = 1;                  // MOE_EP_NCCL_COMBINE_CHUNKS
  std::unique_ptr<NcclStageProfile> dispatch_profile_, combine_profile_;  // MOE_EP_NCCL_PROFILE=1
  bool own_work_abandoned_ = false;  // wait_for_own_work timed out and aborted the communicator
  bool released_ = false;
};

}  // namespace

bool nccl_platform_supported(int32_t device, std::string* why) {
  std::string reason;
  const bool loaded = nccl::load(&reason) != nullptr;
  int count = 0;
  std::string gpu;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    gpu = cuda_driver_missing();  // the runtime's "driver version is insufficient" also means no driver
    if (gpu.empty()) gpu = "no CUDA device in this process";
  } else if (device < -1 || device >= count) {
    gpu = "device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " devices)";
  }
  if (loaded && gpu.empty()) return true;
  if (why != nullptr) *why = gpu.empty() ? reason : reason.empty() ? gpu : gpu + "; " + reason;
  return false;
}

uint64_t nccl_workspace_bytes(const Layout& layout, int32_t slots) {
  return nccl_workspace_total(plan_nccl_workspace(layout), slots);
}

std::unique_ptr<Backend> make_nccl_backend(const Layout& layout, const moe_ep_config_t& config,
                                           const Bootstrap& bootstrap) {
  return std::make_unique<NcclBackend>(layout, config, bootstrap);
}

}  // namespace moe_ep
