//! The FP8 wire through the Rust bindings, HOST backend: `Params::dispatch_wire`,
//! `combine_wire`, `wire_scale`, `dispatch_dequantize`.  Codes and scales are
//! compared bit for bit with a small quantizer written here from
//! docs/semantics.md ("A low-precision wire"): a search of the table of every
//! finite e4m3fn value, not the library's bit manipulation.
mod common;

use common::*;
use moe_ep::*;
use std::sync::Arc;

const BLOCK: usize = 128;

/// The value of every non-negative finite code 0x00..=0x7E, ascending.
fn e4m3_table() -> Vec<f64> {
    (0u32..0x7F)
        .map(|c| {
            let (e, m) = ((c >> 3) as i32, (c & 7) as f64);
            if e == 0 { m * 2f64.powi(-9) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) }
        })
        .collect()
}

/// Nearest finite value, ties to the even code, saturated at 448, NaN ->
/// 0x7F, the sign kept (on zero too).
fn encode(table: &[f64], q: f32) -> u8 {
    if q.is_nan() {
        return 0x7F;
    }
    let sign = if q.is_sign_negative() { 0x80 } else { 0 };
    let a = q.abs() as f64;
    if a >= 448.0 {
        return sign | 0x7E;
    }
    let i = table.iter().rposition(|&v| v <= a).unwrap();
    let (lo, hi) = (a - table[i], table[i + 1] - a);
    let code = if lo < hi { i } else if hi < lo { i + 1 } else if i % 2 == 0 { i } else { i + 1 };
    sign | code as u8
}

fn decode(table: &[f64], code: u8) -> f32 {
    if code & 0x7F == 0x7F {
        return f32::NAN;
    }
    let v = table[(code & 0x7F) as usize] as f32;
    if code & 0x80 != 0 { -v } else { v }
}

fn block_scale(block: &[f32], rule: WireScale) -> f32 {
    let amax = block.iter().filter(|v| v.is_finite()).fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        return 1.0;
    }
    match rule {
        WireScale::Fp32 => {
            let s = amax / 448.0; // one f32 division, round to nearest even
            if s == 0.0 { f32::from_bits(1) } else { s }
        }
        WireScale::Ue8m0 => {
            let mut e = -127;
            while 448.0 * 2f64.powi(e) < amax as f64 {
                e += 1;
            }
            2f64.powi(e) as f32
        }
    }
}

/// One row -> (codes, scales), as the documented rules say.
fn quantize(table: &[f64], row: &[f32], rule: WireScale) -> (Vec<u8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(row.len());
    let mut scales = Vec::new();
    for blk in row.chunks(BLOCK) {
        let s = block_scale(blk, rule);
        scales.push(s);
        codes.extend(blk.iter().map(|&v| encode(table, v / s)));
    }
    (codes, scales)
}

fn dequantize(table: &[f64], codes: &[u8], scales: &[f32]) -> Vec<f32> {
    codes.iter().enumerate().map(|(i, &c)| decode(table, c) * scales[i / BLOCK]).collect()
}

/// One rank, every token to expert 0: (codes, the view's dtype, scales, their shape).
fn single_dispatch(x: &[f32], t: usize, r: usize, rule: WireScale) -> (Vec<u8>, DType, Vec<f32>, Vec<i64>) {
    let params = f32_params(1, 1, t, r).dispatch_wire(WireFormat::Fp8E4m3Block128).wire_scale(rule);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&host())).unwrap();
    let ids = vec![0i32; t];
    let res = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(x, &[t as i64, r as i64]).unwrap(),
                                             TensorRef::from_slice(&ids, &[t as i64, 1]).unwrap())).unwrap();
    assert_eq!(res.hidden_states.shape(), &[t as i64, r as i64]);
    let codes = res.hidden_states.as_bits::<u8>().unwrap().to_vec();
    let sc = res.hidden_states_scale.as_ref().expect("scales");
    (codes, res.hidden_states.dtype(), sc.as_slice::<f32>().unwrap().to_vec(), sc.shape().to_vec())
}

