//! The expert receive layouts on the HOST backend, ranks as threads: every
//! result against a model of docs/semantics.md §4 ("Receive layouts") written
//! here, and combine bitwise equal to a rank-major combine of the same
//! weighted, locally reduced rows.
mod common;

use common::*;
use moe_ep::*;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Copy, Debug)]
struct Layout {
    layout: ReceiveLayout,
    capacity: i32,
    alignment: i32,
    rows: i32,
    weighted: bool,
}

struct Case {
    world: usize,
    e: usize,
    k: usize,
    h: usize,
    tpr: usize,
    with_weights: bool,
    inputs: Vec<RankInput>,
}

/// What rank `me` must receive: per row its (source rank, token, pick) and
/// weight, per local expert the rows written and received, the offsets.
struct Expected {
    rows: usize,
    sources: Vec<[i32; 3]>,
    weights: Vec<f32>,
    counts: Vec<i32>,
    received: Vec<i32>,
    offsets: Vec<i32>,
    dropped: i32,
}

impl Case {
    fn new(seed: u64, world: usize, e: usize, k: usize, h: usize, tpr: usize, with_weights: bool) -> Case {
        let inputs = random_inputs(seed, world, e, k, h, tpr, 6, (world > 1).then(|| world - 1));
        Case { world, e, k, h, tpr, with_weights, inputs }
    }
    fn el(&self) -> usize {
        self.e / self.world
    }
    fn mine(&self, id: i32, me: usize) -> bool {
        id >= 0 && (id as usize) < self.e && id as usize / self.el() == me
    }
    fn goes_to(&self, s: usize, t: usize, me: usize) -> bool {
        self.inputs[s].ids[t * self.k..(t + 1) * self.k].iter().any(|&id| self.mine(id, me))
    }
    fn expected(&self, me: usize, l: &Layout) -> Expected {
        let el = self.el();
        let mut pairs: Vec<Vec<[i32; 3]>> = vec![Vec::new(); el];
        for (s, inp) in self.inputs.iter().enumerate() {
            for t in 0..inp.t {
                for j in 0..self.k {
                    let id = inp.ids[t * self.k + j];
                    if self.mine(id, me) {
                        pairs[id as usize - me * el].push([s as i32, t as i32, j as i32]);
                    }
                }
            }
        }
        let (rows, starts, counts, offsets) = match l.layout {
            ReceiveLayout::ExpertMajor => {
                let cap = if l.capacity > 0 { l.capacity as usize } else { self.world * self.tpr };
                let counts: Vec<usize> = pairs.iter().map(|p| p.len().min(cap)).collect();
                (el * cap, (0..el).map(|e| e * cap).collect::<Vec<_>>(), counts, Vec::new())
            }
            _ => {
                let a = l.alignment.max(1) as usize;
                let worst = (self.world * self.tpr * self.k.min(el) + el * (a - 1)) / a * a;
                let rows = if l.rows > 0 { l.rows as usize } else { worst };
                let (mut starts, mut counts, mut off) = (Vec::new(), Vec::new(), 0usize);
                for p in &pairs {
                    starts.push(off);
                    counts.push(p.len().min(rows - off));
                    off = (off + counts.last().unwrap()).div_ceil(a) * a;
                }
                let mut offsets: Vec<i32> = starts.iter().map(|&o| o as i32).collect();
                offsets.push(off as i32);
                (rows, starts, counts, offsets)
            }
        };
        let mut sources = vec![[-1; 3]; rows];
        let mut weights = vec![0.0f32; rows];
        for e in 0..el {
            for (j, src) in pairs[e][..counts[e]].iter().enumerate() {
                sources[starts[e] + j] = *src;
                let inp = &self.inputs[src[0] as usize];
                weights[starts[e] + j] =
                    if self.with_weights { inp.w[src[1] as usize * self.k + src[2] as usize] } else { 1.0 };
            }
        }
        let received: Vec<i32> = pairs.iter().map(|p| p.len() as i32).collect();
        let written: usize = counts.iter().sum();
        Expected {
            rows,
            sources,
            weights,
            dropped: received.iter().sum::<i32>() - written as i32,
            counts: counts.iter().map(|&c| c as i32).collect(),
            received,
            offsets,
        }
    }
}

/// What the experts return for a row: (global expert id + 1) * x, times the
/// pick's weight too when the layout says the output is weighted.
fn expert_row(case: &Case, src: [i32; 3], x: &[f32], w: f32, weighted: bool) -> Vec<f32> {
    let id = case.inputs[src[0] as usize].ids[src[1] as usize * case.k + src[2] as usize];
    x.iter().map(|&v| { let y = v * (id + 1) as f32; if weighted { y * w } else { y } }).collect()
}

