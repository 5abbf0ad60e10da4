// The FP8 wire's GPU kernels (cuda/wire_kernels.h) against the host wire
// format the HOST backend runs (src/wire_format.hpp), bitwise:
// - every fp32 value of magnitude 2^-13 to 448, both signs, through the
//   kernel with a block scale of exactly 1 (so its codes are the plain
//   e4m3 conversion), and a sample below;
// - random rows of bf16, fp16 and fp32 under both scale rules: zero blocks,
//   subnormals, huge values, Inf, -Inf, NaN, blocks of nothing but NaN or
//   Inf, random bit patterns; H not a multiple of 128 and below it; aligned
//   rows (vectors) and padded strides (element by element);
// - a host row count and rank-major rows counted on the device (counts of
//   0, full, above tokens_per_rank, negative), outputs poisoned with 0xFF
//   first: rows not taken and the bytes between rows stay poisoned;
// - dequantizing the kernel's codes (and every code, 0xFF included) back to
//   each dtype against the host's dequantize_row;
// - the launch checks.
// One GPU, no MPI; exits 77 (skipped) without a GPU.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dtype.hpp"
#include "moe_ep_c.h"
#include "moe_ep_kernels.h"
#include "wire_format.hpp"
#include "wire_kernels.h"

namespace {

namespace k = moe_ep::kernels;

static_assert(int{k::kWireScaleFp32} == int{MOE_EP_WIRE_SCALE_FP32} &&
                  int{k::kWireScaleUe8m0} == int{MOE_EP_WIRE_SCALE_UE8M0},
              "the kernels' scale rules are params->wire_scale's values");
static_assert(k::kWireBlockElems == moe_ep::kWireBlock, "one block size");

int failures = 0;
std::string current = "launch checks";  // the case running, for a fatal error's message

void expect(bool ok, const std::string& what) {
  if (ok) return;
  if (++failures <= 30) std::printf("FAILED: %s\n", what.c_str());
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::printf("FATAL: %s: %s: %s\n", current.c_str(), what, cudaGetErrorString(e));
  std::exit(1);
}

// A device buffer, freed at scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t bytes) : n(bytes) { check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  void upload(const void* src, size_t bytes) { check(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice), "upload"); }
  void poison() { check(cudaMemset(p, 0xFF, n ? n : 1), "poison"); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> v(n);
    if (n) check(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), "download");
    return v;
  }
};

struct DtypeCase {
  const char* name;
  moe_ep_dtype_t dtype;
  int32_t code;  // CombineDtype
  int bytes;
};

const DtypeCase kDtypes[] = {{"bf16", moe_ep::dtype_bf16(), k::kCombineBf16, 2},
                             {"fp16", moe_ep::dtype_fp16(), k::kCombineFp16, 2},
                             {"fp32", moe_ep::dtype_fp32(), k::kCombineFp32, 4}};

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Element i of a row of `dt` set from a float (rounded to the dtype).
void put(const DtypeCase& dt, uint8_t* row, int64_t i, float f) { moe_ep::store_from_float(dt.dtype, row, i, f); }

// A random raw bit pattern of the dtype.
void put_bits(const DtypeCase& dt, uint8_t* row, int64_t i, uint32_t bits) {
  std::memcpy(row + i * dt.bytes, &bits, static_cast<size_t>(dt.bytes));
}

