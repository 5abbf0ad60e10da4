#include "host_backend.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "checked_math.hpp"
#include "common/region_planner.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "expert_layout.hpp"
#include "input_errors.hpp"
#include "mask_agreement.hpp"
#include "reference_model.hpp"
#include "store/membership_change.hpp"
#include "store/rank_failure.hpp"
#include "wire_format.hpp"

namespace moe_ep {

namespace {

// Every region of a record, and the record itself, starts on this boundary, so
// that int32 and float fields of any rank's record are aligned in the gathered
// buffer whatever the row byte counts are (odd-byte fp8/fp4 rows included).
constexpr uint64_t kRecordAlignment = 16;

// The first exchange of a dispatch: what each rank is about to send.
struct DispatchHeader {
  uint64_t sequence;       // dispatch headers exchanged on this handle before this one
  uint64_t record_bytes;   // size of the sender's record
  int32_t tokens_per_rank; // the sender's runtime_max_tokens_per_rank (or max_tokens_per_rank)
  int32_t num_tokens;      // the sender's local_num_tokens
  int32_t has_weights;     // 0 or 1
  int32_t slot;            // the buffer slot (micro-batch) the sender dispatches into
};

// The start of each record: repeats the header so that a record that does not
// belong to the header just checked is caught.
struct RecordStamp {
  uint64_t sequence;
  int32_t num_tokens;
  uint32_t mask_epoch;  // the sender's active-rank mask updates (low 32 bits): the same mask on every rank
};

// What one rank contributes to a dispatch, packed into a fixed-size record so
// that a single allgather moves every rank's input.
struct RecordLayout {
  uint64_t ids_offset, weights_offset, hidden_offset, scales_offset, eplb_offset, size;

  RecordLayout(const Layout& l, int32_t tpr) {
    const uint64_t rows = static_cast<uint64_t>(tpr);
    const uint64_t picks = checked_mul(rows, static_cast<uint64_t>(l.top_k), "dispatch record picks");
    RegionPlanner record("dispatch record", kRecordAlignment, sizeof(RecordStamp));
    ids_offset = record.place(checked_mul(picks, sizeof(int32_t), "dispatch record ids"));
    weights_offset = record.place(checked_mul(picks, sizeof(float), "dispatch record weights"));
    hidden_offset = record.place(checked_mul(rows, l.hidden_row_bytes, "dispatch record hidden rows"));
    scales_offset = record.place(checked_mul(rows, l.scale_row_bytes, "dispatch record scale rows"));
    eplb_offset =
        record.place(checked_mul(static_cast<uint64_t>(l.num_experts), sizeof(int32_t), "dispatch record eplb"));
    size = record.end();
  }
};

std::string peer(int32_t rank) { return "rank " + std::to_string(rank); }

// An FP8 combine wire's bytes for `rows` rows of hidden_size elements: the
// e4m3 codes of every row, then (from a 16-byte boundary) their fp32 scales.
struct CombineWire {
  uint64_t rows, codes_bytes, scales_offset, size;
  int32_t blocks;

  CombineWire(const Layout& l, uint64_t rows_) : rows(rows_), blocks(wire_blocks(l.hidden_size)) {
    codes_bytes = checked_mul(rows, static_cast<uint64_t>(l.hidden_size), "combine wire codes");
    scales_offset =
        checked_add(codes_bytes, kRecordAlignment - 1, "combine wire") / kRecordAlignment * kRecordAlignment;
    size = checked_add(scales_offset, checked_mul(rows, uint64_t{sizeof(float)} * blocks, "combine wire scales"),
                       "combine wire");
  }
};

// One buffer slot (config->micro_batches): the results of one dispatch/combine
// pair, and what its halves hand each other.
struct HostSlot {
  std::vector<uint8_t> recv_hidden;
  std::vector<int32_t> recv_ids;
  std::vector<float> recv_weights;
  std::vector<uint8_t> recv_scales;
  std::vector<int32_t> recv_counts;
  std::vector<int32_t> local_expert_counts;
  std::vector<int32_t> eplb_gathered;
  std::vector<uint8_t> combine_output;
  std::vector<uint8_t> combine_input;  // the zero-copy combine input region (config->zero_copy_combine)
  std::vector<uint8_t> dequantized;    // dispatch_dequantize: the result rows back in hidden_dtype
  std::vector<int32_t> my_ids;         // this rank's routing of the slot's dispatch, for its combine
  // Expert layouts: the results, and each rank-major receive row's source
  // token (the rank-major buffers above are then the expansion's input).
  ExpertRows expert;
  std::vector<int32_t> source_tokens;

  // Between dispatch_send and dispatch_recv: the checked headers and this rank's packed record.
  std::vector<DispatchHeader> headers;
  std::vector<uint8_t> record;
  int32_t tokens_per_rank = 0;
  int32_t num_tokens = 0;
  bool has_weights = false;

