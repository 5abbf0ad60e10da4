//! The safe crate on the HOST backend: one rank, and several ranks as threads,
//! checked against a small model of docs/semantics.md §4 written here; the
//! health poll and the active-rank mask ("Active ranks") against the same
//! model of the masked routing.
mod common;

use common::*;
use moe_ep::*;
use std::sync::Arc;

struct Case {
    world: usize,
    e: usize,
    k: usize,
    h: usize,
    tpr: usize,
    inputs: Vec<RankInput>,
}

impl Case {
    fn new(seed: u64, world: usize, e: usize, k: usize, h: usize, tpr: usize) -> Case {
        let inputs = random_inputs(seed, world, e, k, h, tpr, 5, Some(world - 1));
        Case { world, e, k, h, tpr, inputs }
    }
    /// The case under an active-rank mask (docs/semantics.md, "Active
    /// ranks"): picks of experts an inactive rank owns, and every pick of an
    /// inactive rank's own tokens, read -1.  The library's results under the
    /// mask are this case's.
    fn masked(&self, active: &[bool]) -> Case {
        let mut inputs = self.inputs.clone();
        for (s, inp) in inputs.iter_mut().enumerate() {
            for id in inp.ids.iter_mut() {
                if let Some(dest) = self.owner(*id) {
                    if !active[s] || !active[dest] {
                        *id = -1;
                    }
                }
            }
        }
        Case { inputs, ..*self }
    }
    fn owner(&self, id: i32) -> Option<usize> {
        (id >= 0 && (id as usize) < self.e).then(|| id as usize / (self.e / self.world))
    }
    fn goes_to(&self, ids: &[i32], dest: usize) -> bool {
        ids.iter().any(|&id| self.owner(id) == Some(dest))
    }
    /// (recv_counts, hidden rows [P*h], ids [P*k], weights [P*k], local counts).
    fn dispatch(&self, me: usize) -> (Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<i32>) {
        let p = self.world * self.tpr;
        let epr = self.e / self.world;
        let (mut counts, mut hid, mut ids_out, mut w_out, mut local) =
            (vec![0; self.world], vec![0.0; p * self.h], vec![-1; p * self.k], vec![0.0; p * self.k], vec![0; epr]);
        for (s, inp) in self.inputs.iter().enumerate() {
            let mut slot = 0;
            for t in 0..inp.t {
                let ids = &inp.ids[t * self.k..(t + 1) * self.k];
                if !self.goes_to(ids, me) {
                    continue;
                }
                let row = s * self.tpr + slot;
                slot += 1;
                hid[row * self.h..(row + 1) * self.h].copy_from_slice(&inp.x[t * self.h..(t + 1) * self.h]);
                for j in 0..self.k {
                    if self.owner(ids[j]) == Some(me) {
                        ids_out[row * self.k + j] = ids[j];
                        local[ids[j] as usize - me * epr] += 1;
                    }
                    w_out[row * self.k + j] = inp.w[t * self.k + j];
                }
            }
            counts[s] = slot as i32;
        }
        (counts, hid, ids_out, w_out, local)
    }
    /// Rank r's expert output: row * sum over local picks of w * (id + 1).
    fn expert_output(&self, r: usize) -> Vec<f32> {
        let (_, hid, ids, w, _) = self.dispatch(r);
        let mut out = vec![0.0f32; hid.len()];
        for row in 0..self.world * self.tpr {
            let mut f = 0.0f32;
            for j in 0..self.k {
                if ids[row * self.k + j] >= 0 {
                    f += w[row * self.k + j] * (ids[row * self.k + j] + 1) as f32;
                }
            }
            for c in 0..self.h {
                out[row * self.h + c] = hid[row * self.h + c] * f;
            }
        }
        out
    }
    /// fp32 sum over ranks in ascending order of the token's slot rows.
    fn combine(&self, me: usize) -> Vec<f32> {
        let inp = &self.inputs[me];
        let mut acc = vec![0.0f32; inp.t * self.h];
        for r in 0..self.world {
            let eo = self.expert_output(r);
            let mut slot = 0;
            for t in 0..inp.t {
                if !self.goes_to(&inp.ids[t * self.k..(t + 1) * self.k], r) {
                    continue;
                }
                let row = me * self.tpr + slot;
                slot += 1;
                for c in 0..self.h {
                    acc[t * self.h + c] += eo[row * self.h + c];
                }
            }
        }
        acc
    }
}

/// Runs rank `me` of `case`; returns what the library produced.
/// `zero_copy`: the expert output is written into the dispatch result's
/// combine_input and combined from there.
fn run_rank_with(case: &Case, me: usize, bs: Arc<dyn Bootstrap>, zero_copy: bool)
                 -> (i32, Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>) {
    let params = f32_params(case.e, case.k, case.tpr, case.h);
    let mut ep = MoeEp::new(bs, &params, Some(&host().zero_copy_combine(zero_copy))).unwrap();
    let got = run_pair(&mut ep, case, me, &case.inputs[me], zero_copy);
    ep.destroy().unwrap();
    got
}

/// One dispatch of `sent` and the combine of `case`'s expert output on `ep`
/// (`sent` is `case.inputs[me]`, except under an active-rank mask, where
/// `case` is the masked model of what was sent).
fn run_pair(ep: &mut MoeEp, case: &Case, me: usize, sent: &RankInput, zero_copy: bool) -> Got {
    let inp = sent;
    let (t, k, h) = (inp.t as i64, case.k as i64, case.h as i64);
    let args = DispatchArgs::new(TensorRef::from_slice(&inp.x, &[t, h]).unwrap(),
                                 TensorRef::from_slice(&inp.ids, &[t, k]).unwrap())
        .weights(TensorRef::from_slice(&inp.w, &[t, k]).unwrap());
    let mut r = ep.dispatch(&args).unwrap();
    assert_eq!(r.combine_input.is_some(), zero_copy);
    if let Some(view) = r.combine_input.as_mut() {
        assert_eq!(view.shape(), &[(case.world * case.tpr) as i64, case.h as i64]);
        view.as_mut_slice::<f32>().unwrap().copy_from_slice(&case.expert_output(me));
    }
    let got = (r.tokens_per_rank, r.recv_counts.as_slice::<i32>().unwrap().to_vec(),
               r.hidden_states.as_slice::<f32>().unwrap().to_vec(),
               r.topk_ids.as_ref().unwrap().as_slice::<i32>().unwrap().to_vec(),
               r.topk_weights.as_ref().unwrap().as_slice::<f32>().unwrap().to_vec(),
               r.local_expert_counts.as_slice::<i32>().unwrap().to_vec());
    drop(r);
    let eo = case.expert_output(me);
    // Odd ranks pass expert_output as [world, tpr, hidden], even ones as [P, hidden].
    let shape: Vec<i64> = if me % 2 == 1 {
        vec![case.world as i64, case.tpr as i64, h]
    } else {
        vec![(case.world * case.tpr) as i64, h]
    };
    let y = if zero_copy {
        ep.combine_from_input().unwrap()
    } else {
        ep.combine(&TensorRef::from_slice(&eo, &shape).unwrap()).unwrap()
    };
    assert_eq!(y.shape(), &[t, h]);
    let y = y.as_slice::<f32>().unwrap().to_vec();
    (got.0, got.1, got.2, got.3, got.4, got.5, y)
}

