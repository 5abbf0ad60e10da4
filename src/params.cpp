#include "params.hpp"

#include <algorithm>
#include <string>

#include "checked_math.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "versioned_struct.hpp"

namespace moe_ep {

moe_ep_params_t default_params() {
  moe_ep_params_t p{};
  p.struct_size = sizeof(p);
  p.hidden_dtype = dtype_bf16();
  p.scale_dtype = dtype_fp32();
  p.invalid_expert_id = -1;
  p.combine_dtype = dtype_bf16();
  return p;
}

moe_ep_config_t default_config() {
  moe_ep_config_t c{};
  c.struct_size = sizeof(c);
  c.backend = MOE_EP_BACKEND_AUTO;
  c.num_sms = 0;
  c.timeout_ms = kDefaultTimeoutMs;
  c.device = -1;
  c.zero_copy_combine = 0;
  c.micro_batches = 1;
  return c;
}

namespace {

void require_positive(const char* name, int64_t value) {
  if (value <= 0) fail_argument(std::string("params->") + name, "> 0", value);
}

void require_at_most(const char* name, int64_t value, int64_t limit, const char* why) {
  if (value > limit) {
    fail_argument(std::string("params->") + name, "<= " + std::to_string(limit) + " (" + why + ")", value);
  }
}

void require_payload_dtype(const char* name, const moe_ep_dtype_t& d) {
  if (d.lanes != 1 || d.bits == 0 || (d.bits % 8 != 0 && d.bits != 4)) {
    fail_argument(std::string("params->") + name,
                  "a dtype with lanes 1 and 4, 8, 16, 32 or 64 bits", dtype_name(d));
  }
}

void require_row_under_2gib(const char* name, const moe_ep_dtype_t& dtype, int64_t elems) {
  const uint64_t bytes = dtype_row_bytes(dtype, elems);
  if (bytes >= (uint64_t{1} << 31)) {
    fail_argument(std::string("params->") + name,
                  "a row under 2 GiB (" + dtype_name(dtype) + " row of " + std::to_string(bytes) + " bytes)",
                  elems);
  }
}

// The largest per-rank footprint any backend derives from this layout: every
// receive row with its payload, scales, ids, weights, a combine row and some
// per-row bookkeeping, plus the per-expert tables.  Rejecting layouts above
// kMaxWorkspaceBytes (below kMaxLayoutBytes) here lets every backend add up its
// buffers in uint64_t without overflow.
void require_footprint_fits(const Layout& l) {
  const auto why = [&] {
    return std::string("the buffers for world_size ") + std::to_string(l.world_size) +
           " x max_tokens_per_rank " + std::to_string(l.max_tokens_per_rank) + " rows";
  };
  uint64_t per_row = 0, rows = 0, rows_bytes = 0, tables = 0, total = 0;
  const uint64_t pick_bytes = static_cast<uint64_t>(l.top_k) * (sizeof(int32_t) + sizeof(float));
  const bool ok = try_add(l.hidden_row_bytes, l.scale_row_bytes, &per_row) &&
                  try_add(per_row, 2 * l.combine_row_bytes + pick_bytes + 64, &per_row) &&
                  try_mul(static_cast<uint64_t>(l.world_size), static_cast<uint64_t>(l.max_tokens_per_rank), &rows) &&
                  try_mul(rows, per_row, &rows_bytes) &&
                  try_mul(static_cast<uint64_t>(l.world_size) + 1, static_cast<uint64_t>(l.num_experts) * 8, &tables) &&
                  try_add(rows_bytes, tables, &total);
  static_assert(kMaxWorkspaceBytes <= kMaxLayoutBytes, "backends add up buffers of kMaxLayoutBytes");
  if (!ok || total > kMaxWorkspaceBytes) {
    fail_argument(
        "params",
        why() + " of up to " + std::to_string(kMaxWorkspaceBytes) + " bytes per rank (1 TiB, the workspace limit)",
        ok ? std::to_string(total) + " bytes" : std::string("more than 2^64 bytes"));
  }
}

bool wire_makes_scales(const moe_ep_params_t& p) {
  return p.dispatch_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128 && p.dispatch_dequantize == 0;
}

// The low-precision wire's rules (docs/semantics.md, "A low-precision wire").
void read_wire(const moe_ep_params_t& p) {
  const auto require_wire = [](const char* name, int32_t value) {
    if (value != MOE_EP_WIRE_AS_IS && value != MOE_EP_WIRE_FP8_E4M3_BLOCK128) {
      fail_argument(std::string("params->") + name, "MOE_EP_WIRE_AS_IS (0) or MOE_EP_WIRE_FP8_E4M3_BLOCK128 (1)",
                    value);
    }
  };
  require_wire("dispatch_wire", p.dispatch_wire);
  require_wire("combine_wire", p.combine_wire);
  const bool fp8_dispatch = p.dispatch_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  const bool any_fp8 = fp8_dispatch || p.combine_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  if (p.wire_scale != MOE_EP_WIRE_SCALE_FP32 && p.wire_scale != MOE_EP_WIRE_SCALE_UE8M0) {
    fail_argument("params->wire_scale", "MOE_EP_WIRE_SCALE_FP32 (0) or MOE_EP_WIRE_SCALE_UE8M0 (1)", p.wire_scale);
  }
  if (!any_fp8 && p.wire_scale != MOE_EP_WIRE_SCALE_FP32) {
    fail_argument("params->wire_scale", "0 (used with an FP8 dispatch_wire or combine_wire only)", p.wire_scale);
  }
  if (p.dispatch_dequantize != 0 && p.dispatch_dequantize != 1) {
    fail_argument("params->dispatch_dequantize", "0 or 1", p.dispatch_dequantize);
  }
  if (!fp8_dispatch && p.dispatch_dequantize != 0) {
    fail_argument("params->dispatch_dequantize", "0 (used with dispatch_wire MOE_EP_WIRE_FP8_E4M3_BLOCK128 only)",
                  p.dispatch_dequantize);
  }
  if (!fp8_dispatch) return;
  if (!is_combine_dtype(p.hidden_dtype)) {
    fail_argument("params->hidden_dtype",
                  "bf16, fp16 or fp32 (dispatch_wire MOE_EP_WIRE_FP8_E4M3_BLOCK128 quantizes it)",
                  dtype_name(p.hidden_dtype));
  }
  if (p.scale_row_elems != 0) {
    fail_argument("params->scale_row_elems",
                  "0 with dispatch_wire MOE_EP_WIRE_FP8_E4M3_BLOCK128 (the library makes the scales)",
                  p.scale_row_elems);
  }
}

// The receive layout's own rules (those that need world_size are in make_layout).
void read_receive_layout(moe_ep_params_t& p) {
  const int32_t layout = p.receive_layout;
  if (layout != MOE_EP_LAYOUT_RANK_MAJOR && layout != MOE_EP_LAYOUT_EXPERT_MAJOR &&
      layout != MOE_EP_LAYOUT_EXPERT_PACKED) {
    fail_argument("params->receive_layout", "MOE_EP_LAYOUT_RANK_MAJOR (0), EXPERT_MAJOR (1) or EXPERT_PACKED (2)",
                  layout);
  }
  const auto only_with = [](const char* name, int32_t value, const char* layouts) {
    if (value != 0)
      fail_argument(std::string("params->") + name, std::string("0 (used with ") + layouts + " only)", value);
  };
  if (layout != MOE_EP_LAYOUT_EXPERT_MAJOR) only_with("expert_capacity", p.expert_capacity, "EXPERT_MAJOR");
  if (layout != MOE_EP_LAYOUT_EXPERT_PACKED) {
    only_with("expert_alignment", p.expert_alignment, "EXPERT_PACKED");
    only_with("expert_rows", p.expert_rows, "EXPERT_PACKED");
  }
  if (layout == MOE_EP_LAYOUT_RANK_MAJOR) {
    only_with("expert_output_weighted", p.expert_output_weighted, "EXPERT_MAJOR and EXPERT_PACKED");
    only_with("scale_layout", p.scale_layout, "EXPERT_MAJOR and EXPERT_PACKED");
  }
  if (p.expert_capacity < 0) fail_argument("params->expert_capacity", ">= 0 (0 = the worst case)", p.expert_capacity);
  if (p.expert_alignment < 0 || p.expert_alignment > kMaxExpertAlignment) {
    fail_argument("params->expert_alignment", "in [1, " + std::to_string(kMaxExpertAlignment) + "] (0 = 1)",
                  p.expert_alignment);
  }
  if (p.expert_alignment == 0) p.expert_alignment = layout == MOE_EP_LAYOUT_EXPERT_PACKED ? 1 : 0;
  if (p.expert_rows < 0) fail_argument("params->expert_rows", ">= 0 (0 = the worst case)", p.expert_rows);
  if (p.expert_rows > 0 && p.expert_rows % p.expert_alignment != 0) {
    fail_argument("params->expert_rows", "a multiple of expert_alignment (" + std::to_string(p.expert_alignment) + ")",
                  p.expert_rows);
  }
  if (p.expert_output_weighted != 0 && p.expert_output_weighted != 1) {
    fail_argument("params->expert_output_weighted", "0 or 1", p.expert_output_weighted);
  }
  if (p.scale_layout != MOE_EP_SCALES_ROW_MAJOR && p.scale_layout != MOE_EP_SCALES_COLUMN_MAJOR) {
    fail_argument("params->scale_layout", "MOE_EP_SCALES_ROW_MAJOR (0) or MOE_EP_SCALES_COLUMN_MAJOR (1)",
                  p.scale_layout);
  }
  if (p.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR && !wire_makes_scales(p)) {
    if (p.scale_row_elems == 0) {
      fail_argument("params->scale_layout", "MOE_EP_SCALES_ROW_MAJOR (0) without scales (scale_row_elems is 0)",
                    "MOE_EP_SCALES_COLUMN_MAJOR (1)");
    }
    if (p.scale_dtype.code != MOE_EP_DTYPE_FLOAT || p.scale_dtype.bits != 32) {
      fail_argument("params->scale_layout",
                    "MOE_EP_SCALES_ROW_MAJOR (0) with scale_dtype " + dtype_name(p.scale_dtype) +
                        " (the column-major layout holds fp32 scales only)",
                    "MOE_EP_SCALES_COLUMN_MAJOR (1)");
    }
  }
}

// The expert layout's rows, with a payload, scale and combine row each plus
// their source and weight, within the workspace limit.
void require_expert_footprint_fits(const Layout& l) {
  if (!l.expert_layout()) return;
  if (l.expert_layout_rows() > kMaxExpertRows) {
    fail_argument("params->expert_capacity",
                  "E_local * expert_capacity <= " + std::to_string(kMaxExpertRows) + " rows (int32 row indices)",
                  std::to_string(l.expert_layout_rows()) + " rows");
  }
  uint64_t per_row = 0, total = 0;
  const bool ok = try_add(l.hidden_row_bytes, l.scale_row_bytes, &per_row) &&
                  try_add(per_row, 2 * l.combine_row_bytes + 4 * sizeof(int32_t) + 64, &per_row) &&
                  try_mul(static_cast<uint64_t>(l.expert_layout_rows()), per_row, &total);
  if (!ok || total > kMaxWorkspaceBytes) {
    fail_argument(l.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR ? "params->expert_capacity" : "params->expert_rows",
                  "expert layout buffers of up to " + std::to_string(kMaxWorkspaceBytes) +
                      " bytes per rank (1 TiB, the workspace limit)",
                  ok ? std::to_string(total) + " bytes for " + std::to_string(l.expert_layout_rows()) + " rows"
                     : std::string("more than 2^64 bytes"));
  }
}

}  // namespace

int64_t worst_case_expert_rows(int32_t world_size, int32_t max_tokens_per_rank, int32_t top_k, int32_t experts_per_rank,
                               int32_t alignment) {
  const int64_t picks = std::min<int64_t>(top_k, experts_per_rank);
  const int64_t rows = static_cast<int64_t>(world_size) * max_tokens_per_rank * picks +
                       static_cast<int64_t>(experts_per_rank) * (alignment - 1);
  return rows / alignment * alignment;
}

int64_t Layout::expert_scale_elems() const {
  if (!expert_layout() || scale_row_elems == 0) return 0;
  if (scale_layout == MOE_EP_SCALES_ROW_MAJOR) return expert_layout_rows() * scale_row_elems;
  if (receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
    return static_cast<int64_t>(experts_per_rank()) * scale_row_elems * scale_column_rows(expert_capacity);
  }
  return static_cast<int64_t>(scale_row_elems) * scale_column_rows(expert_rows);
}

moe_ep_params_t read_params(const moe_ep_params_t* user) {
  moe_ep_params_t p = read_versioned(user, default_params(), "params");
  require_positive("num_experts", p.num_experts);
  require_positive("top_k", p.top_k);
  require_positive("max_tokens_per_rank", p.max_tokens_per_rank);
  require_positive("hidden_size", p.hidden_size);
  require_at_most("num_experts", p.num_experts, kMaxNumExperts, "the expert limit");
  require_at_most("top_k", p.top_k, kMaxTopK, "the top_k limit");
  require_at_most("max_tokens_per_rank", p.max_tokens_per_rank, kMaxTokensPerRank, "the token limit");
  require_at_most("hidden_size", p.hidden_size, kMaxHiddenSize, "the hidden size limit");
  if (p.top_k > p.num_experts) {
    fail_argument("params->top_k", "<= num_experts (" + std::to_string(p.num_experts) + ")",
                  p.top_k);
  }
  require_payload_dtype("hidden_dtype", p.hidden_dtype);
  if (p.hidden_row_elems < 0) fail_argument("params->hidden_row_elems", ">= 0", p.hidden_row_elems);
  if (p.scale_row_elems < 0) fail_argument("params->scale_row_elems", ">= 0", p.scale_row_elems);
  require_at_most("hidden_row_elems", p.hidden_row_elems, kMaxRowElems, "the row limit");
  require_at_most("scale_row_elems", p.scale_row_elems, kMaxRowElems, "the row limit");
  if (p.scale_row_elems > 0) require_payload_dtype("scale_dtype", p.scale_dtype);
  if (p.invalid_expert_id >= 0 && p.invalid_expert_id < p.num_experts) {
    fail_argument("params->invalid_expert_id",
                  "outside [0, num_experts) = [0, " + std::to_string(p.num_experts) + ")",
                  p.invalid_expert_id);
  }
  if (p.enable_eplb_stats != 0 && p.enable_eplb_stats != 1) {
    fail_argument("params->enable_eplb_stats", "0 or 1", p.enable_eplb_stats);
  }
  if (!is_combine_dtype(p.combine_dtype)) {
    fail_argument("params->combine_dtype", "bf16, fp16 or fp32", dtype_name(p.combine_dtype));
  }
  // Rows are addressed with 64-bit offsets, but keep one row under 2 GiB so
  // that per-row sizes fit the int32 arguments of the kernels.
  const int64_t row_elems = p.hidden_row_elems ? p.hidden_row_elems : p.hidden_size;
  require_row_under_2gib("hidden_row_elems", p.hidden_dtype, row_elems);
  require_row_under_2gib("scale_row_elems", p.scale_dtype, p.scale_row_elems);
  require_row_under_2gib("hidden_size", p.combine_dtype, p.hidden_size);
  read_wire(p);
  read_receive_layout(p);
  return p;
}

moe_ep_config_t read_config(const moe_ep_config_t* user) {
  if (user == nullptr) return default_config();
  moe_ep_config_t c = read_versioned(user, default_config(), "config");
  if (c.backend != MOE_EP_BACKEND_AUTO && c.backend != MOE_EP_BACKEND_NVLINK_TWO_SIDED &&
      c.backend != MOE_EP_BACKEND_HOST && c.backend != MOE_EP_BACKEND_NCCL) {
    fail_argument("config->backend", "MOE_EP_BACKEND_AUTO (0), NVLINK_TWO_SIDED (1), HOST (2) or NCCL (3)",
                  c.backend);
  }
  if (c.num_sms < 0) fail_argument("config->num_sms", ">= 0 (0 = choose)", c.num_sms);
  if (c.timeout_ms <= 0) fail_argument("config->timeout_ms", "> 0", c.timeout_ms);
  if (c.device < -1) fail_argument("config->device", ">= -1 (-1 = current device)", c.device);
  c.zero_copy_combine = c.zero_copy_combine != 0 ? 1 : 0;  // a flag: anything but 0 is on
  if (c.micro_batches == 0) c.micro_batches = 1;           // a config zeroed by hand
  if (c.micro_batches < 1 || c.micro_batches > kMaxMicroBatches) {
    fail_argument("config->micro_batches", "1 or " + std::to_string(kMaxMicroBatches) + " (0 = 1)", c.micro_batches);
  }
  return c;
}

Layout make_layout(const moe_ep_params_t& p, int32_t world_size, int32_t rank) {
  if (world_size <= 0) fail_argument("bootstrap->world_size", "> 0", world_size);
  if (rank < 0 || rank >= world_size) {
    fail_argument("bootstrap->rank", "in [0, " + std::to_string(world_size) + ")", rank);
  }
  if (p.num_experts % world_size != 0) {
    fail_argument("params->num_experts",
                  "a multiple of world_size (" + std::to_string(world_size) + ")", p.num_experts);
  }
  Layout l;
  l.rank = rank;
  l.world_size = world_size;
  l.num_experts = p.num_experts;
  l.top_k = p.top_k;
  l.max_tokens_per_rank = p.max_tokens_per_rank;
  l.hidden_size = p.hidden_size;
  l.hidden_dtype = p.hidden_dtype;
  l.hidden_row_elems = p.hidden_row_elems ? p.hidden_row_elems : p.hidden_size;
  l.hidden_row_bytes = dtype_row_bytes(p.hidden_dtype, l.hidden_row_elems);
  l.scale_row_elems = p.scale_row_elems;
  l.scale_dtype = p.scale_dtype;
  l.scale_row_bytes = p.scale_row_elems ? dtype_row_bytes(p.scale_dtype, p.scale_row_elems) : 0;
  l.dispatch_wire = p.dispatch_wire;
  l.combine_wire = p.combine_wire;
  l.wire_scale = p.wire_scale;
  l.dispatch_dequantize = p.dispatch_dequantize != 0;
  l.invalid_expert_id = p.invalid_expert_id;
  l.eplb_stats = p.enable_eplb_stats != 0;
  l.combine_dtype = p.combine_dtype;
  l.combine_row_bytes = dtype_row_bytes(p.combine_dtype, p.hidden_size);
  require_footprint_fits(l);
  l.receive_layout = p.receive_layout;
  l.expert_output_weighted = p.expert_output_weighted != 0;
  l.scale_layout = p.scale_layout;
  const int64_t worst_per_expert = static_cast<int64_t>(world_size) * p.max_tokens_per_rank;
  if (p.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
    if (p.expert_capacity > worst_per_expert) {
      fail_argument(
          "params->expert_capacity",
          "in [1, world_size * max_tokens_per_rank = " + std::to_string(worst_per_expert) + "] (0 = that worst case)",
          p.expert_capacity);
    }
    l.expert_capacity = p.expert_capacity ? p.expert_capacity : static_cast<int32_t>(worst_per_expert);
  }
  if (p.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED) {
    l.expert_alignment = p.expert_alignment ? p.expert_alignment : 1;
    const int64_t worst =
        worst_case_expert_rows(world_size, p.max_tokens_per_rank, p.top_k, l.experts_per_rank(), l.expert_alignment);
    if (p.expert_rows == 0 && worst > kMaxExpertRows) {  // the default would not fit int32 row indices
      fail_argument("params->expert_rows",
                    "a bound of at most " + std::to_string(kMaxExpertRows) +
                        " rows (int32 row indices; 0 = the worst case, " + std::to_string(worst) + " rows here)",
                    p.expert_rows);
    }
    if (p.expert_rows > worst) {
      fail_argument("params->expert_rows",
                    "at most the worst case, " + std::to_string(worst) +
                        " rows (world_size * max_tokens_per_rank * min(top_k, E_local) + E_local * (alignment - 1), "
                        "rounded down to a multiple of expert_alignment; 0 = that)",
                    p.expert_rows);
    }
    l.expert_rows = p.expert_rows ? p.expert_rows : static_cast<int32_t>(worst);
  }
  require_expert_footprint_fits(l);
  return l;
}

Layout wire_layout(const Layout& l) {
  if (!l.fp8_dispatch()) return l;
  Layout w = l;
  w.hidden_dtype = make_dtype(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8);
  w.hidden_row_bytes = static_cast<uint64_t>(l.hidden_row_elems);
  w.scale_row_elems = l.wire_scale_row_elems();
  w.scale_dtype = dtype_fp32();
  w.scale_row_bytes = static_cast<uint64_t>(w.scale_row_elems) * sizeof(float);
  if (l.dispatch_dequantize) w.scale_layout = MOE_EP_SCALES_ROW_MAJOR;
  return w;
}

Layout received_layout(const Layout& l) { return l.dispatch_dequantize ? l : wire_layout(l); }

uint64_t combine_input_region_bytes(const Layout& l) {
  if (!l.zero_copy_combine) return 0;
  const uint64_t rows = static_cast<uint64_t>(l.combine_rows(l.max_tokens_per_rank));
  return checked_mul(rows, l.combine_row_bytes, "zero-copy combine input region");
}

}  // namespace moe_ep