  // Between combine_send and combine_recv: the expert output rows (staged, or the combine_input view).
  std::vector<uint8_t> staged_rows;
  const void* combine_rows = nullptr;
};

class HostBackend final : public Backend {
 public:
  HostBackend(const Layout& layout, int32_t slots, HostExchange exchange)
      : layout_(layout),
        wire_(wire_layout(layout)),
        exchange_(std::move(exchange.exchange)),
        store_(std::move(exchange.store)),
        fingerprint_(std::move(exchange.fingerprint)),
        mirror_(std::move(exchange.mirror)),
        slots_(static_cast<size_t>(slots)),
        active_(static_cast<size_t>(layout.world_size), 1) {
    if (store_) set_mask(store_->membership().active, 0);
    const uint64_t rows = static_cast<uint64_t>(layout_.receive_rows(layout_.max_tokens_per_rank));
    const uint64_t picks = checked_mul(rows, static_cast<uint64_t>(layout_.top_k), "receive picks");
    for (HostSlot& slot : slots_) {
      slot.recv_hidden.resize(bytes(checked_mul(rows, wire_.hidden_row_bytes, "receive hidden rows")));
      slot.recv_ids.resize(bytes(picks));
      slot.recv_weights.resize(bytes(picks));
      slot.recv_scales.resize(bytes(checked_mul(rows, wire_.scale_row_bytes, "receive scale rows")));
      if (layout_.fp8_dispatch() && layout_.dispatch_dequantize) {
        const uint64_t result_rows =
            layout_.expert_layout() ? static_cast<uint64_t>(layout_.expert_layout_rows()) : rows;
        slot.dequantized.resize(bytes(checked_mul(result_rows, layout_.hidden_row_bytes, "dequantized rows")));
      }
      slot.recv_counts.resize(layout_.world_size);
      slot.local_expert_counts.resize(layout_.experts_per_rank());
      if (layout_.eplb_stats) {
        slot.eplb_gathered.resize(bytes(checked_mul(static_cast<uint64_t>(layout_.world_size),
                                                    static_cast<uint64_t>(layout_.num_experts), "eplb stats")));
      }
      slot.combine_output.resize(bytes(checked_mul(static_cast<uint64_t>(layout_.max_tokens_per_rank),
                                                   layout_.combine_row_bytes, "combine output")));
      slot.combine_input.resize(bytes(combine_input_region_bytes(layout_)));  // empty unless zero_copy_combine
      if (layout_.expert_layout()) {
        allocate_expert_rows(wire_, slot.expert);
        slot.source_tokens.resize(bytes(rows));
      }
    }
  }

  const char* name() const override { return "host"; }
  moe_ep_device_t device() const override { return moe_ep_device_t{MOE_EP_DEVICE_CPU, 0}; }
  bool split_phases() const override { return true; }

  // The fused calls are exactly the two halves on slot 0.
  DispatchBuffers dispatch(const DispatchCall& call, void* stream) override {
    dispatch_send(0, call, stream);
    return dispatch_recv(0, stream);
  }

  void* combine(const CombineCall& call, void* stream) override {
    combine_send(0, call, stream);
    return combine_recv(0, call.output, stream);
  }

  // Announces the call to every peer (the header exchange: every rank checks
  // every header, so a mismatch fails here on every rank before any record
  // moves) and packs this rank's record: the caller's inputs are free when it returns.
  void dispatch_send(int32_t slot_index, const DispatchCall& call, void* /*stream*/) override {
    paths.note(MOE_EP_PHASE_DISPATCH, MOE_EP_PATH_HOST, layout_.rank);
    HostSlot& slot = slots_[static_cast<size_t>(slot_index)];
    const RecordLayout rec(wire_, call.tokens_per_rank);
    std::vector<DispatchHeader> headers = exchange_headers(slot_index, call, rec);
    record_bad_ids(call);
    const size_t picks = static_cast<size_t>(call.num_tokens) * layout_.top_k;
    // Under a mask this rank routes as if the inactive ranks' experts did not
    // exist (and an inactive rank routes nothing): the record, the library's
    // EPLB count and combine's routing all see the masked picks.
    std::vector<int32_t> my_ids(call.topk_ids, call.topk_ids + picks);
    DispatchCall routed = call;
    if (!all_active_) {
      mask_picks(my_ids.data(), static_cast<int64_t>(picks), active_[static_cast<size_t>(layout_.rank)] != 0);
      routed.topk_ids = my_ids.data();
    }
    std::vector<uint8_t> record = pack_record(routed, rec);
    slot.headers = std::move(headers);
    slot.record = std::move(record);
    slot.my_ids = std::move(my_ids);  // combine needs this rank's routing after the caller reused its input
    slot.tokens_per_rank = call.tokens_per_rank;
    slot.num_tokens = call.num_tokens;
    slot.has_weights = call.has_weights;
  }