struct Got {
    hidden: Vec<f32>,
    hidden_shape: Vec<i64>,
    sources: Vec<i32>,
    weights: Vec<f32>,
    counts: Vec<i32>,
    received: Vec<i32>,
    offsets: Option<Vec<i32>>,
    dropped: i32,
    no_ids: bool,
    output: Vec<f32>,
    rank_major_output: Vec<f32>,
}

fn run_rank(case: &Case, me: usize, bs: Arc<ThreadRank>, l: &Layout) -> Got {
    let base = f32_params(case.e, case.k, case.tpr, case.h);
    let mut params = base.receive_layout(l.layout).expert_output_weighted(l.weighted);
    if l.capacity > 0 {
        params = params.expert_capacity(l.capacity);
    }
    if l.alignment > 0 {
        params = params.expert_alignment(l.alignment);
    }
    if l.rows > 0 {
        params = params.expert_rows(l.rows);
    }
    let mut ep = MoeEp::new(bs.clone(), &params, Some(&host())).unwrap();
    let mut rank_major = MoeEp::new(bs, &base, Some(&host())).unwrap();
    let inp = &case.inputs[me];
    let (t, kk, hh) = (inp.t as i64, case.k as i64, case.h as i64);
    let mut args = DispatchArgs::new(TensorRef::from_slice(&inp.x, &[t, hh]).unwrap(),
                                     TensorRef::from_slice(&inp.ids, &[t, kk]).unwrap());
    if case.with_weights {
        args = args.weights(TensorRef::from_slice(&inp.w, &[t, kk]).unwrap());
    }
    let r = ep.dispatch(&args).unwrap();
    let copy_i32 = |v: &Option<View<'_>>| v.as_ref().map(|v| v.as_slice::<i32>().unwrap().to_vec());
    let mut got = Got {
        hidden: r.hidden_states.as_slice::<f32>().unwrap().to_vec(),
        hidden_shape: r.hidden_states.shape().to_vec(),
        sources: copy_i32(&r.row_sources).unwrap(),
        weights: r.row_weights.as_ref().unwrap().as_slice::<f32>().unwrap().to_vec(),
        counts: copy_i32(&r.expert_counts).unwrap(),
        received: r.local_expert_counts.as_slice::<i32>().unwrap().to_vec(),
        offsets: copy_i32(&r.expert_offsets),
        dropped: copy_i32(&r.dropped_pairs).unwrap()[0],
        no_ids: r.topk_ids.is_none() && r.topk_weights.is_none(),
        output: Vec::new(),
        rank_major_output: Vec::new(),
    };
    drop(r);
    // The experts, on the rows the library handed out; padding rows NaN, so a
    // combine that read one would show.
    let rows = got.weights.len();
    let mut eo = vec![f32::NAN; rows * case.h];
    // (source rank, token) -> its rows here as (global expert, pick, row).
    let mut rows_of: BTreeMap<(i32, i32), Vec<(i32, i32, usize)>> = BTreeMap::new();
    for row in 0..rows {
        let src = [got.sources[row * 3], got.sources[row * 3 + 1], got.sources[row * 3 + 2]];
        if src[0] < 0 {
            continue;
        }
        let y = expert_row(case, src, &got.hidden[row * case.h..(row + 1) * case.h], got.weights[row], l.weighted);
        eo[row * case.h..(row + 1) * case.h].copy_from_slice(&y);
        let id = case.inputs[src[0] as usize].ids[src[1] as usize * case.k + src[2] as usize];
        rows_of.entry((src[0], src[1])).or_default().push((id, src[2], row));
    }
    // The expert output has the rows' shape, with H columns.
    let mut eo_shape = got.hidden_shape.clone();
    *eo_shape.last_mut().unwrap() = hh;
    got.output = ep.combine(&TensorRef::from_slice(&eo, &eo_shape).unwrap()).unwrap().as_slice::<f32>().unwrap().to_vec();
    // Rank-major: row (s, slot) gets the token's rows here reduced the way
    // the contract says, ascending (local expert, pick), w * y in fp32.
    let r = rank_major.dispatch(&args).unwrap();
    let p = r.hidden_states.shape()[0] as usize;
    let recv = r.recv_counts.as_slice::<i32>().unwrap().to_vec();
    drop(r);
    let mut rm_eo = vec![f32::NAN; p * case.h];
    for s in 0..case.world {
        let tokens: Vec<usize> = (0..case.inputs[s].t).filter(|&t| case.goes_to(s, t, me)).collect();
        assert_eq!(tokens.len(), recv[s] as usize);
        for (slot, &t) in tokens.iter().enumerate() {
            let mut acc = vec![0.0f32; case.h];
            let mut mine = rows_of.get(&(s as i32, t as i32)).cloned().unwrap_or_default();
            mine.sort();
            for (_, _, row) in mine {
                for c in 0..case.h {
                    let y = eo[row * case.h + c];
                    acc[c] += if l.weighted { y } else { got.weights[row] * y };
                }
            }
            let at = (s * case.tpr + slot) * case.h;
            rm_eo[at..at + case.h].copy_from_slice(&acc);
        }
    }
    got.rank_major_output =
        rank_major.combine(&TensorRef::from_slice(&rm_eo, &[p as i64, hh]).unwrap()).unwrap().as_slice::<f32>()
            .unwrap().to_vec();
    rank_major.destroy().unwrap();
    ep.destroy().unwrap();
    got
}