// One row of random blocks of several kinds.
void fill_row(const DtypeCase& dt, uint8_t* row, int32_t elems, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint32_t> bits32;
  std::uniform_real_distribution<float> unit(1.0f, 2.0f);
  for (int32_t b = 0; b < elems; b += 128) {
    const int32_t end = std::min(elems, b + 128);
    const int kind = static_cast<int>(bits32(rng) % 10);
    // The block's magnitude: anywhere in fp32's range, or near the dtype's.
    const int top = dt.bytes == 4 ? 127 : (dt.dtype.code == MOE_EP_DTYPE_BFLOAT ? 127 : 15);
    const int bottom = dt.bytes == 4 ? -149 : (dt.dtype.code == MOE_EP_DTYPE_BFLOAT ? -133 : -24);
    const int exp = bottom + static_cast<int>(bits32(rng) % static_cast<uint32_t>(top - bottom + 1));
    for (int32_t i = b; i < end; ++i) {
      const float sign = (bits32(rng) & 1) ? -1.0f : 1.0f;
      const uint32_t r = bits32(rng);
      switch (kind) {
        case 0: put(dt, row, i, (r & 1) ? -0.0f : 0.0f); break;                       // a zero block
        case 1: put(dt, row, i, bits_float(0x7FC00000u | (r & 0x803FFFFFu))); break;  // all NaN
        case 2:  // nothing finite but zeros: Inf, -Inf, NaN, 0
          put(dt, row, i, r % 4 == 0 ? INFINITY : r % 4 == 1 ? -INFINITY : r % 4 == 2 ? NAN : 0.0f);
          break;
        case 3: put_bits(dt, row, i, r); break;  // any bit pattern (NaN, Inf, subnormals included)
        case 4:                                  // subnormals of the dtype
          if (dt.bytes == 4) {
            put_bits(dt, row, i, (r & 0x807FFFFFu));
          } else {
            put_bits(dt, row, i, (r & (dt.dtype.code == MOE_EP_DTYPE_BFLOAT ? 0x807Fu : 0x83FFu)));
          }
          break;
        case 5:  // huge: the top of the dtype's range, beyond 448 * 2^k
          put(dt, row, i, sign * std::ldexp(unit(rng), top - static_cast<int>(r % 4)));
          break;
        case 6:  // one block scale apart, with specials sprinkled in
          if (r % 16 == 0) {
            put(dt, row, i, r % 64 == 0 ? NAN : r % 64 == 16 ? INFINITY : r % 64 == 32 ? -INFINITY : -0.0f);
          } else {
            put(dt, row, i, sign * std::ldexp(unit(rng), exp - static_cast<int>(r % 24)));
          }
          break;
        default:  // a wide spread inside the block: codes from 448 down into e4m3's subnormals and zero
          put(dt, row, i, sign * std::ldexp(unit(rng), exp - static_cast<int>(r % 20)));
          break;
      }
    }
  }
}

// Which rows a set takes.
struct RowSet {
  k::WireRowSet set;
  std::vector<int32_t> counts;
  int64_t rows;
  bool taken(int64_t row) const {
    if (set.counts == nullptr) return true;
    const int64_t s = row / set.per_source;
    return row - s * set.per_source < counts[static_cast<size_t>(s)];
  }
};

struct Shape {
  int32_t elems;
  int64_t in_pad, codes_pad, scales_pad, out_pad;  // bytes after each row: 0 keeps the vector path
};