  // Exchanges the records announced by dispatch_send, checks each against its
  // header, and lays out the slot's receive rows.
  DispatchBuffers dispatch_recv(int32_t slot_index, void* /*stream*/) override {
    HostSlot& slot = slots_[static_cast<size_t>(slot_index)];
    const int32_t world = layout_.world_size;
    const RecordLayout rec(wire_, slot.tokens_per_rank);
    std::vector<uint8_t> all(bytes(checked_mul(rec.size, static_cast<uint64_t>(world), "dispatch records")));
    const std::vector<DispatchHeader> headers = std::move(slot.headers);
    const std::vector<uint8_t> mine = std::move(slot.record);
    slot.headers.clear();
    slot.record.clear();
    gather(mine.data(), all.data(), rec.size, "HOST dispatch: token records");

    std::vector<SourceTokens> sources(world);
    for (int32_t s = 0; s < world; ++s) {
      const uint8_t* r = all.data() + rec.size * s;
      // A rank masked out of the exchange sent nothing: its slot is zeros, num_tokens 0.
      if (takes_part(s)) check_stamp(s, r, headers[s]);
      if (!all_active_) {  // a peer's record is not trusted to be masked
        mask_picks(reinterpret_cast<int32_t*>(all.data() + rec.size * s + rec.ids_offset),
                   static_cast<int64_t>(headers[s].num_tokens) * layout_.top_k, active_[static_cast<size_t>(s)] != 0);
      }
      sources[s].num_tokens = headers[s].num_tokens;  // checked against tokens_per_rank
      sources[s].topk_ids = reinterpret_cast<const int32_t*>(r + rec.ids_offset);
      sources[s].topk_weights =
          headers[s].has_weights ? reinterpret_cast<const float*>(r + rec.weights_offset) : nullptr;
      sources[s].hidden = r + rec.hidden_offset;
      sources[s].scales = wire_.scale_row_bytes ? r + rec.scales_offset : nullptr;
      if (layout_.eplb_stats) {
        std::memcpy(slot.eplb_gathered.data() + static_cast<size_t>(s) * layout_.num_experts, r + rec.eplb_offset,
                    layout_.num_experts * sizeof(int32_t));
      }
    }

    ReceiveBuffers out;
    out.hidden = slot.recv_hidden.data();
    out.topk_ids = slot.recv_ids.data();
    // An expert layout reads every pick's weight (0 when none were passed; the expansion then uses 1).
    out.topk_weights = slot.has_weights || layout_.expert_layout() ? slot.recv_weights.data() : nullptr;
    out.scales = wire_.scale_row_bytes ? slot.recv_scales.data() : nullptr;
    out.recv_counts = slot.recv_counts.data();
    out.local_expert_counts = slot.local_expert_counts.data();
    reference_receive(wire_, slot.tokens_per_rank, sources, out);

    DispatchBuffers result;
    result.hidden = out.hidden;
    result.topk_ids = out.topk_ids;
    result.topk_weights = out.topk_weights;
    result.scales = out.scales;
    result.recv_counts = out.recv_counts;
    result.local_expert_counts = out.local_expert_counts;
    result.eplb_gathered = layout_.eplb_stats ? slot.eplb_gathered.data() : nullptr;
    result.combine_input = layout_.zero_copy_combine ? slot.combine_input.data() : nullptr;
    if (layout_.expert_layout()) expand(slot, sources, result);
    if (layout_.fp8_dispatch() && layout_.dispatch_dequantize) dequantize_result(slot, result);
    return result;
  }

  // Stages the expert output, so that the caller may reuse its tensor at once;
  // the slot's combine_input view is read in place by combine_recv.  No
  // exchange: it never waits for a peer.
  void combine_send(int32_t slot_index, const CombineCall& call, void* /*stream*/) override {
    paths.note(MOE_EP_PHASE_COMBINE, MOE_EP_PATH_HOST, layout_.rank);
    HostSlot& slot = slots_[static_cast<size_t>(slot_index)];
    const uint64_t rows = static_cast<uint64_t>(layout_.receive_rows(call.tokens_per_rank));
    const size_t per_rank = bytes(checked_mul(rows, layout_.combine_row_bytes, "combine rows"));
    if (layout_.expert_layout()) {
      // The weighted reduction of this rank's expert rows into one row per
      // received token: what the rank-major combine then sums over ranks.
      slot.staged_rows.assign(per_rank, 0);
      reduce_expert_rows(layout_, rank_major_receive(slot), slot.expert,
                         static_cast<const uint8_t*>(call.expert_output), slot.staged_rows.data());
      slot.combine_rows = slot.staged_rows.data();
    } else if (call.expert_output == slot.combine_input.data() && per_rank != 0) {
      slot.staged_rows.clear();
      slot.combine_rows = slot.combine_input.data();
    } else {
      const auto* src = static_cast<const uint8_t*>(call.expert_output);
      slot.staged_rows.assign(src, src + per_rank);
      slot.combine_rows = slot.staged_rows.data();
    }
    if (layout_.fp8_combine()) quantize_combine_rows(slot, rows);
    slot.tokens_per_rank = call.tokens_per_rank;
    slot.num_tokens = call.num_tokens;
  }

