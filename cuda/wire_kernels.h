// The FP8 wire on the GPU (docs/semantics.md, "A low-precision wire"): rows
// of bf16, fp16 or fp32 quantized per block of 128 elements into float8
// e4m3fn codes plus one fp32 scale per block, and back, behind the same kind
// of plain launch interface as the backends' kernels.  The bits are those of
// the HOST backend's src/wire_format.cpp: the same e4m3 codes, and the same
// fp32 scales (UE8M0 scales are stored as the fp32 power of two, as the host
// stores them).  Both GPU backends use them: a dispatch sender quantizes the
// caller's [T, R] rows, a combine sender its rank-major rows [world * tpr, H]
// of which only the received ones count, and receivers dequantize
// rank-major rows.  docs/wire.md has the kernels' design and their memory
// floor.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/host_device.h"

namespace moe_ep {
namespace kernels {

// Elements per scale.
constexpr int32_t kWireBlockElems = 128;

// Values of params->wire_scale (MOE_EP_WIRE_SCALE_* in moe_ep_c.h).
enum WireScaleRule : int32_t { kWireScaleFp32 = 0, kWireScaleUe8m0 = 1 };

// Scales per row of `elems` elements.
MOE_EP_HOST_DEVICE int32_t wire_row_blocks(int32_t elems) { return (elems + kWireBlockElems - 1) / kWireBlockElems; }

// A combine partial as it crosses with an FP8 combine wire, in both GPU
// backends: `elems` codes, then the row's fp32 scales, each part rounded up
// to 16 bytes, so that rows laid end to end stay 16-byte aligned.
MOE_EP_HOST_DEVICE int64_t wire_transfer_scales_offset(int32_t elems) { return (int64_t{elems} + 15) / 16 * 16; }
MOE_EP_HOST_DEVICE int64_t wire_transfer_row_bytes(int32_t elems) {
  return wire_transfer_scales_offset(elems) + (int64_t{wire_row_blocks(elems)} * 4 + 15) / 16 * 16;
}

// The rows a launch reads and writes.  Either a host count (counts NULL:
// rows [0, rows)), or rank-major rows counted on the device: of rows
// [0, sources * per_source), row s * per_source + j is taken iff
// j < counts[s] (per_source is tokens_per_rank; a count above per_source
// takes the whole source and a negative one none, so counts published by
// peers need no bound check for these kernels; one source whose count is on
// the device, a runtime token count, is sources = 1).  Rows not taken are
// neither read nor written.
struct WireRowSet {
  int64_t rows;           // counts NULL: the rows
  const int32_t* counts;  // device [sources], or NULL
  int32_t sources;
  int32_t per_source;
};

// Quantizing rows of `elems` elements.  Strides are in bytes between rows;
// with 16-byte aligned rows, 8-byte aligned code rows and elems a multiple
// of 8 every element moves in vectors, else element by element (same bits).
struct WireQuantizeRows {
  int32_t elems;       // elements per row, >= 1
  int32_t dtype;       // CombineDtype (moe_ep_kernels.h) of `in`: bf16, fp16 or fp32
  int32_t scale_rule;  // WireScaleRule
  const void* in;      // [rows, in_stride]
  int64_t in_stride;
  uint8_t* codes;  // [rows, codes_stride]: elems e4m3fn codes
  int64_t codes_stride;
  float* scales;  // [rows, scales_stride]: wire_row_blocks(elems) fp32 scales, 4-byte aligned
  int64_t scales_stride;
};

// Dequantizing: each code times its block's scale in fp32, stored as dtype
// (round to nearest even; 0x7F and 0xFF give the quiet NaN the host gives).
struct WireDequantizeRows {
  int32_t elems;
  int32_t dtype;  // CombineDtype of `out`
  const uint8_t* codes;
  int64_t codes_stride;
  const float* scales;
  int64_t scales_stride;
  void* out;  // [rows, out_stride]
  int64_t out_stride;
};

// A warp per segment of 1024 elements of a row at a time, one block of 1024
// threads per SM the launch may use (at most `max_blocks`); with Programmatic
// Dependent Launch when `pdl` is nonzero.  cudaErrorInvalidValue for a bad
// dtype, rule, element count or row set, a stride shorter than its row, or
// rows not aligned to their elements (scales: 4 bytes).
cudaError_t launch_quantize_rows(const WireQuantizeRows& q, const WireRowSet& rows, int32_t max_blocks, int32_t pdl,
                                 cudaStream_t stream);
cudaError_t launch_dequantize_rows(const WireDequantizeRows& d, const WireRowSet& rows, int32_t max_blocks, int32_t pdl,
                                   cudaStream_t stream);

}  // namespace kernels
}  // namespace moe_ep