// Quantizes random rows on the GPU and on the host, compares every byte of
// the outputs, then dequantizes the GPU's codes to every dtype.
void run_quantize(const DtypeCase& dt, int32_t rule, const Shape& sh, RowSet& rs, DeviceBuffer* counts,
                  std::mt19937_64& rng, const std::string& tag) {
  const int32_t H = sh.elems, blocks = moe_ep::wire_blocks(H);
  current = tag;
  const int64_t rows = rs.rows;
  const int64_t in_stride = int64_t{H} * dt.bytes + sh.in_pad, codes_stride = H + sh.codes_pad,
                scales_stride = int64_t{blocks} * 4 + sh.scales_pad;
  std::vector<uint8_t> in(static_cast<size_t>(rows * in_stride));
  for (int64_t r = 0; r < rows; ++r) fill_row(dt, in.data() + r * in_stride, H, rng);
  DeviceBuffer din(in.size()), dcodes(static_cast<size_t>(rows * codes_stride)),
      dscales(static_cast<size_t>(rows * scales_stride));
  din.upload(in.data(), in.size());
  dcodes.poison();
  dscales.poison();
  if (counts) rs.set.counts = counts->as<int32_t>();
  k::WireQuantizeRows q{
      H, dt.code, rule, din.p, in_stride, dcodes.as<uint8_t>(), codes_stride, dscales.as<float>(), scales_stride};
  check(k::launch_quantize_rows(q, rs.set, 64, 1, nullptr), "launch_quantize_rows");
  check(cudaDeviceSynchronize(), "quantize");
  const std::vector<uint8_t> codes = dcodes.download(), scales = dscales.download();

  std::vector<uint8_t> want_codes(static_cast<size_t>(H));
  std::vector<float> want_scales(static_cast<size_t>(blocks));
  int64_t bad_codes = 0, bad_scales = 0, bad_poison = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* c = codes.data() + r * codes_stride;
    const uint8_t* s = scales.data() + r * scales_stride;
    if (!rs.taken(r)) {
      for (int64_t i = 0; i < codes_stride; ++i) bad_poison += c[i] != 0xFF;
      for (int64_t i = 0; i < scales_stride; ++i) bad_poison += s[i] != 0xFF;
      continue;
    }
    moe_ep::quantize_row(dt.dtype, in.data() + r * in_stride, H, rule, want_codes.data(), want_scales.data());
    for (int32_t i = 0; i < H; ++i) {
      if (c[i] != want_codes[static_cast<size_t>(i)]) {
        if (bad_codes++ < 5) {
          const float x = moe_ep::load_as_float(dt.dtype, in.data() + r * in_stride, i);
          std::printf(
              "  %s row %lld elem %d: x %a (bits 0x%08x) code 0x%02x, host 0x%02x, scale %a\n", tag.c_str(),
              static_cast<long long>(r), i, x,
              [&] {
                uint32_t u;
                std::memcpy(&u, &x, 4);
                return u;
              }(),
              c[i], want_codes[static_cast<size_t>(i)], want_scales[static_cast<size_t>(i / 128)]);
        }
      }
    }
    for (int64_t i = H; i < codes_stride; ++i) bad_poison += c[i] != 0xFF;
    bad_scales += std::memcmp(s, want_scales.data(), static_cast<size_t>(blocks) * 4) != 0;
    for (int64_t i = int64_t{blocks} * 4; i < scales_stride; ++i) bad_poison += s[i] != 0xFF;
  }
  expect(bad_codes == 0, tag + ": " + std::to_string(bad_codes) + " codes differ from the host's");
  expect(bad_scales == 0, tag + ": " + std::to_string(bad_scales) + " rows of scales differ from the host's");
  expect(bad_poison == 0, tag + ": " + std::to_string(bad_poison) + " bytes outside the taken rows were written");

  // Dequantize the codes (as the GPU left them: poisoned rows are not taken).
  for (const DtypeCase& out : kDtypes) {
    const int64_t out_stride = int64_t{H} * out.bytes + sh.out_pad;
    DeviceBuffer dout(static_cast<size_t>(rows * out_stride));
    dout.poison();
    k::WireDequantizeRows d{H,      out.code,  dcodes.as<uint8_t>(), codes_stride, dscales.as<float>(), scales_stride,
                            dout.p, out_stride};
    check(k::launch_dequantize_rows(d, rs.set, 64, 0, nullptr), "launch_dequantize_rows");
    check(cudaDeviceSynchronize(), "dequantize");
    const std::vector<uint8_t> got = dout.download();
    std::vector<uint8_t> want(static_cast<size_t>(int64_t{H} * out.bytes));
    int64_t bad = 0, poison = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* g = got.data() + r * out_stride;
      if (!rs.taken(r)) {
        for (int64_t i = 0; i < out_stride; ++i) poison += g[i] != 0xFF;
        continue;
      }
      std::vector<float> sc(static_cast<size_t>(blocks));
      std::memcpy(sc.data(), scales.data() + r * scales_stride, sc.size() * 4);
      moe_ep::dequantize_row(codes.data() + r * codes_stride, sc.data(), H, out.dtype, want.data());
      bad += std::memcmp(g, want.data(), want.size()) != 0;
      for (int64_t i = static_cast<int64_t>(want.size()); i < out_stride; ++i) poison += g[i] != 0xFF;
    }
    expect(bad == 0, tag + " dequantized to " + out.name + ": " + std::to_string(bad) + " rows differ");
    expect(poison == 0, tag + " dequantized to " + out.name + ": " + std::to_string(poison) +
                            " bytes outside the taken rows were written");
  }
}