fn check(case: &Case, me: usize, l: &Layout, got: &Got) -> (i32, bool) {
    let x = case.expected(me, l);
    let what = format!("rank {me}, {l:?}");
    let el = case.el() as i64;
    let shape: Vec<i64> = match l.layout {
        ReceiveLayout::ExpertMajor => vec![el, (x.rows as i64) / el, case.h as i64],
        _ => vec![x.rows as i64, case.h as i64],
    };
    assert_eq!(got.hidden_shape, shape, "{what}");
    assert!(got.no_ids, "{what}: topk_ids/topk_weights present");
    assert_eq!(got.counts, x.counts, "expert_counts, {what}");
    assert_eq!(got.received, x.received, "local_expert_counts, {what}");
    match l.layout {
        ReceiveLayout::ExpertPacked => assert_eq!(got.offsets.as_ref(), Some(&x.offsets), "offsets, {what}"),
        _ => assert!(got.offsets.is_none(), "{what}"),
    }
    assert_eq!(got.sources, x.sources.concat(), "row_sources, {what}");
    assert_eq!(bits(&got.weights), bits(&x.weights), "row_weights, {what}");
    assert_eq!(got.dropped, x.dropped, "dropped_pairs, {what}");
    for (row, src) in x.sources.iter().enumerate() {
        if src[0] >= 0 {
            let inp = &case.inputs[src[0] as usize];
            let t = src[1] as usize;
            assert_eq!(&got.hidden[row * case.h..(row + 1) * case.h], &inp.x[t * case.h..(t + 1) * case.h],
                       "row {row}, {what}");
        }
    }
    assert_eq!(bits(&got.output), bits(&got.rank_major_output), "combine against rank-major, {what}");
    // Without drops: close to the layout-free sum over the token's picks.
    if x.dropped == 0 && got.dropped == 0 {
        let inp = &case.inputs[me];
        for t in 0..inp.t {
            for c in 0..case.h {
                let want: f32 = (0..case.k)
                    .filter(|&j| inp.ids[t * case.k + j] >= 0)
                    .map(|j| {
                        let w = if case.with_weights { inp.w[t * case.k + j] } else { 1.0 };
                        w * (inp.ids[t * case.k + j] + 1) as f32 * inp.x[t * case.h + c]
                    })
                    .sum();
                let y = got.output[t * case.h + c];
                assert!((y - want).abs() <= 1e-4 * (1.0 + want.abs()), "token {t} col {c}: {y} vs {want}, {what}");
            }
        }
    }
    let mut tokens: Vec<[i32; 2]> = x.sources.iter().filter(|s| s[0] >= 0).map(|s| [s[0], s[1]]).collect();
    let n = tokens.len();
    tokens.sort();
    tokens.dedup();
    (x.dropped, tokens.len() < n)
}

fn run(case: Case, l: Layout) -> (bool, bool) {
    let case = Arc::new(case);
    let shared = case.clone();
    let results: Vec<Got> = on_ranks(case.world, move |me, bs| run_rank(&shared, me, bs, &l));
    let (mut dropped, mut twice) = (false, false);
    for (me, got) in results.iter().enumerate() {
        let (d, t) = check(&case, me, &l, got);
        dropped |= d > 0;
        twice |= t;
    }
    (dropped, twice)
}

const PACKED: Layout =
    Layout { layout: ReceiveLayout::ExpertPacked, capacity: 0, alignment: 0, rows: 0, weighted: false };
const MAJOR: Layout = Layout { layout: ReceiveLayout::ExpertMajor, ..PACKED };

#[test]
fn expert_packed_aligned_matches_the_model_and_rank_major() {
    for world in [1, 2, 3] {
        let (dropped, twice) = run(Case::new(11 + world as u64, world, 3 * world, 3, 4, 8, true),
                                   Layout { alignment: 4, ..PACKED });
        assert!(!dropped && twice, "world {world}: the case must give a token several rows");
    }
}

#[test]
fn expert_packed_bounded_rows_drop_pairs_without_weights() {
    let (dropped, _) = run(Case::new(21, 2, 6, 3, 4, 8, false), Layout { alignment: 2, rows: 4, ..PACKED });
    assert!(dropped, "expert_rows 4 must drop pairs");
}