fn check_rank(case: &Case, me: usize,
              got: &(i32, Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>)) {
    let (counts, hid, ids, w, local) = case.dispatch(me);
    assert_eq!(got.0 as usize, case.tpr, "tokens_per_rank on rank {me}");
    assert_eq!(got.1, counts, "recv_counts on rank {me}");
    for s in 0..case.world {
        let rows = s * case.tpr * case.h..(s * case.tpr + counts[s] as usize) * case.h;
        assert_eq!(got.2[rows.clone()], hid[rows], "hidden rows from {s} on rank {me}");
    }
    assert_eq!(got.3, ids, "topk_ids on rank {me}");
    assert_eq!(got.4, w, "topk_weights on rank {me}");
    assert_eq!(got.5, local, "local_expert_counts on rank {me}");
    let expected = case.combine(me);
    // Bitwise: the library sums ranks in ascending order in fp32, as the model does.
    assert_eq!(got.6.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
               expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "combine on rank {me}");
}

#[test]
fn version_is_the_headers() {
    assert_eq!(version().unwrap(), (moe_ep_sys::MOE_EP_VERSION_MAJOR, moe_ep_sys::MOE_EP_VERSION_MINOR,
                                    moe_ep_sys::MOE_EP_VERSION_PATCH));
    assert_eq!(Status::TIMEOUT.name(), "MOE_EP_ERROR_TIMEOUT");
    assert_eq!(format!("{}", Error::new(Status::INVALID_STATE, "x")), "MOE_EP_ERROR_INVALID_STATE: x");
}

#[test]
fn single_rank_by_hand() {
    let params = f32_params(4, 2, 8, 3);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&host())).unwrap();
    assert_eq!(ep.backend().unwrap(), Backend::Host);
    let x: Vec<f32> = (0..15).map(|v| v as f32).collect();
    let ids = vec![0, 1, 2, -1, 3, 3, -1, -1, 1, 2];
    let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[5, 3]).unwrap(),
                                           TensorRef::from_slice(&ids, &[5, 2]).unwrap())).unwrap();
    assert_eq!(r.tokens_per_rank, 8);
    assert_eq!(r.hidden_states.shape(), &[8, 3]);
    assert_eq!(r.recv_counts.as_slice::<i32>().unwrap(), &[4]);
    // Token 3 has no valid pick and is not sent; the others keep their order.
    assert_eq!(&r.hidden_states.as_slice::<f32>().unwrap()[..12],
               &[0., 1., 2., 3., 4., 5., 6., 7., 8., 12., 13., 14.]);
    assert_eq!(r.local_expert_counts.as_slice::<i32>().unwrap(), &[1, 2, 2, 2]);
    assert!(r.topk_weights.is_none() && r.hidden_states_scale.is_none() && r.eplb_gathered_stats.is_none());
    // Views check what they are asked for.
    assert_eq!(r.recv_counts.as_slice::<f32>().unwrap_err().status, Status::INVALID_ARGUMENT);
    let rows = r.hidden_states.as_slice::<f32>().unwrap().to_vec();
    drop(r);
    let y = ep.combine(&TensorRef::from_slice(&rows, &[8, 3]).unwrap()).unwrap();
    let mut expected = x.clone();
    expected[9..12].fill(0.0);
    assert_eq!(y.as_slice::<f32>().unwrap(), &expected[..]);
}

#[test]
fn last_path_names_the_path_of_each_phase() {
    let params = f32_params(4, 2, 8, 3);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&host())).unwrap();
    assert_eq!(ep.last_path(Phase::Dispatch).unwrap(), "none");
    assert_eq!(ep.last_path(Phase::Combine).unwrap(), "none");
    let x = vec![1.0f32; 6];
    let ids = vec![0, 1, 2, 3];
    let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3]).unwrap(),
                                           TensorRef::from_slice(&ids, &[2, 2]).unwrap())).unwrap();
    let rows = r.hidden_states.as_slice::<f32>().unwrap().to_vec();
    drop(r);
    assert_eq!(ep.last_path(Phase::Dispatch).unwrap(), "host");
    assert_eq!(ep.last_path(Phase::Combine).unwrap(), "none");
    ep.combine(&TensorRef::from_slice(&rows, &[8, 3]).unwrap()).unwrap();
    assert_eq!(ep.last_path(Phase::Combine).unwrap(), "host");
    // The sys constants and the library's names agree.
    let name = |p| unsafe { std::ffi::CStr::from_ptr(moe_ep_sys::moe_ep_path_name(p)) }.to_str().unwrap();
    assert_eq!(name(moe_ep_sys::MOE_EP_PATH_HOST), "host");
    assert_eq!(name(moe_ep_sys::MOE_EP_PATH_COMBINE_PULL_UNALIGNED), "combine_pull_unaligned");
    assert_eq!(name(-1), "unknown");
}

#[test]
fn errors_carry_status_and_message_and_the_handle_survives() {
    let params = f32_params(4, 2, 8, 3);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&host())).unwrap();
    let x = vec![0.0f32; 6];
    let ids64 = vec![0i64, 1, 2, 3];
    let e = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3]).unwrap(),
                                           TensorRef::from_slice(&ids64, &[2, 2]).unwrap())).unwrap_err();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(e.message.contains("topk_ids") && e.message.contains("int32") && e.message.contains("int64"),
            "{e}");
    let eo = vec![0.0f32; 24];
    let e = ep.combine(&TensorRef::from_slice(&eo, &[8, 3]).unwrap()).unwrap_err();
    assert_eq!(e.status, Status::INVALID_STATE);
    // Wrong element count is caught on the Rust side, before the library.
    assert_eq!(TensorRef::from_slice(&x, &[4, 3]).unwrap_err().status, Status::INVALID_ARGUMENT);
    let ids = vec![0i32, 1, 2, 99];
    {
        let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3]).unwrap(),
                                               TensorRef::from_slice(&ids, &[2, 2]).unwrap())).unwrap();
        assert_eq!(r.recv_counts.as_slice::<i32>().unwrap(), &[2]);
    }
    let e = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3]).unwrap(),
                                           TensorRef::from_slice(&ids, &[2, 2]).unwrap())).unwrap_err();
    assert_eq!(e.status, Status::INVALID_STATE);
    ep.combine(&TensorRef::from_slice(&eo, &[8, 3]).unwrap()).unwrap();
    let async_err = ep.async_error().unwrap().expect("the bad id 99 is reported");
    assert_eq!(async_err.status, Status::INVALID_INPUT);
    assert!(async_err.message.contains("99"), "{async_err}");
    assert!(ep.async_error().unwrap().is_none());
    let e = MoeEp::new(Arc::new(SingleRank), &Params::new(4, 5, 8, 3).unwrap(), Some(&host())).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(e.message.contains("top_k"), "{e}");
}