#[test]
fn known_values() {
    let table = e4m3_table();
    let r = BLOCK + 2;
    let mut x = vec![0f32; 3 * r];
    x[..6].copy_from_slice(&[1.0, 448.0, 0.0, -0.0, 0.5, -448.0]);
    // Ties go to the even code, normal and subnormal (432: between 0x7D and 0x7E).
    x[6..11].copy_from_slice(&[1.0625, 1.1875, 2f32.powi(-10), 3.0 * 2f32.powi(-10), 432.0]);
    x[BLOCK] = 3.0;
    x[BLOCK + 1] = -1.5;
    // row 1: all zeros
    x[2 * r..2 * r + 4].copy_from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 2.0]);
    let (codes, dtype, scales, shape) = single_dispatch(&x, 3, r, WireScale::Fp32);
    assert_eq!(dtype, DType::FP8_E4M3FN);
    assert_eq!(shape, vec![3, 2]);
    assert_eq!(scales[0], 1.0, "amax 448 gives scale 1");
    assert_eq!(&codes[..11], &[0x38, 0x7E, 0x00, 0x80, 0x30, 0xFE, 0x38, 0x3A, 0x00, 0x02, 0x7E]);
    assert_eq!(scales[1], 3.0f32 / 448.0);
    assert_eq!(&scales[2..4], &[1.0, 1.0], "a block of zeros gets scale 1");
    assert!(codes[r..2 * r].iter().all(|&c| c == 0));
    assert_eq!(scales[4], 2.0f32 / 448.0, "NaN and Inf are left out of amax");
    assert_eq!(&codes[2 * r..2 * r + 4], &[0x7F, 0x7E, 0xFE, 0x7E]);
    for t in 0..3 {
        let (c, s) = quantize(&table, &x[t * r..(t + 1) * r], WireScale::Fp32);
        assert_eq!(&codes[t * r..(t + 1) * r], &c[..], "codes of row {t}");
        assert_eq!(bits(&scales[2 * t..2 * t + 2]), bits(&s), "scales of row {t}");
    }
}

#[test]
fn ue8m0_scales_are_powers_of_two() {
    let table = e4m3_table();
    let mut x = vec![0f32; 5 * BLOCK];
    for (t, v) in [448.0f32, 449.0, 1.0, 3e-38].into_iter().enumerate() {
        x[t * BLOCK] = v;
    }
    let (codes, _, scales, _) = single_dispatch(&x, 5, BLOCK, WireScale::Ue8m0);
    assert_eq!(scales, vec![1.0, 2.0, 2f32.powi(-8), 2f64.powi(-127) as f32, 1.0]);
    for t in 0..5 {
        let (c, s) = quantize(&table, &x[t * BLOCK..(t + 1) * BLOCK], WireScale::Ue8m0);
        assert_eq!(&codes[t * BLOCK..(t + 1) * BLOCK], &c[..]);
        assert_eq!(scales[t], s[0]);
    }
}

/// Token `t` of rank `s` picks experts (t + s) % E and (t + s + 1) % E.
fn ids_of(s: usize, t: usize, e: usize) -> [i32; 2] {
    [((t + s) % e) as i32, ((t + s + 1) % e) as i32]
}

/// Rows over many magnitudes (token `tok` scaled by 10^((7 tok) % 70 - 35)),
/// so that tiny, huge and subnormal-code blocks occur.
fn rows_of(s: usize, t: usize, h: usize) -> Vec<f32> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((s as u64) << 32 | t as u64 + 1));
    let mut x = Vec::with_capacity(t * h);
    for tok in 0..t {
        let mag = 10f32.powi((tok as i32 * 7) % 70 - 35);
        x.extend((0..h).map(|_| rng.value(mag)));
    }
    if t > 0 {
        x[..BLOCK.min(h)].iter_mut().for_each(|v| *v = 0.0);
        x[h - 1] = f32::NAN;
        x[t * h - 2] = f32::INFINITY;
    }
    x
}

struct Wire {
    world: usize,
    e: usize,
    h: usize,
    tpr: usize,
}