  // Exchanges every rank's expert output and reduces this rank's tokens.
  void* combine_recv(int32_t slot_index, void* output, void* /*stream*/) override {
    HostSlot& slot = slots_[static_cast<size_t>(slot_index)];
    const uint64_t rows = static_cast<uint64_t>(layout_.receive_rows(slot.tokens_per_rank));
    const CombineWire wire(layout_, rows);
    const uint64_t per_rank =
        layout_.fp8_combine() ? wire.size : checked_mul(rows, layout_.combine_row_bytes, "combine rows");
    std::vector<uint8_t> all(
        bytes(checked_mul(per_rank, static_cast<uint64_t>(layout_.world_size), "combine rows of every rank")));
    const std::vector<uint8_t> staged = std::move(slot.staged_rows);
    const void* rows_of_mine = slot.combine_rows == slot.combine_input.data() ? slot.combine_rows : staged.data();
    slot.staged_rows.clear();
    slot.combine_rows = nullptr;
    gather(rows_of_mine, all.data(), per_rank, "HOST combine: expert outputs");
    std::vector<const uint8_t*> outputs(layout_.world_size);
    for (int32_t r = 0; r < layout_.world_size; ++r) outputs[r] = all.data() + per_rank * r;
    uint8_t* out = output ? static_cast<uint8_t*>(output) : slot.combine_output.data();
    if (!layout_.fp8_combine()) {
      reference_combine(layout_, slot.tokens_per_rank, slot.num_tokens, slot.my_ids.data(), outputs, out);
      return out;
    }
    // FP8 combine wire: every rank's rows dequantized to fp32, then the same
    // ordered fp32 sum, rounded once to combine_dtype.
    Layout fp32 = layout_;
    fp32.combine_dtype = dtype_fp32();
    fp32.combine_row_bytes = static_cast<uint64_t>(layout_.hidden_size) * sizeof(float);
    const int64_t H = layout_.hidden_size;
    std::vector<std::vector<float>> dequantized(layout_.world_size);
    std::vector<const uint8_t*> fp32_outputs(layout_.world_size);
    for (int32_t r = 0; r < layout_.world_size; ++r) {
      std::vector<float>& d = dequantized[static_cast<size_t>(r)];
      d.resize(bytes(checked_mul(rows, static_cast<uint64_t>(H), "dequantized combine rows")));
      const uint8_t* codes = outputs[r];
      const auto* scales = reinterpret_cast<const float*>(outputs[r] + wire.scales_offset);
      for (uint64_t i = 0; i < rows; ++i) {
        dequantize_row_fp32(codes + i * H, scales + i * wire.blocks, H, d.data() + i * H);
      }
      fp32_outputs[r] = reinterpret_cast<const uint8_t*>(d.data());
    }
    std::vector<float> sum(
        bytes(checked_mul(static_cast<uint64_t>(slot.num_tokens), static_cast<uint64_t>(H), "combine sum")));
    reference_combine(fp32, slot.tokens_per_rank, slot.num_tokens, slot.my_ids.data(), fp32_outputs,
                      reinterpret_cast<uint8_t*>(sum.data()));
    for (int64_t i = 0; i < static_cast<int64_t>(sum.size()); ++i) {
      store_from_float(layout_.combine_dtype, out, i, sum[static_cast<size_t>(i)]);
    }
    return out;
  }

  moe_ep_status_t poll_async_error(std::string* message) override {
    const moe_ep_status_t s = async_status_;
    if (message) *message = async_message_;
    async_status_ = MOE_EP_SUCCESS;  // INVALID_INPUT is cleared once read
    async_message_.clear();
    return s;
  }

  // Agrees on the outcome of every rank's checks, then on the mask itself:
  // every rank compares every rank's mask with rank 0's, so all of them fail
  // (or succeed) with the same answer.
  void set_active_ranks(const std::vector<uint8_t>& active, moe_ep_status_t local_status,
                        const std::string& local_message) override {
    if (store_) {
      change_mask(active, local_status, local_message);
      return;
    }
    agree_on_mask(*exchange_, active, local_status, local_message, "HOST set_active_ranks: masks");
    set_mask(active, mask_epoch_ + 1);
  }