#[test]
fn combine_into_a_caller_buffer_and_empty_ranks() {
    let params = f32_params(2, 1, 4, 2);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&host())).unwrap();
    let x = vec![1.0f32, 2.0, 3.0, 4.0];
    let ids = vec![1i32, 0];
    drop(ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 2]).unwrap(),
                                        TensorRef::from_slice(&ids, &[2, 1]).unwrap())).unwrap());
    let eo: Vec<f32> = (0..8).map(|v| v as f32 * 10.0).collect();
    let mut out = vec![-1.0f32; 4];
    ep.combine_into(&TensorRef::from_slice(&eo, &[4, 2]).unwrap(),
                    &mut TensorMut::from_slice(&mut out, &[2, 2]).unwrap()).unwrap();
    assert_eq!(out, vec![0.0, 10.0, 20.0, 30.0]);
    // T = 0.
    let none: Vec<f32> = Vec::new();
    let no_ids: Vec<i32> = Vec::new();
    let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&none, &[0, 2]).unwrap(),
                                           TensorRef::from_slice(&no_ids, &[0, 1]).unwrap())).unwrap();
    assert_eq!(r.recv_counts.as_slice::<i32>().unwrap(), &[0]);
    drop(r);
    let y = ep.combine(&TensorRef::from_slice(&eo, &[4, 2]).unwrap()).unwrap();
    assert_eq!(y.shape(), &[0, 2]);
    assert!(y.as_slice::<f32>().unwrap().is_empty());
}

#[test]
fn drop_releases_the_bootstrap() {
    let bs: Arc<dyn Bootstrap> = Arc::new(SingleRank);
    let params = Params::new(2, 1, 4, 2).unwrap();
    let ep = MoeEp::new(bs.clone(), &params, Some(&host())).unwrap();
    assert_eq!(Arc::strong_count(&bs), 2);
    drop(ep);
    assert_eq!(Arc::strong_count(&bs), 1);
}

struct Failing;
impl Bootstrap for Failing {
    fn rank(&self) -> i32 { 0 }
    fn world_size(&self) -> i32 { 1 }
    fn allgather(&self, _: &[u8], _: &mut [u8]) -> std::result::Result<(), BoxError> {
        Err("the network is down".into())
    }
    fn barrier(&self) -> std::result::Result<(), BoxError> {
        panic!("barrier must not be reached")
    }
}

#[test]
fn bootstrap_errors_are_reported_with_their_cause() {
    let e = MoeEp::new(Arc::new(Failing), &Params::new(2, 1, 4, 2).unwrap(), Some(&host())).err().unwrap();
    assert_eq!(e.status, Status::BOOTSTRAP);
    assert!(e.message.contains("the network is down"), "{e}");
}

fn run_threads(case: &Arc<Case>) {
    run_threads_with(case, false);
}

fn run_threads_with(case: &Arc<Case>, zero_copy: bool) {
    let shared = case.clone();
    let results = on_ranks(case.world, move |me, bs| run_rank_with(&shared, me, bs, zero_copy));
    for (me, got) in results.iter().enumerate() {
        check_rank(case, me, got);
    }
}

#[test]
fn threads_two_ranks() {
    run_threads(&Arc::new(Case::new(1, 2, 8, 3, 5, 6)));
}

#[test]
fn threads_three_ranks() {
    run_threads(&Arc::new(Case::new(2, 3, 9, 2, 4, 7)));
}

#[test]
fn threads_four_ranks_top_k_equals_experts() {
    run_threads(&Arc::new(Case::new(3, 4, 4, 4, 3, 5)));
}

#[test]
fn workspace_size_grows_with_tokens() {
    let small = workspace_size(&Params::new(4, 2, 8, 16).unwrap(), Some(&host()), 2).unwrap();
    let big = workspace_size(&Params::new(4, 2, 64, 16).unwrap(), Some(&host()), 2).unwrap();
    assert!(0 < small && small < big, "{small} {big}");
    let e = workspace_size(&Params::new(4, 2, 8, 16).unwrap(), None, 3).unwrap_err();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(is_platform_supported(0).is_ok());
}

#[test]
fn threads_zero_copy_combine_input() {
    // Bitwise the model's sum, as for a combine from the caller's own buffer.
    run_threads_with(&Arc::new(Case::new(4, 1, 4, 2, 5, 6)), true);
    run_threads_with(&Arc::new(Case::new(5, 3, 9, 2, 4, 7)), true);
}

#[test]
fn combine_from_input_without_the_flag_is_invalid_state() {
    let params = f32_params(4, 2, 8, 3);
    let mut ep = MoeEp::new(thread_group(1).remove(0), &params, Some(&host())).unwrap();
    let e = ep.combine_from_input().unwrap_err();
    assert_eq!(e.status, Status::INVALID_STATE);
    ep.destroy().unwrap();
}

/// Everything one dispatch + combine produced on a rank, as plain data.
type Got = (i32, Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>);

fn copy_dispatch(r: &DispatchResult<'_>) -> (i32, Vec<i32>, Vec<f32>, Vec<i32>, Vec<f32>, Vec<i32>) {
    (r.tokens_per_rank, r.recv_counts.as_slice::<i32>().unwrap().to_vec(),
     r.hidden_states.as_slice::<f32>().unwrap().to_vec(),
     r.topk_ids.as_ref().unwrap().as_slice::<i32>().unwrap().to_vec(),
     r.topk_weights.as_ref().unwrap().as_slice::<f32>().unwrap().to_vec(),
     r.local_expert_counts.as_slice::<i32>().unwrap().to_vec())
}

fn assert_same(a: &Got, b: &Got) {
    assert_eq!((a.0, &a.1, bits(&a.2), &a.3, bits(&a.4), &a.5, bits(&a.6)),
               (b.0, &b.1, bits(&b.2), &b.3, bits(&b.4), &b.5, bits(&b.6)));
}