impl Wire {
    fn tokens(&self, s: usize) -> usize {
        (self.tpr - s % 2).max(1)
    }
    fn goes_to(&self, s: usize, t: usize, dest: usize) -> bool {
        let el = self.e / self.world;
        ids_of(s, t, self.e).iter().any(|&g| g as usize / el == dest)
    }
    /// Rank `dest`'s receive rows in rank-major order: (row, source rank, token).
    fn received(&self, dest: usize) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        for s in 0..self.world {
            let mut slot = 0;
            for t in 0..self.tokens(s) {
                if self.goes_to(s, t, dest) {
                    out.push((s * self.tpr + slot, s, t));
                    slot += 1;
                }
            }
        }
        out
    }
    fn params(&self) -> Params {
        f32_params(self.e, 2, self.tpr, self.h)
    }
}

fn dispatch_case(world: usize, rule: WireScale, dequant: bool) {
    let w = Arc::new(Wire { world, e: 2 * world, h: 2 * BLOCK + 33, tpr: 5 });
    on_ranks(world, move |me, bs| {
        let table = e4m3_table();
        let (t, h) = (w.tokens(me), w.h);
        let x = rows_of(me, t, h);
        let ids: Vec<i32> = (0..t).flat_map(|tok| ids_of(me, tok, w.e)).collect();
        let params = w.params().dispatch_wire(WireFormat::Fp8E4m3Block128).wire_scale(rule)
            .dispatch_dequantize(dequant);
        let mut ep = MoeEp::new(bs, &params, Some(&host())).unwrap();
        let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[t as i64, h as i64]).unwrap(),
                                               TensorRef::from_slice(&ids, &[t as i64, 2]).unwrap())).unwrap();
        let p = (world * w.tpr) as i64;
        assert_eq!(r.hidden_states.shape(), &[p, h as i64]);
        let sw = h.div_ceil(BLOCK);
        if dequant {
            assert_eq!(r.hidden_states.dtype(), DType::F32);
            assert!(r.hidden_states_scale.is_none());
        } else {
            assert_eq!(r.hidden_states.dtype(), DType::FP8_E4M3FN);
            assert!(r.hidden_states.as_slice::<u8>().is_err(), "FP8 rows are not u8 values");
            assert!(r.hidden_states.as_bits::<u16>().is_err(), "FP8 rows are 8 bits wide");
            assert_eq!(r.hidden_states_scale.as_ref().unwrap().shape(), &[p, sw as i64]);
        }
        for (row, s, tok) in w.received(me) {
            let src = &rows_of(s, w.tokens(s), h)[tok * h..(tok + 1) * h];
            let (c, sc) = quantize(&table, src, rule);
            if dequant {
                let got = &r.hidden_states.as_slice::<f32>().unwrap()[row * h..(row + 1) * h];
                let want = dequantize(&table, &c, &sc);
                assert_eq!(bits(got), bits(&want), "rank {me} row {row}");
            } else {
                let codes = &r.hidden_states.as_bits::<u8>().unwrap()[row * h..(row + 1) * h];
                let scales = &r.hidden_states_scale.as_ref().unwrap().as_slice::<f32>().unwrap()[row * sw..(row + 1) * sw];
                assert_eq!(codes, &c[..], "codes, rank {me} row {row}");
                assert_eq!(scales, &sc[..], "scales, rank {me} row {row}");
            }
        }
    });
}

#[test]
fn dispatch_fp8_matches_model() {
    for world in 1..=3 {
        for rule in [WireScale::Fp32, WireScale::Ue8m0] {
            dispatch_case(world, rule, false);
        }
    }
}

#[test]
fn dispatch_dequantized_matches_model() {
    for rule in [WireScale::Fp32, WireScale::Ue8m0] {
        dispatch_case(2, rule, true);
    }
}