// Every fp32 value of magnitude 2^-13 to 448 (and a sample below), both
// signs, in blocks whose first element is 448: the scale is exactly 1 under
// both rules, so each code is the value's own e4m3 conversion.
void sweep_conversion() {
  constexpr int32_t kRows = 1 << 17, H = 128, kPer = H - 1;
  DeviceBuffer din(size_t{kRows} * H * 4), dcodes(size_t{kRows} * H), dscales(size_t{kRows} * 4);
  std::vector<float> in(size_t{kRows} * H);
  int64_t bad = 0, checked = 0;
  const uint32_t lo = 0x39000000u, hi = 0x43E00000u;  // 2^-13 .. 448
  auto run_batch = [&](const std::vector<uint32_t>& values, int32_t rule) {
    const int64_t n = static_cast<int64_t>(values.size());
    const int32_t rows = static_cast<int32_t>((n + kPer - 1) / kPer);
    for (int32_t r = 0; r < rows; ++r) {
      in[size_t(r) * H] = 448.0f;
      for (int32_t i = 0; i < kPer; ++i) {
        const int64_t v = int64_t{r} * kPer + i;
        in[size_t(r) * H + 1 + i] = v < n ? bits_float(values[size_t(v)]) : 0.0f;
      }
    }
    din.upload(in.data(), size_t(rows) * H * 4);
    const k::WireRowSet set{rows, nullptr, 0, 0};
    const k::WireQuantizeRows q{H, k::kCombineFp32,     rule, din.p, H * 4, dcodes.as<uint8_t>(),
                                H, dscales.as<float>(), 4};
    check(k::launch_quantize_rows(q, set, 1024, 0, nullptr), "launch_quantize_rows");
    check(cudaDeviceSynchronize(), "sweep");
    const std::vector<uint8_t> codes = dcodes.download(), scales = dscales.download();
    for (int32_t r = 0; r < rows; ++r) {
      float s;
      std::memcpy(&s, scales.data() + size_t(r) * 4, 4);
      if (s != 1.0f && bad++ < 5) std::printf("  sweep row %d: scale %a, not 1\n", r, s);
      for (int32_t i = 0; i < kPer; ++i) {
        const int64_t v = int64_t{r} * kPer + i;
        if (v >= n) break;
        const uint8_t want = moe_ep::float_to_e4m3(bits_float(values[size_t(v)]));
        const uint8_t got = codes[size_t(r) * H + 1 + size_t(i)];
        ++checked;
        if (got != want && bad++ < 5) {
          std::printf("  sweep 0x%08x: code 0x%02x, host 0x%02x\n", values[size_t(v)], got, want);
        }
      }
    }
  };
  std::vector<uint32_t> values;
  values.reserve(size_t{kRows} * kPer);
  int batch = 0;
  auto add = [&](uint32_t bits) {
    values.push_back(bits);
    if (values.size() == size_t{kRows} * kPer) {
      run_batch(values, batch++ % 2 ? k::kWireScaleUe8m0 : k::kWireScaleFp32);
      values.clear();
    }
  };
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint64_t u = lo; u <= hi; ++u) add(sign | static_cast<uint32_t>(u));
    for (uint32_t u = 0; u < lo; u += 997) add(sign | u);  // below: all round to +-0
    add(sign | 0x7F800000u);                               // +-Inf: +-448
    add(sign | 0x7FC00001u);                               // NaN: 0x7F
  }
  if (!values.empty()) run_batch(values, k::kWireScaleFp32);
  expect(bad == 0, "sweep: " + std::to_string(bad) + " of " + std::to_string(checked) + " values differ");
  std::printf("sweep: %lld values, %lld differ\n", static_cast<long long>(checked), static_cast<long long>(bad));
}

// Every code (0xFF and the never produced -0 ... included) times scales of
// every kind a quantizer makes, into each dtype, vector and scalar paths.
void every_code(std::mt19937_64& rng) {
  for (int32_t H : {4096, 1001}) {
    const int32_t blocks = moe_ep::wire_blocks(H), rows = 8;
    std::vector<uint8_t> codes(size_t(rows) * H);
    std::vector<float> scales(size_t(rows) * blocks);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i);
    for (size_t b = 0; b < scales.size(); ++b) {
      const float amax = bits_float(static_cast<uint32_t>(rng()) & 0x7F7FFFFFu);  // any finite magnitude
      scales[b] = moe_ep::wire_block_scale(amax, b % 2 ? MOE_EP_WIRE_SCALE_UE8M0 : MOE_EP_WIRE_SCALE_FP32);
    }
    DeviceBuffer dcodes(codes.size()), dscales(scales.size() * 4);
    dcodes.upload(codes.data(), codes.size());
    dscales.upload(scales.data(), scales.size() * 4);
    for (const DtypeCase& out : kDtypes) {
      DeviceBuffer dout(size_t(rows) * H * out.bytes);
      dout.poison();
      const k::WireRowSet set{rows, nullptr, 0, 0};
      const k::WireDequantizeRows d{H,
                                    out.code,
                                    dcodes.as<uint8_t>(),
                                    H,
                                    dscales.as<float>(),
                                    int64_t{blocks} * 4,
                                    dout.p,
                                    int64_t{H} * out.bytes};
      check(k::launch_dequantize_rows(d, set, 64, 0, nullptr), "launch_dequantize_rows");
      check(cudaDeviceSynchronize(), "dequantize");
      const std::vector<uint8_t> got = dout.download();
      std::vector<uint8_t> want(got.size());
      for (int32_t r = 0; r < rows; ++r) {
        moe_ep::dequantize_row(codes.data() + size_t(r) * H, scales.data() + size_t(r) * blocks, H, out.dtype,
                               want.data() + size_t(r) * H * out.bytes);
      }
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); i += size_t(out.bytes)) bad += std::memcmp(&got[i], &want[i], out.bytes) != 0;
      expect(bad == 0, std::string("every code to ") + out.name + " H " + std::to_string(H) + ": " +
                           std::to_string(bad) + " values differ");
    }
  }
}