/// Two micro-batches (cases of the same sizes) of rank `me`: first with the
/// fused calls on a one-slot handle, then on a two-slot handle interleaved as
/// A.send, B.send, A.recv, B.recv, A.combine_send, B.combine_send,
/// A.combine_recv, B.combine_recv.
fn run_two_micro_batches(cases: &[Arc<Case>; 2], me: usize, bs: Arc<dyn Bootstrap>, zero_copy: bool)
                         -> ([Got; 2], [Got; 2]) {
    let c = &cases[0];
    let params = f32_params(c.e, c.k, c.tpr, c.h);
    let h = c.h as i64;
    fn args_of(case: &Case, me: usize) -> DispatchArgs<'_> {
        let inp = &case.inputs[me];
        let (t, k, h) = (inp.t as i64, case.k as i64, case.h as i64);
        DispatchArgs::new(TensorRef::from_slice(&inp.x, &[t, h]).unwrap(),
                          TensorRef::from_slice(&inp.ids, &[t, k]).unwrap())
            .weights(TensorRef::from_slice(&inp.w, &[t, k]).unwrap())
    }
    let p = (c.world * c.tpr) as i64;
    let mut fused = Vec::new();
    {
        let mut ep = MoeEp::new(bs.clone(), &params, Some(&host())).unwrap();
        for case in cases.iter() {
            let d = copy_dispatch(&ep.dispatch(&args_of(case, me)).unwrap());
            let eo = case.expert_output(me);
            let y = ep.combine(&TensorRef::from_slice(&eo, &[p, h]).unwrap()).unwrap().as_slice::<f32>().unwrap()
                .to_vec();
            fused.push((d.0, d.1, d.2, d.3, d.4, d.5, y));
        }
        ep.destroy().unwrap();
    }
    let mut ep = MoeEp::new(bs, &params, Some(&host().zero_copy_combine(zero_copy).micro_batches(2))).unwrap();
    ep.dispatch_send(0, &args_of(&cases[0], me)).unwrap();
    ep.dispatch_send(1, &args_of(&cases[1], me)).unwrap();
    let mut d = Vec::new();
    for slot in 0..2 {
        let mut r = ep.dispatch_recv(slot).unwrap();
        d.push(copy_dispatch(&r));
        if let Some(view) = r.combine_input.as_mut() {
            view.as_mut_slice::<f32>().unwrap().copy_from_slice(&cases[slot as usize].expert_output(me));
        }
    }
    let eo: Vec<Vec<f32>> = cases.iter().map(|case| case.expert_output(me)).collect();
    for slot in 0..2 {
        if zero_copy {
            ep.combine_send_from_input(slot).unwrap();
        } else {
            ep.combine_send(slot, &TensorRef::from_slice(&eo[slot as usize], &[p, h]).unwrap()).unwrap();
        }
    }
    let y0 = ep.combine_recv(0).unwrap().as_slice::<f32>().unwrap().to_vec();
    let mut y1 = vec![7.0f32; cases[1].inputs[me].t * c.h];
    ep.combine_recv_into(1, &mut TensorMut::from_slice(&mut y1, &[cases[1].inputs[me].t as i64, h]).unwrap())
        .unwrap();
    ep.destroy().unwrap();
    let split: Vec<Got> = d.into_iter().zip([y0, y1]).map(|(d, y)| (d.0, d.1, d.2, d.3, d.4, d.5, y)).collect();
    let fused: Vec<Got> = fused;
    (fused.try_into().unwrap(), split.try_into().unwrap())
}

#[test]
fn split_phases_two_micro_batches_equal_the_fused_calls() {
    for (world, zero_copy) in [(1, false), (2, false), (3, true)] {
        let e = 2 * world;
        let cases = [Arc::new(Case::new(20 + world as u64, world, e, 2, 4, 5)),
                     Arc::new(Case::new(30 + world as u64, world, e, 2, 4, 5))];
        let shared = cases.clone();
        let results = on_ranks(world, move |me, bs| run_two_micro_batches(&shared, me, bs, zero_copy));
        for (me, (fused, split)) in results.into_iter().enumerate() {
            for i in 0..2 {
                check_rank(&cases[i], me, &fused[i]);
                assert_same(&split[i], &fused[i]);
            }
        }
    }
}

#[test]
fn split_phases_out_of_order_calls_are_invalid_state() {
    let params = f32_params(4, 2, 8, 3);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&host().micro_batches(2))).unwrap();
    let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let ids = vec![0i32, 1, 2, 3];
    let args = DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3]).unwrap(),
                                 TensorRef::from_slice(&ids, &[2, 2]).unwrap());
    let eo = vec![0.0f32; 24];
    let eo_t = TensorRef::from_slice(&eo, &[8, 3]).unwrap();
    let state = |r: Result<()>| assert_eq!(r.unwrap_err().status, Status::INVALID_STATE);
    state(ep.dispatch_recv(0).map(drop));
    state(ep.combine_send(1, &eo_t));
    state(ep.combine_recv(0).map(drop));
    ep.dispatch_send(0, &args).unwrap();
    state(ep.dispatch_send(0, &args));
    state(ep.dispatch(&args).map(drop)); // the fused calls run on slot 0
    state(ep.combine_send(0, &eo_t));
    let rows = ep.dispatch_recv(0).unwrap().hidden_states.as_slice::<f32>().unwrap().to_vec();
    state(ep.dispatch_recv(0).map(drop));
    state(ep.combine_send_from_input(0)); // no zero_copy_combine: no view to combine from
    ep.combine_send(0, &TensorRef::from_slice(&rows, &[8, 3]).unwrap()).unwrap();
    state(ep.combine(&eo_t).map(drop));
    assert_eq!(ep.combine_recv(0).unwrap().as_slice::<f32>().unwrap(), &x[..]);
    // Slots out of range name the argument.
    let e = ep.dispatch_send(2, &args).unwrap_err();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(e.message.contains("slot"), "{e}");
    // Back to IDLE: the fused calls work again.
    drop(ep.dispatch(&args).unwrap());
    ep.combine(&eo_t).unwrap();
    ep.destroy().unwrap();
    let e = MoeEp::new(Arc::new(SingleRank), &params, Some(&host().micro_batches(3))).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(e.message.contains("micro_batches"), "{e}");
}