  // failure_policy MASK: the change runs through the store among the ranks
  // active before or after it (store/membership_change.hpp).  A rank that
  // joins (inactive now) first reads the group's newest mask.
  void change_mask(const std::vector<uint8_t>& active, moe_ep_status_t local_status, std::string local_message) {
    const size_t me = static_cast<size_t>(layout_.rank);
    if (local_status == MOE_EP_SUCCESS && !active_[me] && !active[me]) {  // stays out: nothing to agree on
      set_mask(active, mask_epoch_ + 1);
      return;
    }
    if (!active_[me]) refresh_membership();
    if (local_status == MOE_EP_SUCCESS) local_status = check_one_newcomer(active_, active, &local_message);
    const std::vector<uint8_t>& proposed = local_status == MOE_EP_SUCCESS ? active : active_;
    MembershipState now{active_, dispatch_sequence_, mask_epoch_};
    try {
      const MembershipState next = change_membership(*store_, now, proposed, local_status, local_message, fingerprint_);
      dispatch_sequence_ = next.dispatch_sequence;
      set_mask(next.active, next.mask_epoch);
    } catch (const RankFailure& f) {
      apply_failure(f);
      throw;
    }
  }

  // Joins the group as a replacement (config->rejoin): the change that the
  // survivors' moe_ep_set_active_ranks makes, seen from the new process.
  MembershipState join() {
    std::vector<uint8_t> proposed = active_;
    proposed[static_cast<size_t>(layout_.rank)] = 1;
    change_mask(proposed, MOE_EP_SUCCESS, "");
    return MembershipState{active_, dispatch_sequence_, mask_epoch_};
  }

  // Nothing to tell the peers; the exchange's destructor joins an idle worker
  // and leaves one stuck in a callback behind (see bounded_exchange.hpp).
  void shutdown() noexcept override {}

 private:
  static size_t bytes(uint64_t n) { return checked_size(n, "HOST backend buffer"); }

  // First exchange of a dispatch; every rank checks every rank's header the
  // same way, so a mismatch fails dispatch on every rank before any record moves.
  std::vector<DispatchHeader> exchange_headers(int32_t slot, const DispatchCall& call, const RecordLayout& rec) {
    DispatchHeader mine{};
    mine.sequence = dispatch_sequence_;
    mine.record_bytes = rec.size;
    mine.tokens_per_rank = call.tokens_per_rank;
    mine.num_tokens = call.num_tokens;
    mine.has_weights = call.has_weights ? 1 : 0;
    mine.slot = slot;
    std::vector<DispatchHeader> all(static_cast<size_t>(layout_.world_size));
    gather(&mine, all.data(), sizeof mine, "HOST dispatch: headers");
    ++dispatch_sequence_;  // every rank counts every header exchange, failed or not
    for (int32_t s = 0; s < layout_.world_size; ++s) {
      if (takes_part(s)) {
        check_header(s, all[s], mine);
      } else {
        all[s].num_tokens = 0;  // masked out of the exchange (failure_policy MASK): sends nothing
        all[s].has_weights = mine.has_weights;
      }
    }
    return all;
  }

  void check_header(int32_t s, const DispatchHeader& h, const DispatchHeader& mine) const {
    const std::string who = "dispatch on rank " + std::to_string(layout_.rank) + ": " + peer(s);
    if (h.sequence != mine.sequence) {
      fail(MOE_EP_ERROR_INVALID_INPUT, who, " is at dispatch #", h.sequence, ", this rank at #", mine.sequence,
           " (the ranks did not make the same calls)");
    }
    if (h.slot != mine.slot) {
      fail(MOE_EP_ERROR_INVALID_INPUT, who, " dispatches into slot ", h.slot, ", this rank into slot ", mine.slot,
           " (every rank must issue the same calls on the same slots, in the same order)");
    }
    if (h.tokens_per_rank != mine.tokens_per_rank) {
      fail(MOE_EP_ERROR_INVALID_INPUT, who, " uses tokens_per_rank ", h.tokens_per_rank, ", this rank ",
           mine.tokens_per_rank, " (args->runtime_max_tokens_per_rank must be the same on every rank)");
    }
    if (h.num_tokens < 0 || h.num_tokens > mine.tokens_per_rank) {
      fail(MOE_EP_ERROR_INVALID_INPUT, who, " sent num_tokens ", h.num_tokens, ", outside [0, tokens_per_rank = ",
           mine.tokens_per_rank, "]");
    }
    if (h.has_weights != 0 && h.has_weights != 1) {
      fail(MOE_EP_ERROR_INVALID_INPUT, who, " sent has_weights ", h.has_weights, ", expected 0 or 1");
    }
    if (h.record_bytes != mine.record_bytes) {
      fail(MOE_EP_ERROR_INVALID_INPUT, who, " sends records of ", h.record_bytes, " bytes, this rank expects ",
           mine.record_bytes, " (different parameters or library versions)");
    }
  }