/// Combine with an FP8 wire: bitwise the model (each rank's rows quantized,
/// dequantized to f32, summed in ascending rank order), and within the
/// documented bound of the same combine over AS_IS.
#[test]
fn combine_fp8_matches_model_and_bound() {
    for world in [2usize, 3] {
        let w = Arc::new(Wire { world, e: 2 * world, h: BLOCK + 60, tpr: 4 });
        on_ranks(world, move |me, bs| {
            let table = e4m3_table();
            let (t, h) = (w.tokens(me), w.h);
            // Finite rows here: the bound is about values.
            let x: Vec<f32> = rows_of(me, t, h).into_iter().map(|v| if v.is_finite() { v } else { 1.0 }).collect();
            let ids: Vec<i32> = (0..t).flat_map(|tok| ids_of(me, tok, w.e)).collect();
            let mut got = Vec::new();
            for wire in [WireFormat::AsIs, WireFormat::Fp8E4m3Block128] {
                let mut params = w.params().combine_wire(wire);
                if wire != WireFormat::AsIs {
                    params = params.wire_scale(WireScale::Fp32);
                }
                let mut ep = MoeEp::new(bs.clone(), &params, Some(&host())).unwrap();
                let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[t as i64, h as i64]).unwrap(),
                                                       TensorRef::from_slice(&ids, &[t as i64, 2]).unwrap()))
                    .unwrap();
                // Expert: each row times (this rank + 1).
                let eo: Vec<f32> = r.hidden_states.as_slice::<f32>().unwrap().iter()
                    .map(|v| v * (me as f32 + 1.0)).collect();
                let shape = r.hidden_states.shape().to_vec();
                drop(r);
                got.push(ep.combine(&TensorRef::from_slice(&eo, &shape).unwrap()).unwrap().as_slice::<f32>()
                    .unwrap().to_vec());
            }
            let (as_is, fp8) = (&got[0], &got[1]);
            for tok in 0..t {
                let src = &x[tok * h..(tok + 1) * h];
                let mut acc = vec![0f32; h];
                let mut bound = vec![0f64; h];
                for rr in 0..world {
                    if !w.goes_to(me, tok, rr) {
                        continue;
                    }
                    let v: Vec<f32> = src.iter().map(|a| a * (rr as f32 + 1.0)).collect();
                    let (c, sc) = quantize(&table, &v, WireScale::Fp32);
                    for (i, d) in dequantize(&table, &c, &sc).into_iter().enumerate() {
                        acc[i] += d;
                        bound[i] += 2f64.powi(-4) * v[i].abs() as f64 + 2f64.powi(-10) * sc[i / BLOCK] as f64
                            + 2f64.powi(-20) * v[i].abs() as f64;
                    }
                }
                for i in 0..h {
                    let (g, a) = (fp8[tok * h + i], as_is[tok * h + i]);
                    assert_eq!(g.to_bits(), acc[i].to_bits(), "rank {me} token {tok} elem {i}: {g} vs {}", acc[i]);
                    assert!(((g - a).abs() as f64) <= bound[i], "rank {me} token {tok} elem {i}: {g} vs {a}");
                }
            }
        });
    }
}

#[test]
fn bad_wire_values_name_the_field() {
    let base = || f32_params(1, 1, 1, 4);
    let cases = [
        (base().dispatch_wire(WireFormat::Fp8E4m3Block128).scales(1, DType::F32), "params->scale_row_elems"),
        (base().wire_scale(WireScale::Ue8m0), "params->wire_scale"),
        (base().dispatch_dequantize(true), "params->dispatch_dequantize"),
        (base().dispatch_wire(WireFormat::Fp8E4m3Block128).hidden_dtype(DType::FP8_E4M3FN), "params->hidden_dtype"),
    ];
    for (params, field) in cases {
        let err = MoeEp::new(Arc::new(SingleRank), &params, Some(&host())).err().expect("refused");
        assert_eq!(err.status, Status::INVALID_ARGUMENT, "{field}: {}", err.message);
        assert!(err.message.contains(field), "{field}: {}", err.message);
    }
    let ws = workspace_size(&base().dispatch_wire(WireFormat::Fp8E4m3Block128), Some(&host()), 1).unwrap();
    assert!(ws > 0);
}