#[test]
fn poll_health_of_a_healthy_handle() {
    for world in [1usize, 2, 3] {
        let case = Arc::new(Case::new(60 + world as u64, world, 2 * world, 2, 3, 4));
        let shared = case.clone();
        let results = on_ranks(world, move |me, bs| {
            let c = &shared;
            let mut ep = MoeEp::new(bs, &f32_params(c.e, c.k, c.tpr, c.h), Some(&host())).unwrap();
            let before = (ep.poll_health().unwrap(), ep.active_ranks().unwrap());
            let got = run_pair(&mut ep, c, me, &c.inputs[me], false);
            let after = ep.poll_health().unwrap();
            // All-active again: accepted, and it counts as an update.
            ep.set_active_ranks(&vec![true; world]).unwrap();
            let again = (ep.poll_health().unwrap(), ep.active_ranks().unwrap());
            ep.destroy().unwrap();
            (before, got, after, again)
        });
        for (me, ((health, mask), got, after, (again, mask_again))) in results.iter().enumerate() {
            assert_eq!(health, &Health { status: Status::SUCCESS, error: None, failed_rank: None,
                                         active_count: world as i32, mask_epoch: 0 }, "rank {me}");
            assert_eq!(mask, &vec![true; world]);
            assert_eq!(after, health, "a dispatch/combine pair changes nothing the poll reports");
            assert_eq!((again.error.as_ref(), again.active_count, again.mask_epoch), (None, world as i32, 1));
            assert_eq!(mask_again, &vec![true; world]);
            check_rank(&case, me, got);
        }
    }
}

#[test]
fn one_rank_inactive_matches_the_masked_model() {
    for (world, inactive) in [(2usize, 1usize), (3, 1), (3, 0), (4, 3)] {
        let case = Arc::new(Case::new(70 + 4 * world as u64 + inactive as u64, world, 2 * world, 3, 5, 6));
        let active: Vec<bool> = (0..world).map(|r| r != inactive).collect();
        let masked = Arc::new(case.masked(&active));
        // The mask must matter: some pick of the case reaches the inactive rank.
        assert!(case.inputs.iter().any(|inp| inp.ids.iter().any(|&id| case.owner(id) == Some(inactive))),
                "world {world}: no pick reaches rank {inactive}");
        let (c, m, a) = (case.clone(), masked.clone(), active.clone());
        let results = on_ranks(world, move |me, bs| {
            let mut ep = MoeEp::new(bs, &f32_params(c.e, c.k, c.tpr, c.h), Some(&host())).unwrap();
            ep.set_active_ranks(&a).unwrap();
            let (health, mask) = (ep.poll_health().unwrap(), ep.active_ranks().unwrap());
            // The mask stays for every later pair.
            let under_mask: Vec<Got> = (0..2).map(|_| run_pair(&mut ep, &m, me, &c.inputs[me], false)).collect();
            ep.set_active_ranks(&vec![true; c.world]).unwrap();
            let restored = run_pair(&mut ep, &c, me, &c.inputs[me], false);
            let last = ep.poll_health().unwrap();
            ep.destroy().unwrap();
            (health, mask, under_mask, restored, last)
        });
        for (me, (health, mask, under_mask, restored, last)) in results.iter().enumerate() {
            assert_eq!(health, &Health { status: Status::SUCCESS, error: None, failed_rank: None,
                                         active_count: world as i32 - 1, mask_epoch: 1 }, "rank {me}");
            assert_eq!(mask, &active);
            for got in under_mask {
                check_rank(&masked, me, got);
            }
            if me == inactive {
                let got = &under_mask[0];
                assert!(got.1.iter().all(|&n| n == 0) && got.5.iter().all(|&n| n == 0), "rank {me} received");
                assert!(got.6.iter().all(|&v| v == 0.0), "an inactive rank's combine output is zeros");
            }
            check_rank(&case, me, restored);
            assert_eq!((last.active_count, last.mask_epoch), (world as i32, 2));
        }
    }
}

#[test]
fn bad_masks_are_refused_on_every_rank_with_the_message() {
    let world = 2usize;
    let case = Arc::new(Case::new(80, world, 4, 2, 3, 4));
    let shared = case.clone();
    let results = on_ranks(world, move |me, bs| {
        let c = &shared;
        let mut ep = MoeEp::new(bs, &f32_params(c.e, c.k, c.tpr, c.h), Some(&host())).unwrap();
        let mut errors = vec![
            ep.set_active_ranks(&[true; 3]).unwrap_err(),
            ep.set_active_ranks(&[true]).unwrap_err(),
            ep.set_active_ranks(&[false, false]).unwrap_err(),
            ep.set_active_ranks(&[true, me == 0]).unwrap_err(), // rank 1 disagrees
        ];
        // Between dispatch and combine: refused, nothing done.
        let inp = &c.inputs[me];
        let (t, k, h) = (inp.t as i64, c.k as i64, c.h as i64);
        let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&inp.x, &[t, h]).unwrap(),
                                               TensorRef::from_slice(&inp.ids, &[t, k]).unwrap())
                                .weights(TensorRef::from_slice(&inp.w, &[t, k]).unwrap())).unwrap();
        drop(r);
        errors.push(ep.set_active_ranks(&[true, false]).unwrap_err());
        let eo = c.expert_output(me);
        ep.combine(&TensorRef::from_slice(&eo, &[(c.world * c.tpr) as i64, h]).unwrap()).unwrap();
        let health = ep.poll_health().unwrap();
        // The refusals left the handle usable and its mask as it was.
        let got = run_pair(&mut ep, c, me, &c.inputs[me], false);
        let mask = ep.active_ranks().unwrap();
        ep.destroy().unwrap();
        (errors, health, mask, got)
    });
    for (me, (errors, health, mask, got)) in results.iter().enumerate() {
        for (e, len) in errors[..2].iter().zip([3, 1]) {
            assert_eq!(e.status, Status::INVALID_ARGUMENT, "rank {me}: {e}");
            // The argument, the expected and the actual value.
            assert!(e.message.contains("world_size") && e.message.contains('2')
                    && e.message.contains(&len.to_string()), "rank {me}: {e}");
        }
        assert!(errors[2].status == Status::INVALID_ARGUMENT && errors[2].message.contains("active"), "{}", errors[2]);
        assert!(errors[3].status == Status::INVALID_ARGUMENT && errors[3].message.contains("rank 1"), "{}", errors[3]);
        assert!(errors[4].status == Status::INVALID_STATE && errors[4].message.contains("slot 0"), "{}", errors[4]);
        assert_eq!((health.status, health.active_count, health.mask_epoch), (Status::SUCCESS, world as i32, 0));
        assert_eq!(mask, &vec![true; world]);
        check_rank(&case, me, got);
    }
}

/// Two ranks of one process whose exchange a test can abandon: each call
/// waits for the other rank's call of the same number, until `abandon` makes
/// every waiting and later call fail.
#[derive(Default)]
struct TwoRanks {
    state: std::sync::Mutex<TwoRanksState>,
    cond: std::sync::Condvar,
}