  void check_stamp(int32_t s, const uint8_t* record, const DispatchHeader& h) const {
    RecordStamp stamp;
    std::memcpy(&stamp, record, sizeof(stamp));
    if (stamp.sequence != h.sequence || stamp.num_tokens != h.num_tokens) {
      fail(MOE_EP_ERROR_INVALID_INPUT, "dispatch on rank ", layout_.rank, ": ", peer(s),
           "'s record (dispatch #", stamp.sequence, ", num_tokens ", stamp.num_tokens,
           ") does not match its header (dispatch #", h.sequence, ", num_tokens ", h.num_tokens, ")");
    }
    if (stamp.mask_epoch != static_cast<uint32_t>(mask_epoch_)) {
      fail(MOE_EP_ERROR_INVALID_INPUT, "dispatch on rank ", layout_.rank, ": ", peer(s), " is at active-rank mask #",
           stamp.mask_epoch, ", this rank at #", static_cast<uint32_t>(mask_epoch_),
           " (every rank must make the same moe_ep_set_active_ranks calls)");
    }
  }

  std::vector<uint8_t> pack_record(const DispatchCall& call, const RecordLayout& rec) const {
    std::vector<uint8_t> record(bytes(rec.size), 0);
    const RecordStamp stamp{dispatch_sequence_ - 1, call.num_tokens, static_cast<uint32_t>(mask_epoch_)};
    std::memcpy(record.data(), &stamp, sizeof(stamp));
    const uint64_t T = static_cast<uint64_t>(call.num_tokens);
    const uint64_t picks = T * static_cast<uint64_t>(layout_.top_k);  // <= tokens_per_rank * top_k: fits
    copy_in(record, rec.ids_offset, call.topk_ids, picks * sizeof(int32_t));
    copy_in(record, rec.weights_offset, call.topk_weights, picks * sizeof(float));
    if (layout_.fp8_dispatch()) {
      quantize_into(record, call, rec);
    } else {
      copy_in(record, rec.hidden_offset, call.hidden, T * layout_.hidden_row_bytes);
      copy_in(record, rec.scales_offset, call.scales, T * layout_.scale_row_bytes);
    }
    if (layout_.eplb_stats) {
      const std::vector<int32_t> counted = count_picks_per_expert(layout_, call.num_tokens, call.topk_ids);
      const int32_t* stats = call.eplb_local ? call.eplb_local : counted.data();
      copy_in(record, rec.eplb_offset, stats, layout_.num_experts * sizeof(int32_t));
    }
    return record;
  }

  // FP8 dispatch wire: this rank's rows, quantized into the record's payload and scale regions.
  void quantize_into(std::vector<uint8_t>& record, const DispatchCall& call, const RecordLayout& rec) const {
    const int64_t R = layout_.hidden_row_elems;
    const auto* src = static_cast<const uint8_t*>(call.hidden);
    auto* scales = reinterpret_cast<float*>(record.data() + rec.scales_offset);
    for (int64_t t = 0; t < call.num_tokens; ++t) {
      quantize_row(layout_.hidden_dtype, src + t * layout_.hidden_row_bytes, R, layout_.wire_scale,
                   record.data() + rec.hidden_offset + t * R, scales + t * wire_.scale_row_elems);
    }
  }

  // dispatch_dequantize: the result rows (rank-major or expert rows) back in hidden_dtype.
  void dequantize_result(HostSlot& slot, DispatchBuffers& result) const {
    const int64_t rows =
        layout_.expert_layout() ? layout_.expert_layout_rows() : layout_.receive_rows(slot.tokens_per_rank);
    const int64_t R = layout_.hidden_row_elems;
    const auto* scales = static_cast<const float*>(result.scales);
    for (int64_t i = 0; i < rows; ++i) {
      dequantize_row(static_cast<const uint8_t*>(result.hidden) + i * R, scales + i * wire_.scale_row_elems, R,
                     layout_.hidden_dtype, slot.dequantized.data() + i * layout_.hidden_row_bytes);
    }
    result.hidden = slot.dequantized.data();
    result.scales = nullptr;
  }

