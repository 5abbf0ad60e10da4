#include "host_backend.hpp"

#include <cstring>
#include <vector>

#include "error.hpp"
#include "input_errors.hpp"
#include "reference_model.hpp"

namespace moe_ep {

namespace {

// What one rank contributes to a dispatch, packed into a fixed-size record so
// that a single allgather moves every rank's input.
struct RecordLayout {
  uint64_t ids_offset, weights_offset, hidden_offset, scales_offset, eplb_offset, size;

  RecordLayout(const Layout& l, int32_t tpr) {
    const uint64_t rows = static_cast<uint64_t>(tpr);
    uint64_t at = 2 * sizeof(int32_t);  // num_tokens, has_weights
    ids_offset = at;
    at += rows * l.top_k * sizeof(int32_t);
    weights_offset = at;
    at += rows * l.top_k * sizeof(float);
    hidden_offset = at;
    at += rows * l.hidden_row_bytes;
    scales_offset = at;
    at += rows * l.scale_row_bytes;
    eplb_offset = at;
    at += static_cast<uint64_t>(l.num_experts) * sizeof(int32_t);
    size = at;
  }
};

class HostBackend final : public Backend {
 public:
  HostBackend(const Layout& layout, const Bootstrap& bootstrap)
      : layout_(layout), bootstrap_(bootstrap) {
    const int64_t rows = layout_.receive_rows(layout_.max_tokens_per_rank);
    recv_hidden_.resize(rows * layout_.hidden_row_bytes);
    recv_ids_.resize(rows * layout_.top_k);
    recv_weights_.resize(rows * layout_.top_k);
    recv_scales_.resize(rows * layout_.scale_row_bytes);
    recv_counts_.resize(layout_.world_size);
    local_expert_counts_.resize(layout_.experts_per_rank());
    if (layout_.eplb_stats) eplb_gathered_.resize(static_cast<size_t>(layout_.world_size) * layout_.num_experts);
    combine_output_.resize(static_cast<size_t>(layout_.max_tokens_per_rank) * layout_.combine_row_bytes);
  }

  const char* name() const override { return "host"; }
  moe_ep_device_t device() const override { return moe_ep_device_t{MOE_EP_DEVICE_CPU, 0}; }

  DispatchBuffers dispatch(const DispatchCall& call, void* /*stream*/) override {
    const int32_t world = layout_.world_size;
    const int32_t K = layout_.top_k;
    const RecordLayout rec(layout_, call.tokens_per_rank);
    record_bad_ids(call);

    std::vector<uint8_t> mine(rec.size, 0);
    const int32_t header[2] = {call.num_tokens, call.has_weights ? 1 : 0};
    std::memcpy(mine.data(), header, sizeof(header));
    const uint64_t picks = static_cast<uint64_t>(call.num_tokens) * K;
    copy_in(mine, rec.ids_offset, call.topk_ids, picks * sizeof(int32_t));
    copy_in(mine, rec.weights_offset, call.topk_weights, picks * sizeof(float));
    copy_in(mine, rec.hidden_offset, call.hidden, call.num_tokens * layout_.hidden_row_bytes);
    copy_in(mine, rec.scales_offset, call.scales, call.num_tokens * layout_.scale_row_bytes);
    if (layout_.eplb_stats) {
      const std::vector<int32_t> counted =
          count_picks_per_expert(layout_, call.num_tokens, call.topk_ids);
      const int32_t* stats = call.eplb_local ? call.eplb_local : counted.data();
      copy_in(mine, rec.eplb_offset, stats, layout_.num_experts * sizeof(int32_t));
    }

    std::vector<uint8_t> all(rec.size * world);
    bootstrap_.allgather(mine.data(), all.data(), rec.size);

    std::vector<SourceTokens> sources(world);
    for (int32_t s = 0; s < world; ++s) {
      const uint8_t* r = all.data() + rec.size * s;
      int32_t source_header[2];
      std::memcpy(source_header, r, sizeof(source_header));
      sources[s].num_tokens = source_header[0];
      sources[s].topk_ids = reinterpret_cast<const int32_t*>(r + rec.ids_offset);
      sources[s].topk_weights =
          source_header[1] ? reinterpret_cast<const float*>(r + rec.weights_offset) : nullptr;
      sources[s].hidden = r + rec.hidden_offset;
      sources[s].scales = layout_.scale_row_bytes ? r + rec.scales_offset : nullptr;
      if (layout_.eplb_stats) {
        std::memcpy(eplb_gathered_.data() + static_cast<size_t>(s) * layout_.num_experts,
                    r + rec.eplb_offset, layout_.num_experts * sizeof(int32_t));
      }
    }

    ReceiveBuffers out;
    out.hidden = recv_hidden_.data();
    out.topk_ids = recv_ids_.data();
    out.topk_weights = call.has_weights ? recv_weights_.data() : nullptr;
    out.scales = layout_.scale_row_bytes ? recv_scales_.data() : nullptr;
    out.recv_counts = recv_counts_.data();
    out.local_expert_counts = local_expert_counts_.data();
    reference_receive(layout_, call.tokens_per_rank, sources, out);

    // Combine needs this rank's routing after the caller may have reused its input.
    my_ids_.assign(call.topk_ids, call.topk_ids + picks);

    DispatchBuffers result;
    result.hidden = out.hidden;
    result.topk_ids = out.topk_ids;
    result.topk_weights = out.topk_weights;
    result.scales = out.scales;
    result.recv_counts = out.recv_counts;
    result.local_expert_counts = out.local_expert_counts;
    result.eplb_gathered = layout_.eplb_stats ? eplb_gathered_.data() : nullptr;
    return result;
  }