#[derive(Default)]
struct TwoRanksState {
    slots: std::collections::BTreeMap<(usize, usize), Vec<u8>>,
    calls: [usize; 2],
    inside: usize,
    abandoned: bool,
}

impl TwoRanks {
    fn meet(&self, rank: usize, data: &[u8]) -> std::result::Result<[Vec<u8>; 2], BoxError> {
        let mut s = self.state.lock().unwrap();
        let n = s.calls[rank];
        s.calls[rank] += 1;
        s.slots.insert((n, rank), data.to_vec());
        s.inside += 1;
        self.cond.notify_all();
        let (mut s, _) = self.cond
            .wait_timeout_while(s, std::time::Duration::from_secs(60),
                                |s| !s.abandoned && !s.slots.contains_key(&(n, 1 - rank)))
            .unwrap();
        s.inside -= 1;
        self.cond.notify_all();
        if s.abandoned || !s.slots.contains_key(&(n, 1 - rank)) {
            return Err(format!("rank {} is gone", 1 - rank).into());
        }
        Ok([s.slots[&(n, 0)].clone(), s.slots[&(n, 1)].clone()])
    }
    /// Fails every waiting and later call, and returns once none is inside.
    fn abandon(&self) {
        let mut s = self.state.lock().unwrap();
        s.abandoned = true;
        self.cond.notify_all();
        drop(self.cond.wait_while(s, |s| s.inside > 0).unwrap());
    }
}

struct TwoRanksMember(Arc<TwoRanks>, usize);

impl Bootstrap for TwoRanksMember {
    fn rank(&self) -> i32 { self.1 as i32 }
    fn world_size(&self) -> i32 { 2 }
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> std::result::Result<(), BoxError> {
        for (r, part) in self.0.meet(self.1, send)?.iter().enumerate() {
            recv[r * send.len()..(r + 1) * send.len()].copy_from_slice(part);
        }
        Ok(())
    }
    fn barrier(&self) -> std::result::Result<(), BoxError> {
        self.0.meet(self.1, &[]).map(drop)
    }
}

#[test]
fn poll_health_reports_a_sticky_timeout_with_its_message() {
    // Rank 1 stops calling after create, as a dead peer would.
    let group = Arc::new(TwoRanks::default());
    let creating: Vec<_> = (0..2)
        .map(|r| {
            let g = group.clone();
            std::thread::spawn(move || {
                MoeEp::new(Arc::new(TwoRanksMember(g, r)), &f32_params(2, 1, 4, 3), Some(&host().timeout_ms(300)))
                    .unwrap()
            })
        })
        .collect();
    let mut handles: Vec<MoeEp> = creating.into_iter().map(|h| h.join().expect("create panicked")).collect();
    let dead = handles.pop().unwrap();
    let mut ep = handles.pop().unwrap();
    assert_eq!(ep.poll_health().unwrap().error, None);
    let x = vec![1.0f32; 6];
    let ids = vec![0i32, 1];
    let e = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3]).unwrap(),
                                           TensorRef::from_slice(&ids, &[2, 1]).unwrap())).map(drop).unwrap_err();
    assert_eq!(e.status, Status::TIMEOUT, "{e}");
    let start = std::time::Instant::now();
    let health = ep.poll_health().unwrap();
    // The stalled exchange would hold it for 60 s; a loaded machine may add milliseconds.
    assert!(start.elapsed() < std::time::Duration::from_secs(1), "the poll took {:?}", start.elapsed());
    assert_eq!(health, Health { status: Status::TIMEOUT, error: Some(e.clone()), failed_rank: None, active_count: 2,
                                mask_epoch: 0 });
    assert_eq!(ep.poll_health().unwrap(), health, "sticky");
    assert_eq!(ep.set_active_ranks(&[true, false]).unwrap_err().status, Status::TIMEOUT);
    // Frees rank 0's stalled exchange before the handles (and the bootstraps
    // their callbacks use) go away.
    group.abandon();
    ep.destroy().unwrap(); // broken: releases without waiting for the peer
    dead.destroy().unwrap();
}

// ---- Surviving a dead rank (docs/reliability.md): the store, the store
// bootstrap, FailurePolicy::Mask; and a timed-out handle's bootstrap kept
// alive while the library may still run its callback.

/// For the refusals: short, nothing waits for it.
const MASK_TIMEOUT_MS: i32 = 500;

/// A store prefix unique per test and run.
fn unique_prefix(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("cargo-{name}-{}-{nanos}", std::process::id())
}

#[test]
fn config_is_plain_data() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Config>();
    send_sync::<Store>();
    send_sync::<StoreBootstrap>();
    // The strings live in the Config; the C struct points into it.
    let c = host().failure_policy(FailurePolicy::Mask).store_address("127.0.0.1:1").unwrap()
        .store_prefix("job/moe").unwrap();
    let raw = c.to_raw();
    assert_eq!(raw.failure_policy, moe_ep_sys::MOE_EP_ON_FAILURE_MASK);
    let text = |p| unsafe { std::ffi::CStr::from_ptr(p) }.to_str().unwrap().to_string();
    assert_eq!((text(raw.store_address), text(raw.store_prefix)), ("127.0.0.1:1".into(), "job/moe".into()));
    assert!(Config::new().unwrap().to_raw().store_address.is_null());
}

#[test]
fn store_serves_and_reports_its_address() {
    let store = Store::serve(Some("127.0.0.1"), 0).unwrap();
    assert!(store.port() > 0 && store.port() < 65536);
    assert_eq!(store.address(), format!("127.0.0.1:{}", store.port()));
    store.close().unwrap();
    let e = Store::serve(Some("127.0.0.1"), -5).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT, "{e}");
    assert!(e.message.contains("port") && e.message.contains("-5"), "{e}");
}

/// What one rank of `mask_handles_drop_a_stalled_rank_go_on_and_admit_its_replacement` saw.
struct MaskRun {
    healthy: Health,
    before: Got,
    error: Error,        // the survivors' failing dispatch; the stalled rank's "dropped"
    health: Health,      // right after it
    detect: std::time::Duration,
    mask: Vec<bool>,
    after: Vec<Got>,     // the survivors' pairs under the mask
    bootstrap_refs: usize,
    rejoined: Got,       // the full group's pair after the admission
    last: Health,
}