#[test]
fn expert_major_default_and_small_capacity_weighted() {
    let (dropped, twice) = run(Case::new(33, 2, 6, 3, 4, 8, true), MAJOR);
    assert!(!dropped && twice);
    let (dropped, _) = run(Case::new(32, 2, 6, 3, 4, 8, true), Layout { capacity: 2, weighted: true, ..MAJOR });
    assert!(dropped, "capacity 2 must drop pairs");
}

#[test]
fn rank_major_results_have_no_expert_fields_and_bad_layout_params_are_named() {
    let params = f32_params(4, 2, 8, 3);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params.receive_layout(ReceiveLayout::RankMajor),
                            Some(&host())).unwrap();
    let x = vec![1.0f32; 6];
    let ids = vec![0, 1, 2, 3];
    let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3]).unwrap(),
                                           TensorRef::from_slice(&ids, &[2, 2]).unwrap())).unwrap();
    assert!(r.topk_ids.is_some());
    assert!(r.expert_counts.is_none() && r.expert_offsets.is_none() && r.row_sources.is_none()
            && r.row_weights.is_none() && r.dropped_pairs.is_none());
    drop(r);
    ep.destroy().unwrap();
    let e = MoeEp::new(Arc::new(SingleRank), &params.expert_capacity(4), Some(&host())).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(e.message.contains("expert_capacity"), "{e}");
    let bad_rows = params.receive_layout(ReceiveLayout::ExpertPacked).expert_alignment(4).expert_rows(6);
    let e = MoeEp::new(Arc::new(SingleRank), &bad_rows, Some(&host())).err().unwrap();
    assert!(e.status == Status::INVALID_ARGUMENT && e.message.contains("expert_rows"), "{e}");
    let scales = params.scales(2, DType::F32).receive_layout(ReceiveLayout::ExpertMajor);
    let column = scales.scale_layout(ScaleLayout::ColumnMajor);
    assert_eq!(column.raw().scale_layout, moe_ep_sys::MOE_EP_SCALES_COLUMN_MAJOR);
    let small = workspace_size(&params, Some(&host()), 1).unwrap();
    assert!(workspace_size(&column, Some(&host()), 1).unwrap() > small);
}

#[test]
fn column_major_scales_and_zero_copy_in_expert_major() {
    // One rank, capacity 5: scales [E_local, S, align4(5) = 8], element j of
    // row i of expert e at [e, j, i]; combine from combine_input.
    let params = f32_params(2, 2, 5, 2)
        .scales(2, DType::F32).receive_layout(ReceiveLayout::ExpertMajor).expert_capacity(5)
        .scale_layout(ScaleLayout::ColumnMajor);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&host().zero_copy_combine(true))).unwrap();
    let x = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let ids = vec![0, 1, 1, -1, 1, 0];
    let w = vec![0.5f32, 0.25, 2.0, 0.0, 1.0, 4.0];
    let sc = vec![10.0f32, 11.0, 20.0, 21.0, 30.0, 31.0];
    let args = DispatchArgs::new(TensorRef::from_slice(&x, &[3, 2]).unwrap(),
                                 TensorRef::from_slice(&ids, &[3, 2]).unwrap())
        .weights(TensorRef::from_slice(&w, &[3, 2]).unwrap())
        .scales(TensorRef::from_slice(&sc, &[3, 2]).unwrap());
    let mut r = ep.dispatch(&args).unwrap();
    assert_eq!(r.expert_counts.as_ref().unwrap().as_slice::<i32>().unwrap(), &[2, 3]);
    let scales = r.hidden_states_scale.as_ref().unwrap();
    assert_eq!(scales.shape(), &[2, 2, 8]);
    let s = scales.as_slice::<f32>().unwrap();
    // Expert 0: tokens 0 and 2; expert 1: tokens 0, 1 and 2.
    assert_eq!((&s[0..2], &s[8..10]), (&[10.0, 30.0][..], &[11.0, 31.0][..]));
    assert_eq!((&s[16..19], &s[24..27]), (&[10.0, 20.0, 30.0][..], &[11.0, 21.0, 31.0][..]));
    let rows = r.hidden_states.as_slice::<f32>().unwrap().to_vec();
    let view = r.combine_input.as_mut().expect("zero_copy_combine");
    assert_eq!(view.shape(), &[2, 5, 2]);
    view.as_mut_slice::<f32>().unwrap().copy_from_slice(&rows); // identity experts
    drop(r);
    let y = ep.combine_from_input().unwrap().as_slice::<f32>().unwrap().to_vec();
    // Token 0: 0.5 x (expert 0) + 0.25 x (expert 1); token 1: 2 x; token 2:
    // 4 x (expert 0) + 1 x (expert 1).
    assert_eq!(y, vec![0.75, 1.5, 6.0, 8.0, 25.0, 30.0]);
    ep.destroy().unwrap();
}
