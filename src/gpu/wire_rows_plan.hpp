// What both GPU backends hand the kernels about row dtypes and the FP8
// dispatch wire (cuda/wire_kernels.h): the kernels' code of a row dtype, and
// the quantize and dequantize descriptors of dispatch's rows, which depend
// only on the layout and where the rows are.
#pragma once

#include <cstdint>

#include "dtype.hpp"
#include "moe_ep_kernels.h"
#include "params.hpp"
#include "wire_kernels.h"

namespace moe_ep {

// The kernels' code (CombineDtype) of bf16, fp16 or fp32 (create checked
// that the dtype is one of them).
inline int32_t kernel_dtype(const moe_ep_dtype_t& d) {
  if (d == dtype_bf16()) return kernels::kCombineBf16;
  if (d == dtype_fp16()) return kernels::kCombineFp16;
  return kernels::kCombineFp32;
}

// The caller's dispatch rows (`in`, [T, hidden_row_bytes]) quantized into
// e4m3 codes and fp32 scales as wire_layout(layout) lays them out.
inline kernels::WireQuantizeRows dispatch_quantize_rows(const Layout& l, const void* in, uint8_t* codes,
                                                        float* scales) {
  kernels::WireQuantizeRows q{};
  q.elems = l.hidden_row_elems;
  q.dtype = kernel_dtype(l.hidden_dtype);
  q.scale_rule = l.wire_scale;
  q.in = in;
  q.in_stride = static_cast<int64_t>(l.hidden_row_bytes);
  q.codes = codes;
  q.codes_stride = l.hidden_row_elems;  // wire_layout's rows: one byte per element
  q.scales = scales;
  q.scales_stride = int64_t{l.wire_scale_row_elems()} * 4;
  return q;
}

// Received codes and scales (wire_layout(layout)'s rows) back in hidden_dtype
// into `out` ([rows, hidden_row_bytes]).
inline kernels::WireDequantizeRows dispatch_dequantize_rows(const Layout& l, const void* codes, const void* scales,
                                                            void* out) {
  kernels::WireDequantizeRows d{};
  d.elems = l.hidden_row_elems;
  d.dtype = kernel_dtype(l.hidden_dtype);
  d.codes = static_cast<const uint8_t*>(codes);
  d.codes_stride = l.hidden_row_elems;
  d.scales = static_cast<const float*>(scales);
  d.scales_stride = int64_t{l.wire_scale_row_elems()} * 4;
  d.out = out;
  d.out_stride = static_cast<int64_t>(l.hidden_row_bytes);
  return d;
}

// A combine sender's rank-major rows (`in`, [rows, combine_row_bytes]) into
// FP8 wire rows at `wire_rows` (wire_transfer_row_bytes(hidden_size) apart:
// codes, then scales at wire_transfer_scales_offset), as both GPU backends'
// combine moves them.
inline kernels::WireQuantizeRows combine_quantize_rows(const Layout& l, const void* in, char* wire_rows) {
  const int64_t row_bytes = kernels::wire_transfer_row_bytes(l.hidden_size);
  kernels::WireQuantizeRows q{};
  q.elems = l.hidden_size;
  q.dtype = kernel_dtype(l.combine_dtype);
  q.scale_rule = l.wire_scale;
  q.in = in;
  q.in_stride = static_cast<int64_t>(l.combine_row_bytes);
  q.codes = reinterpret_cast<uint8_t*>(wire_rows);
  q.codes_stride = row_bytes;
  q.scales = reinterpret_cast<float*>(wire_rows + kernels::wire_transfer_scales_offset(l.hidden_size));
  q.scales_stride = row_bytes;
  return q;
}

// The rank-major rows of a receive that hold a row: counts[s] (on the
// device) of each source's tokens_per_rank.
inline kernels::WireRowSet received_row_set(const int32_t* counts, int32_t world_size, int32_t tokens_per_rank) {
  kernels::WireRowSet rows{};
  rows.counts = counts;
  rows.sources = world_size;
  rows.per_source = tokens_per_rank;
  return rows;
}

}  // namespace moe_ep