#[test]
fn mask_handles_drop_a_stalled_rank_go_on_and_admit_its_replacement() {
    // 3 ranks over the store bootstrap with FailurePolicy::Mask: a pair
    // against the model; rank 1 stalls; the survivors' next dispatch is
    // TIMEOUT naming it, their poll shows failed_rank 1 and mask epoch 1, and
    // the next pairs match the masked model.  Rank 1, back, finds itself
    // dropped, drops its handle and rejoins with a RejoinBootstrap as the
    // survivors make it active again: the full group matches the model.
    let (world, dead, timeout_ms) = (3usize, 1usize, 1000);
    let case = Arc::new(Case::new(91, world, 2 * world, 2, 5, 4));
    let active: Vec<bool> = (0..world).map(|r| r != dead).collect();
    let masked = Arc::new(case.masked(&active));
    assert!(case.inputs.iter().any(|inp| inp.ids.iter().any(|&id| case.owner(id) == Some(dead))),
            "the failure must matter");
    let store = Store::serve(Some("127.0.0.1"), 0).unwrap();
    let (address, boot, group) = (store.address(), unique_prefix("boot"), unique_prefix("mask"));
    // (survivors that ran masked, the stalled rank's old handle is gone)
    let steps = Arc::new((std::sync::Mutex::new((0usize, false)), std::sync::Condvar::new()));
    let threads: Vec<_> = (0..world)
        .map(|me| {
            let (c, m, address, boot, group, steps) =
                (case.clone(), masked.clone(), address.clone(), boot.clone(), group.clone(), steps.clone());
            std::thread::spawn(move || {
                let wait = |done: &dyn Fn(&(usize, bool)) -> bool| {
                    let (lock, cond) = &*steps;
                    drop(cond.wait_timeout_while(lock.lock().unwrap(), std::time::Duration::from_secs(60),
                                                 |s| !done(s)).unwrap());
                };
                let step = |f: &dyn Fn(&mut (usize, bool))| {
                    let (lock, cond) = &*steps;
                    f(&mut lock.lock().unwrap());
                    cond.notify_all();
                };
                let bs = Arc::new(StoreBootstrap::connect(&address, &boot, me as i32, world as i32, 20_000).unwrap());
                let config = host().timeout_ms(timeout_ms).failure_policy(FailurePolicy::Mask)
                    .store_address(&address).unwrap().store_prefix(&group).unwrap();
                let params = f32_params(c.e, c.k, c.tpr, c.h);
                let mut ep = MoeEp::new(bs.clone(), &params, Some(&config)).unwrap();
                let healthy = ep.poll_health().unwrap();
                let before = run_pair(&mut ep, &c, me, &c.inputs[me], false);
                let inp = &c.inputs[me];
                let (t, k, h) = (inp.t as i64, c.k as i64, c.h as i64);
                let args = DispatchArgs::new(TensorRef::from_slice(&inp.x, &[t, h]).unwrap(),
                                             TensorRef::from_slice(&inp.ids, &[t, k]).unwrap())
                    .weights(TensorRef::from_slice(&inp.w, &[t, k]).unwrap());
                if me == dead {
                    wait(&|s| s.0 == world - 1); // stops taking part until the survivors ran masked
                    let error = ep.dispatch(&args).map(drop).unwrap_err();
                    let health = ep.poll_health().unwrap();
                    drop(ep);
                    let bootstrap_refs = Arc::strong_count(&bs);
                    step(&|s| s.1 = true);
                    // The replacement: a new handle of the same rank, met through the store.
                    let mut ep = MoeEp::new(Arc::new(RejoinBootstrap { rank: me as i32, world_size: world as i32 }),
                                            &params, Some(&config.clone().rejoin(true))).unwrap();
                    let rejoined = run_pair(&mut ep, &c, me, &c.inputs[me], false);
                    let last = ep.poll_health().unwrap();
                    ep.destroy().unwrap();
                    return MaskRun { healthy, before, error, health, detect: Default::default(), mask: Vec::new(),
                                     after: Vec::new(), bootstrap_refs, rejoined, last };
                }
                let start = std::time::Instant::now();
                let error = ep.dispatch(&args).map(drop).unwrap_err();
                let detect = start.elapsed();
                let (health, mask) = (ep.poll_health().unwrap(), ep.active_ranks().unwrap());
                let after: Vec<Got> = (0..2).map(|_| run_pair(&mut ep, &m, me, &c.inputs[me], false)).collect();
                step(&|s| s.0 += 1);
                wait(&|s| s.1);
                ep.set_active_ranks(&vec![true; world]).unwrap(); // admits the replacement
                let rejoined = run_pair(&mut ep, &c, me, &c.inputs[me], false);
                let last = ep.poll_health().unwrap();
                ep.destroy().unwrap();
                MaskRun { healthy, before, error, health, detect, mask, after, bootstrap_refs: Arc::strong_count(&bs),
                          rejoined, last }
            })
        })
        .collect();
    let results: Vec<MaskRun> = threads.into_iter().map(|t| t.join().expect("rank thread panicked")).collect();
    store.close().unwrap();
    for (me, run) in results.iter().enumerate() {
        assert_eq!(run.healthy, Health { status: Status::SUCCESS, error: None, failed_rank: None,
                                         active_count: world as i32, mask_epoch: 0 }, "rank {me}");
        check_rank(&case, me, &run.before);
        check_rank(&case, me, &run.rejoined);
        assert_eq!((run.last.status, run.last.active_count, run.last.mask_epoch), (Status::SUCCESS, world as i32, 2),
                   "rank {me}");
        let e = &run.error;
        assert_eq!(e.status, Status::TIMEOUT, "rank {me}: {e}");
        // A MASK handle's timeout leaves no callback running: the bootstrap is released with it.
        assert_eq!(run.bootstrap_refs, 1, "rank {me}: the handle kept its bootstrap");
        if me == dead {
            assert_eq!(run.health.status, Status::TIMEOUT, "a dropped rank's handle is done (sticky)");
            continue;
        }
        assert!(e.message.contains(&format!("rank(s) {dead} did not answer")) && e.message.contains("epoch 1"),
                "rank {me}: {e}");
        // timeout_ms plus a store round trip (a generous bound for a loaded machine).
        assert!(run.detect < std::time::Duration::from_millis(timeout_ms as u64 + 5000), "took {:?}", run.detect);
        assert_eq!(run.health, Health { status: Status::SUCCESS, error: None, failed_rank: Some(dead as i32),
                                        active_count: world as i32 - 1, mask_epoch: 1 }, "rank {me}");
        assert_eq!(run.mask, active);
        for got in &run.after {
            check_rank(&masked, me, got);
        }
    }
}