  void* combine(const CombineCall& call, void* /*stream*/) override {
    const uint64_t bytes = layout_.receive_rows(call.tokens_per_rank) * layout_.combine_row_bytes;
    std::vector<uint8_t> all(bytes * layout_.world_size);
    bootstrap_.allgather(call.expert_output, all.data(), bytes);
    std::vector<const uint8_t*> outputs(layout_.world_size);
    for (int32_t r = 0; r < layout_.world_size; ++r) outputs[r] = all.data() + bytes * r;
    uint8_t* out = call.output ? static_cast<uint8_t*>(call.output) : combine_output_.data();
    reference_combine(layout_, call.tokens_per_rank, call.num_tokens, my_ids_.data(), outputs, out);
    return out;
  }

  moe_ep_status_t poll_async_error(std::string* message) override {
    const moe_ep_status_t s = async_status_;
    if (message) *message = async_message_;
    async_status_ = MOE_EP_SUCCESS;  // INVALID_INPUT is cleared once read
    async_message_.clear();
    return s;
  }

  void shutdown() noexcept override {}

 private:
  static void copy_in(std::vector<uint8_t>& record, uint64_t offset, const void* src, uint64_t bytes) {
    if (src != nullptr && bytes != 0) std::memcpy(record.data() + offset, src, bytes);
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
  Bootstrap bootstrap_;
  std::vector<uint8_t> recv_hidden_;
  std::vector<int32_t> recv_ids_;
  std::vector<float> recv_weights_;
  std::vector<uint8_t> recv_scales_;
  std::vector<int32_t> recv_counts_;
  std::vector<int32_t> local_expert_counts_;
  std::vector<int32_t> eplb_gathered_;
  std::vector<uint8_t> combine_output_;
  std::vector<int32_t> my_ids_;
  moe_ep_status_t async_status_ = MOE_EP_SUCCESS;
  std::string async_message_;
};

}  // namespace

uint64_t host_workspace_bytes(const Layout& l) {
  const uint64_t rows = static_cast<uint64_t>(l.receive_rows(l.max_tokens_per_rank));
  uint64_t bytes = rows * (l.hidden_row_bytes + l.scale_row_bytes + l.top_k * (sizeof(int32_t) + sizeof(float)));
  bytes += sizeof(int32_t) * (l.world_size + l.experts_per_rank());
  if (l.eplb_stats) bytes += sizeof(int32_t) * static_cast<uint64_t>(l.world_size) * l.num_experts;
  bytes += static_cast<uint64_t>(l.max_tokens_per_rank) * l.combine_row_bytes;
  return bytes;
}

std::unique_ptr<Backend> make_host_backend(const Layout& layout, const Bootstrap& bootstrap) {
  return std::make_unique<HostBackend>(layout, bootstrap);
}

}  // namespace moe_ep
