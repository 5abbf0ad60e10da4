#include "result_reader.hpp"

#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dtypes.hpp"

namespace moe_ep_verify {

std::vector<uint8_t> read_host_memory(const void* data, uint64_t bytes) {
  if (bytes == 0) return {};
  if (data == nullptr) throw std::runtime_error("a result of " + std::to_string(bytes) + " bytes has data == NULL");
  const auto* p = static_cast<const uint8_t*>(data);
  return std::vector<uint8_t>(p, p + bytes);
}

namespace {

std::string describe(const moe_ep_tensor_t& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype) << "[";
  for (int i = 0; i < t.ndim && t.shape; ++i) os << (i ? "," : "") << t.shape[i];
  os << "] on device type " << t.device.device_type << " id " << t.device.device_id;
  return os.str();
}

// Checks one result view; returns its bytes when it is as expected, else
// records one wrong element and returns an empty vector.
std::vector<uint8_t> take(const char* name, const moe_ep_tensor_t& t, const moe_ep_dtype_t& dtype,
                          std::initializer_list<int64_t> dims, const moe_ep_device_t& device, const MemoryReader& read,
                          Verdict& v) {
  bool ok = t.ndim == int(dims.size()) && same_dtype(t.dtype, dtype) && t.shape != nullptr &&
            t.device.device_type == device.device_type && t.device.device_id == device.device_id &&
            t.strides == nullptr;
  int64_t elems = 1, i = 0;
  for (int64_t d : dims) {
    ok = ok && t.shape[i++] == d;
    elems *= d;
  }
  if (!ok) {
    std::ostringstream os;
    os << name << ": expected " << dtype_name(dtype) << "[";
    for (int64_t d : dims) os << d << ",";
    os << "] compact on device type " << device.device_type << " id " << device.device_id << ", got " << describe(t);
    v.add(1, os.str());
    return {};
  }
  // Rows of sub-byte types are padded to whole bytes (as the library lays them out).
  const int64_t last = *(dims.end() - 1);
  const uint64_t bytes = last ? uint64_t(elems / last) * row_bytes(dtype, last) : 0;
  return read(static_cast<const char*>(t.data) + t.byte_offset, bytes);
}

template <typename T>
std::vector<T> as(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

bool absent(const moe_ep_tensor_t& t) { return t.data == nullptr && t.ndim == 0; }

// The results of an expert layout (docs/semantics.md, "Receive layouts").
void read_expert_layout(const WorkloadSpec& s, const moe_ep_dispatch_result_t& r, const moe_ep_device_t& device,
                        const MemoryReader& read, Verdict& v, ReceivedDispatch& got) {
  const bool major = s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR;
  const int64_t E = s.experts_per_rank(), cap = s.capacity(), rows = s.expert_layout_rows(),
                S = s.recv_scale_row_elems();
  const auto up4 = [](int64_t n) { return (n + 3) / 4 * 4; };
  got.hidden =
      major ? take("hidden_states", r.hidden_states, s.recv_hidden_dtype(), {E, cap, s.row_elems()}, device, read, v)
            : take("hidden_states", r.hidden_states, s.recv_hidden_dtype(), {rows, s.row_elems()}, device, read, v);
  if (!absent(r.topk_ids) || !absent(r.topk_weights)) v.add(1, "topk_ids/topk_weights: present in an expert layout");
  got.has_scales = !absent(r.hidden_states_scale);
  if (S && s.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR) {
    got.scales = major ? take("hidden_states_scale", r.hidden_states_scale, s.recv_scale_dtype(), {E, S, up4(cap)},
                              device, read, v)
                       : take("hidden_states_scale", r.hidden_states_scale, s.recv_scale_dtype(), {S, up4(rows)},
                              device, read, v);
  } else if (S) {
    got.scales =
        major ? take("hidden_states_scale", r.hidden_states_scale, s.recv_scale_dtype(), {E, cap, S}, device, read, v)
              : take("hidden_states_scale", r.hidden_states_scale, s.recv_scale_dtype(), {rows, S}, device, read, v);
  } else if (got.has_scales) {
    v.add(1, "hidden_states_scale: returned although params have no scales");
  }
  got.expert_counts = as<int32_t>(take("expert_counts", r.expert_counts, int32_dtype(), {E}, device, read, v));
  if (!major) {
    got.expert_offsets = as<int32_t>(take("expert_offsets", r.expert_offsets, int32_dtype(), {E + 1}, device, read, v));
  } else if (!absent(r.expert_offsets)) {
    v.add(1, "expert_offsets: present in EXPERT_MAJOR");
  }
  got.row_sources = as<int32_t>(take("row_sources", r.row_sources, int32_dtype(), {rows, 3}, device, read, v));
  got.row_weights = as<float>(take("row_weights", r.row_weights, fp32_dtype(), {rows}, device, read, v));
  got.dropped_pairs = as<int32_t>(take("dropped_pairs", r.dropped_pairs, int32_dtype(), {1}, device, read, v));
}

}  // namespace

ReceivedDispatch read_dispatch(const WorkloadSpec& s, const moe_ep_dispatch_result_t& r, const moe_ep_device_t& device,
                               const MemoryReader& read, Verdict& v) {
  ReceivedDispatch got;
  got.tokens_per_rank = r.tokens_per_rank;
  const int64_t P = s.receive_rows(), K = s.top_k;
  if (s.expert_layout()) {
    read_expert_layout(s, r, device, read, v, got);
    got.recv_counts = as<int32_t>(take("recv_counts", r.recv_counts, int32_dtype(), {s.world}, device, read, v));
    got.local_expert_counts = as<int32_t>(
        take("local_expert_counts", r.local_expert_counts, int32_dtype(), {s.experts_per_rank()}, device, read, v));
    got.has_eplb = !absent(r.eplb_gathered_stats);
    if (s.eplb_stats) {
      got.eplb_gathered = as<int32_t>(
          take("eplb_gathered_stats", r.eplb_gathered_stats, int32_dtype(), {s.world, s.num_experts}, device, read, v));
    } else if (got.has_eplb) {
      v.add(1, "eplb_gathered_stats: returned although eplb stats are off");
    }
    return got;
  }
  got.hidden = take("hidden_states", r.hidden_states, s.recv_hidden_dtype(), {P, s.row_elems()}, device, read, v);
  got.topk_ids = as<int32_t>(take("topk_ids", r.topk_ids, int32_dtype(), {P, K}, device, read, v));
  got.recv_counts = as<int32_t>(take("recv_counts", r.recv_counts, int32_dtype(), {s.world}, device, read, v));
  got.local_expert_counts = as<int32_t>(
      take("local_expert_counts", r.local_expert_counts, int32_dtype(), {s.experts_per_rank()}, device, read, v));
  got.has_weights = !absent(r.topk_weights);
  if (got.has_weights && s.weights) {
    got.topk_weights = as<float>(take("topk_weights", r.topk_weights, fp32_dtype(), {P, K}, device, read, v));
  }
  got.has_scales = !absent(r.hidden_states_scale);
  if (s.recv_scale_row_elems()) {
    got.scales = take("hidden_states_scale", r.hidden_states_scale, s.recv_scale_dtype(), {P, s.recv_scale_row_elems()},
                      device, read, v);
  } else if (got.has_scales) {
    v.add(1, "hidden_states_scale: returned although params have no scales");
  }
  got.has_eplb = !absent(r.eplb_gathered_stats);
  if (s.eplb_stats) {
    got.eplb_gathered = as<int32_t>(
        take("eplb_gathered_stats", r.eplb_gathered_stats, int32_dtype(), {s.world, s.num_experts}, device, read, v));
  } else if (got.has_eplb) {
    v.add(1, "eplb_gathered_stats: returned although eplb stats are off");
  }
  return got;
}

std::vector<uint8_t> read_combine(const WorkloadSpec& s, const moe_ep_combine_result_t& r, int num_tokens,
                                  const moe_ep_device_t& device, const MemoryReader& read, Verdict& v) {
  if (num_tokens == 0) {  // data may be NULL; only the shape is specified
    const bool ok = r.output.ndim == 2 && r.output.shape && r.output.shape[0] == 0 &&
                    r.output.shape[1] == s.hidden_size && same_dtype(r.output.dtype, s.combine_dtype);
    if (!ok) {
      v.add(1, "combine output for 0 tokens: expected " + dtype_name(s.combine_dtype) + "[0," +
                   std::to_string(s.hidden_size) + "], got " + describe(r.output));
    }
    return {};
  }
  return take("combine output", r.output, s.combine_dtype, {num_tokens, s.hidden_size}, device, read, v);
}

}  // namespace moe_ep_verify