void launch_checks() {
  DeviceBuffer buf(1 << 16);
  const k::WireRowSet set{4, nullptr, 0, 0};
  const k::WireQuantizeRows good{
      256, k::kCombineBf16, k::kWireScaleFp32, buf.p, 512, buf.as<uint8_t>(), 256, buf.as<float>(), 8};
  expect(k::launch_quantize_rows(good, set, 4, 0, nullptr) == cudaSuccess, "a good quantize launch");
  auto refused = [&](k::WireQuantizeRows q, k::WireRowSet s, const char* what) {
    expect(k::launch_quantize_rows(q, s, 4, 0, nullptr) == cudaErrorInvalidValue, std::string("refused: ") + what);
  };
  k::WireQuantizeRows q = good;
  q.dtype = 7;
  refused(q, set, "dtype 7");
  q = good;
  q.scale_rule = 2;
  refused(q, set, "scale rule 2");
  q = good;
  q.elems = 0;
  refused(q, set, "0 elements");
  q = good;
  q.in_stride = 510;
  refused(q, set, "an input stride shorter than a row");
  q = good;
  q.codes_stride = 255;
  refused(q, set, "a code stride shorter than a row");
  q = good;
  q.scales_stride = 4;
  refused(q, set, "a scale stride shorter than two scales");
  q = good;
  q.scales = reinterpret_cast<float*>(buf.as<uint8_t>() + 2);
  refused(q, set, "misaligned scales");
  q = good;
  q.in = buf.as<uint8_t>() + 1;
  refused(q, set, "misaligned bf16 rows");
  refused(good, k::WireRowSet{-1, nullptr, 0, 0}, "-1 rows");
  refused(good, k::WireRowSet{0, buf.as<int32_t>(), -1, 4}, "-1 sources");
  expect(k::launch_quantize_rows(good, k::WireRowSet{0, nullptr, 0, 0}, 4, 0, nullptr) == cudaSuccess, "no rows");
  const k::WireDequantizeRows d{256, k::kCombineFp32, buf.as<uint8_t>(), 256, buf.as<float>(), 8, buf.p, 1024};
  expect(k::launch_dequantize_rows(d, set, 4, 0, nullptr) == cudaSuccess, "a good dequantize launch");
  k::WireDequantizeRows e = d;
  e.out_stride = 1020;
  expect(k::launch_dequantize_rows(e, set, 4, 0, nullptr) == cudaErrorInvalidValue,
         "refused: an output stride shorter than a row");
  e = d;
  e.dtype = -1;
  expect(k::launch_dequantize_rows(e, set, 4, 0, nullptr) == cudaErrorInvalidValue, "refused: dtype -1");
  check(cudaDeviceSynchronize(), "launch checks");
}