#[test]
fn bad_failure_options_are_refused_with_the_message() {
    let params = f32_params(2, 1, 2, 4);
    let create = |c: Config| MoeEp::new(Arc::new(SingleRank), &params, Some(&c)).map(drop).unwrap_err();
    let mask = || host().timeout_ms(MASK_TIMEOUT_MS).failure_policy(FailurePolicy::Mask);
    let e = create(mask()); // no store
    assert_eq!(e.status, Status::INVALID_ARGUMENT, "{e}");
    assert!(e.message.contains("config->store_address") && e.message.contains("NULL"), "{e}");
    let e = create(mask().store_address("nocolon").unwrap());
    assert_eq!(e.status, Status::INVALID_ARGUMENT, "{e}");
    assert!(e.message.contains("config->store_address") && e.message.contains("\"nocolon\""), "{e}");
    let e = create(mask().store_address("127.0.0.1:99999").unwrap());
    assert!(e.status == Status::INVALID_ARGUMENT && e.message.contains("99999"), "{e}");
    let e = create(host().rejoin(true));
    assert!(e.status == Status::INVALID_ARGUMENT && e.message.contains("config->failure_policy"), "{e}");
    let e = mask().store_address("127.0.0.1:1\0junk").err().unwrap();
    assert!(e.status == Status::INVALID_ARGUMENT && e.message.contains("store_address"), "{e}");
    let e = StoreBootstrap::connect("nocolon", "p", 0, 1, MASK_TIMEOUT_MS).err().unwrap();
    assert_eq!(e.status, Status::INVALID_ARGUMENT, "{e}");
    assert!(e.message.contains("address") && e.message.contains("\"nocolon\""), "{e}");
    let store = Store::serve(Some("127.0.0.1"), 0).unwrap();
    let address = store.address();
    {
        // A group of one: MASK works, nothing to mask.
        let bs = Arc::new(StoreBootstrap::connect(&address, &unique_prefix("one"), 0, 1, MASK_TIMEOUT_MS).unwrap());
        let ep = MoeEp::new(bs, &params, Some(&mask().store_address(&address).unwrap()
                                                 .store_prefix(&unique_prefix("g")).unwrap())).unwrap();
        assert_eq!(ep.poll_health().unwrap().active_count, 1);
        ep.destroy().unwrap();
    }
    store.close().unwrap();
    // Nobody listens there now.
    let e = StoreBootstrap::connect(&address, "gone", 0, 1, MASK_TIMEOUT_MS).err().unwrap();
    assert!(e.status == Status::BOOTSTRAP && e.message.contains(&address), "{e}");
}

/// Rank 0 of a group of 2 whose rank 1 never answers: once `answer` calls
/// are used up (answered as if rank 1 sent the same bytes, to get through
/// create), each allgather blocks until `release`, then fails.  Its Drop
/// records whether it ran while a callback was still using it.
#[derive(Default)]
struct StallState {
    released: std::sync::Mutex<bool>,
    cond: std::sync::Condvar,
    answer: std::sync::atomic::AtomicUsize,
    in_call: std::sync::atomic::AtomicBool,
    entered: std::sync::atomic::AtomicBool,
    returned: std::sync::atomic::AtomicBool,
    dropped: std::sync::atomic::AtomicBool,
    dropped_in_call: std::sync::atomic::AtomicBool,
}

impl StallState {
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.cond.notify_all();
    }
    fn flag(flag: &std::sync::atomic::AtomicBool) -> bool {
        flag.load(std::sync::atomic::Ordering::SeqCst)
    }
    fn wait_returned(&self) {
        let start = std::time::Instant::now();
        while !Self::flag(&self.returned) && start.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(Self::flag(&self.returned), "the released callback did not return");
        // Let the library's thread leave the trampoline, which still reads the ctx.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

struct StalledPeer(Arc<StallState>);

impl Bootstrap for StalledPeer {
    fn rank(&self) -> i32 { 0 }
    fn world_size(&self) -> i32 { 2 }
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> std::result::Result<(), BoxError> {
        use std::sync::atomic::Ordering::SeqCst;
        let s = &self.0;
        if s.answer.load(SeqCst) > 0 {
            s.answer.fetch_sub(1, SeqCst);
            recv[..send.len()].copy_from_slice(send);
            recv[send.len()..].copy_from_slice(send);
            return Ok(());
        }
        s.in_call.store(true, SeqCst);
        s.entered.store(true, SeqCst);
        drop(s.cond.wait_timeout_while(s.released.lock().unwrap(), std::time::Duration::from_secs(60),
                                       |r| !*r).unwrap());
        s.in_call.store(false, SeqCst);
        s.returned.store(true, SeqCst);
        Err("rank 1 never answered".into())
    }
    fn barrier(&self) -> std::result::Result<(), BoxError> {
        self.allgather(&[], &mut [])
    }
}

impl Drop for StalledPeer {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.0.dropped.store(true, SeqCst);
        if self.0.in_call.load(SeqCst) {
            self.0.dropped_in_call.store(true, SeqCst);
        }
    }
}

#[test]
fn a_timed_out_create_keeps_the_bootstrap_while_its_callback_runs() {
    let state = Arc::new(StallState::default());
    // The handle's ctx holds the only reference to the bootstrap.
    let e = MoeEp::new(Arc::new(StalledPeer(state.clone())), &f32_params(2, 1, 2, 4), Some(&host().timeout_ms(300)))
        .map(drop).unwrap_err();
    assert_eq!(e.status, Status::TIMEOUT, "{e}");
    assert!(StallState::flag(&state.entered) && !StallState::flag(&state.returned), "the callback is blocked");
    assert!(!StallState::flag(&state.dropped), "the bootstrap was released under its running callback");
    state.release();
    state.wait_returned();
    assert!(!StallState::flag(&state.dropped_in_call), "the bootstrap was dropped while its callback ran");
}

#[test]
fn a_handle_dropped_after_a_timed_out_dispatch_keeps_the_bootstrap_while_its_callback_runs() {
    let state = Arc::new(StallState::default());
    state.answer.store(usize::MAX, std::sync::atomic::Ordering::SeqCst); // rank 1 takes part in create
    let mut ep = MoeEp::new(Arc::new(StalledPeer(state.clone())), &f32_params(2, 1, 2, 4),
                            Some(&host().timeout_ms(300))).unwrap();
    state.answer.store(0, std::sync::atomic::Ordering::SeqCst); // then stops
    let (x, ids) = (vec![1.0f32; 8], vec![0i32, 1]);
    let e = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 4]).unwrap(),
                                           TensorRef::from_slice(&ids, &[2, 1]).unwrap())).map(drop).unwrap_err();
    assert_eq!(e.status, Status::TIMEOUT, "{e}");
    assert!(StallState::flag(&state.entered) && !StallState::flag(&state.returned), "the callback is blocked");
    drop(ep); // broken: destroy releases without waiting for the peer
    assert!(!StallState::flag(&state.dropped), "the bootstrap was released under its running callback");
    state.release();
    state.wait_returned();
    assert!(!StallState::flag(&state.dropped_in_call), "the bootstrap was dropped while its callback ran");
}