  // FP8 combine wire: the slot's staged (or zero-copy) rows, quantized into the
  // staged buffer that combine_recv exchanges.
  void quantize_combine_rows(HostSlot& slot, uint64_t rows) const {
    const CombineWire wire(layout_, rows);
    std::vector<uint8_t> quantized(bytes(wire.size), 0);
    const auto* src = static_cast<const uint8_t*>(slot.combine_rows);
    auto* scales = reinterpret_cast<float*>(quantized.data() + wire.scales_offset);
    const int64_t H = layout_.hidden_size;
    for (uint64_t i = 0; i < rows; ++i) {
      quantize_row(layout_.combine_dtype, src + i * layout_.combine_row_bytes, H, layout_.wire_scale,
                   quantized.data() + i * H, scales + i * wire.blocks);
    }
    slot.staged_rows = std::move(quantized);
    slot.combine_rows = slot.staged_rows.data();
  }

  static void copy_in(std::vector<uint8_t>& record, uint64_t offset, const void* src, uint64_t n) {
    if (src != nullptr && n != 0) std::memcpy(record.data() + offset, src, n);
  }

  // The slot's rank-major receive, as the expert layouts read it.
  RankMajorReceive rank_major_receive(const HostSlot& slot) const {
    RankMajorReceive in;
    in.tokens_per_rank = slot.tokens_per_rank;
    in.hidden = slot.recv_hidden.data();
    in.scales = wire_.scale_row_bytes ? slot.recv_scales.data() : nullptr;
    in.topk_ids = slot.recv_ids.data();
    in.topk_weights = slot.has_weights ? slot.recv_weights.data() : nullptr;
    in.recv_counts = slot.recv_counts.data();
    in.source_tokens = slot.source_tokens.data();
    return in;
  }

  // Expert layouts: expands the rank-major receive into the slot's expert rows.
  void expand(HostSlot& slot, const std::vector<SourceTokens>& sources, DispatchBuffers& result) {
    const int32_t tpr = slot.tokens_per_rank;
    for (int32_t s = 0; s < layout_.world_size; ++s) {  // the rows of a segment are its tokens in ascending order
      int32_t row = 0;
      for (int32_t t = 0; t < sources[s].num_tokens; ++t) {
        if (token_goes_to(layout_, sources[s].topk_ids + static_cast<int64_t>(t) * layout_.top_k, layout_.rank)) {
          slot.source_tokens[static_cast<size_t>(s) * tpr + row++] = t;
        }
      }
    }
    ExpertRows& x = slot.expert;
    expand_to_expert_rows(wire_, rank_major_receive(slot), x);
    result.hidden = x.hidden.data();
    result.scales = wire_.scale_row_bytes ? x.scales.data() : nullptr;
    result.topk_ids = nullptr;
    result.topk_weights = nullptr;
    result.expert_counts = x.counts.data();
    result.expert_offsets = layout_.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED ? x.offsets.data() : nullptr;
    result.row_sources = x.sources.data();
    result.row_weights = x.weights.data();
    result.dropped_pairs = x.dropped.data();
  }

  // Drops the picks of experts owned by inactive ranks, and every pick of a
  // token whose source rank is inactive: they read invalid_expert_id.  Bad ids
  // stay as they are (the model drops them, record_bad_ids reports them).
  void mask_picks(int32_t* ids, int64_t n, bool source_active) const {
    const int32_t per_rank = layout_.experts_per_rank();
    for (int64_t i = 0; i < n; ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= layout_.num_experts) continue;
      if (!source_active || !active_[static_cast<size_t>(id / per_rank)]) ids[i] = layout_.invalid_expert_id;
    }
  }

  // Whose data this rank reads in an exchange.  Under failure_policy MASK the
  // exchanges run among the active ranks only, and an inactive rank hears
  // only itself; otherwise every rank takes part in every exchange.
  bool takes_part(int32_t s) const {
    return !store_ || s == layout_.rank ||
           (active_[static_cast<size_t>(s)] && active_[static_cast<size_t>(layout_.rank)]);
  }

  // The mask and its epoch, mirrored to the handle (failure_policy MASK).
  void set_mask(const std::vector<uint8_t>& active, uint64_t epoch) {
    active_ = active;
    mask_epoch_ = epoch;
    all_active_ = true;
    for (uint8_t a : active_) all_active_ = all_active_ && a != 0;
    if (mirror_) *mirror_ = MembershipState{active_, dispatch_sequence_, mask_epoch_};
  }

  // Every exchange of a call: a failure the survivors agreed on (RankFailure)
  // masks the failed ranks from the next call on, on every survivor alike.
  void gather(const void* send, void* recv, size_t bytes_per_rank, const char* step) {
    try {
      exchange_->allgather(send, recv, bytes_per_rank, step);
    } catch (const RankFailure& f) {
      apply_failure(f);
      throw;
    }
  }

  void apply_failure(const RankFailure& f) { set_mask(f.active(), mask_epoch_ + 1); }