// The DeepSeek shape once, checked and timed (the time is printed, not asserted).
void deepseek_shape(std::mt19937_64& rng) {
  const int32_t H = 7168, T = 8192, blocks = moe_ep::wire_blocks(H);
  const DtypeCase& dt = kDtypes[0];
  std::vector<uint8_t> in(size_t(T) * H * 2);
  std::uniform_real_distribution<float> normal(-3.0f, 3.0f);
  for (size_t i = 0; i < size_t(T) * H; ++i) put(dt, in.data(), int64_t(i), normal(rng));
  DeviceBuffer din(in.size()), dcodes(size_t(T) * H), dscales(size_t(T) * blocks * 4), dout(in.size());
  din.upload(in.data(), in.size());
  const k::WireRowSet set{T, nullptr, 0, 0};
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  for (int32_t rule : {k::kWireScaleFp32, k::kWireScaleUe8m0}) {
    const k::WireQuantizeRows q{
        H, dt.code, rule, din.p, H * 2, dcodes.as<uint8_t>(), H, dscales.as<float>(), int64_t{blocks} * 4};
    const k::WireDequantizeRows d{H,      dt.code, dcodes.as<uint8_t>(), H, dscales.as<float>(), int64_t{blocks} * 4,
                                  dout.p, H * 2};
    cudaEvent_t e0, e1, e2;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    check(cudaEventCreate(&e2), "event");
    float tq = 0, td = 0;
    for (int it = 0; it < 6; ++it) {
      check(cudaEventRecord(e0, nullptr), "record");
      check(k::launch_quantize_rows(q, set, sms * 8, 0, nullptr), "launch_quantize_rows");
      check(cudaEventRecord(e1, nullptr), "record");
      check(k::launch_dequantize_rows(d, set, sms * 8, 0, nullptr), "launch_dequantize_rows");
      check(cudaEventRecord(e2, nullptr), "record");
      check(cudaEventSynchronize(e2), "sync");
      float a = 0, b = 0;
      check(cudaEventElapsedTime(&a, e0, e1), "elapsed");
      check(cudaEventElapsedTime(&b, e1, e2), "elapsed");
      if (it > 0) tq += a / 5, td += b / 5;
    }
    check(cudaEventDestroy(e0), "event");
    check(cudaEventDestroy(e1), "event");
    check(cudaEventDestroy(e2), "event");
    const std::vector<uint8_t> codes = dcodes.download(), scales = dscales.download(), out = dout.download();
    std::vector<uint8_t> wc(static_cast<size_t>(H)), wo(size_t(H) * 2);
    std::vector<float> ws(static_cast<size_t>(blocks));
    int64_t bad = 0;
    for (int32_t r = 0; r < T; ++r) {
      moe_ep::quantize_row(dt.dtype, in.data() + size_t(r) * H * 2, H, rule, wc.data(), ws.data());
      moe_ep::dequantize_row(wc.data(), ws.data(), H, dt.dtype, wo.data());
      bad += std::memcmp(codes.data() + size_t(r) * H, wc.data(), wc.size()) != 0 ||
             std::memcmp(scales.data() + size_t(r) * blocks * 4, ws.data(), ws.size() * 4) != 0 ||
             std::memcmp(out.data() + size_t(r) * H * 2, wo.data(), wo.size()) != 0;
    }
    expect(bad == 0, "8192 x 7168 bf16 rule " + std::to_string(rule) + ": " + std::to_string(bad) + " rows differ");
    std::printf("8192 x 7168 bf16, rule %d: quantize %.1f us, dequantize %.1f us\n", rule, tq * 1000, td * 1000);
  }
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log even if the test dies
  std::mt19937_64 rng(std::random_device{}());
  launch_checks();
  const Shape shapes[] = {
      {7168, 0, 0, 0, 0},    // the DeepSeek row
      {1000, 0, 0, 0, 0},    // a short last block (104), vectors
      {130, 0, 0, 0, 0},     // a last block of 2
      {64, 0, 0, 0, 0},      // below one block
      {1, 0, 0, 0, 0},       // one element
      {7, 0, 0, 0, 0},       // not a multiple of 8: element by element
      {1029, 0, 0, 0, 0},    // neither
      {384, 4, 3, 4, 4},     // padded strides: element by element
      {256, 16, 8, 12, 16},  // padded, still aligned: vectors, padding stays poisoned
  };
  for (const DtypeCase& dt : kDtypes) {
    for (int32_t rule : {k::kWireScaleFp32, k::kWireScaleUe8m0}) {
      for (const Shape& sh : shapes) {
        const std::string base = std::string(dt.name) + (rule ? " ue8m0" : " fp32") + " H " + std::to_string(sh.elems) +
                                 (sh.in_pad || sh.codes_pad ? " padded" : "");
        RowSet host{{37, nullptr, 0, 0}, {}, 37};
        run_quantize(dt, rule, sh, host, nullptr, rng, base + " host rows");
        // Rank-major rows: 5 sources of 9 rows, counts 9, 0, 4, 13 (above 9: all), -3 (none).
        RowSet rank_major{{0, nullptr, 5, 9}, {9, 0, 4, 13, -3}, 45};
        DeviceBuffer counts(rank_major.counts.size() * 4);
        counts.upload(rank_major.counts.data(), rank_major.counts.size() * 4);
        run_quantize(dt, rule, sh, rank_major, &counts, rng, base + " rank-major rows");
      }
    }
  }
  current = "every code";
  every_code(rng);
  current = "sweep";
  sweep_conversion();
  current = "DeepSeek shape";
  deepseek_shape(rng);
  std::printf("%s (%d failures)\n", failures == 0 ? "PASSED" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