  // A rank outside the mask learns the group's newest mask before it takes part in a change.
  void refresh_membership() {
    const Membership latest =
        StoreExchange::read_latest(store_->client(), store_->group(), layout_.world_size, store_->timeout_ms());
    store_->adopt(latest);
    set_mask(latest.active, mask_epoch_);
  }

  // Bad ids are dropped by the model (they match no rank); remember the first.
  void record_bad_ids(const DispatchCall& call) {
    int32_t token = 0, pick = 0;
    const int64_t bad = count_bad_ids(layout_, call.num_tokens, call.topk_ids, &token, &pick);
    if (bad == 0 || async_status_ != MOE_EP_SUCCESS) return;
    async_status_ = MOE_EP_ERROR_INVALID_INPUT;
    async_message_ = bad_ids_message(layout_, bad, token, pick,
                                     call.topk_ids[static_cast<int64_t>(token) * layout_.top_k + pick]);
  }

  Layout layout_;
  Layout wire_;  // the rows as they cross: wire_layout(layout_)
  std::shared_ptr<Exchange> exchange_;
  std::shared_ptr<StoreExchange> store_;     // failure_policy MASK: the same object as exchange_
  std::vector<RankValue> fingerprint_;       // what a rejoining rank must match (failure_policy MASK)
  std::shared_ptr<MembershipState> mirror_;  // the handle's copy of the mask (failure_policy MASK)
  uint64_t dispatch_sequence_ = 0;
  std::vector<HostSlot> slots_;
  std::vector<uint8_t> active_;  // the active-rank mask: 1 active, 0 not
  bool all_active_ = true;
  uint64_t mask_epoch_ = 0;
  moe_ep_status_t async_status_ = MOE_EP_SUCCESS;
  std::string async_message_;
};

}  // namespace

namespace {

// One slot's buffers.
uint64_t host_slot_bytes(const Layout& l) {
  const std::string what = "HOST workspace size";
  const uint64_t rows = static_cast<uint64_t>(l.receive_rows(l.max_tokens_per_rank));
  const uint64_t pick_bytes = checked_mul(static_cast<uint64_t>(l.top_k), sizeof(int32_t) + sizeof(float), what);
  const uint64_t row_bytes =
      checked_add(checked_add(l.hidden_row_bytes, l.scale_row_bytes, what), pick_bytes, what);
  uint64_t total = checked_mul(rows, row_bytes, what);
  total = checked_add(total, sizeof(int32_t) * (static_cast<uint64_t>(l.world_size) + l.experts_per_rank()), what);
  if (l.eplb_stats) {
    total = checked_add(total,
                        checked_mul(sizeof(int32_t) * static_cast<uint64_t>(l.world_size),
                                    static_cast<uint64_t>(l.num_experts), what),
                        what);
  }
  total =
      checked_add(total, checked_mul(static_cast<uint64_t>(l.max_tokens_per_rank), l.combine_row_bytes, what), what);
  total = checked_add(total, combine_input_region_bytes(l), what);
  if (l.expert_layout()) {  // the expert rows, and each receive row's source token
    total = checked_add(total, expert_rows_bytes(l), what);
    total = checked_add(total, checked_mul(rows, sizeof(int32_t), what), what);
  }
  return total;
}

}  // namespace

uint64_t host_workspace_bytes(const Layout& l, int32_t slots) {
  uint64_t slot = host_slot_bytes(wire_layout(l));  // the received rows as the wire carries them
  if (l.fp8_dispatch() && l.dispatch_dequantize) {  // and dequantized
    const uint64_t rows = l.expert_layout() ? static_cast<uint64_t>(l.expert_layout_rows())
                                            : static_cast<uint64_t>(l.receive_rows(l.max_tokens_per_rank));
    slot = checked_add(slot, checked_mul(rows, l.hidden_row_bytes, "HOST workspace size"), "HOST workspace size");
  }
  return checked_mul(slot, static_cast<uint64_t>(slots), "HOST workspace size");
}

std::unique_ptr<Backend> make_host_backend(const Layout& layout, int32_t slots,
                                           std::shared_ptr<BoundedExchange> exchange) {
  HostExchange x;
  x.exchange = std::move(exchange);
  return std::make_unique<HostBackend>(layout, slots, std::move(x));
}

std::unique_ptr<Backend> make_host_backend(const Layout& layout, int32_t slots, HostExchange exchange) {
  return std::make_unique<HostBackend>(layout, slots, std::move(exchange));
}

std::unique_ptr<Backend> make_rejoining_host_backend(const Layout& layout, int32_t slots, HostExchange exchange,
                                                     MembershipState* joined) {
  auto backend = std::make_unique<HostBackend>(layout, slots, std::move(exchange));
  *joined = backend->join();
  return backend;
}

}  // namespace moe_ep
