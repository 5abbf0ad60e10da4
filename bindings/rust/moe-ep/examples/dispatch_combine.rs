//! Two ranks as threads on the HOST backend: dispatch tokens to the ranks that
//! own their experts, run a toy expert (scale by weight), combine.
//!     MOE_EP_LIB_DIR=/path/to/lib cargo run --offline --example dispatch_combine
use moe_ep::*;

fn rank_main(bs: std::sync::Arc<ThreadRank>) -> Result<Vec<f32>> {
    let me = bs.rank();
    let (experts, top_k, hidden, max_tokens) = (4, 2, 3, 4);
    let params = Params::new(experts, top_k, max_tokens, hidden)?
        .hidden_dtype(DType::F32)
        .combine_dtype(DType::F32);
    let config = Config::new()?.backend(Backend::Host);
    let mut ep = MoeEp::new(bs, &params, Some(&config))?;

    // Two tokens per rank; experts 0-1 live on rank 0, 2-3 on rank 1.
    let x: Vec<f32> = (0..6).map(|v| (v + 10 * me) as f32).collect();
    let ids = vec![0, 2, 1, -1];
    let w = vec![0.5f32, 0.25, 1.0, 0.0];
    let args = DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3])?, TensorRef::from_slice(&ids, &[2, 2])?)
        .weights(TensorRef::from_slice(&w, &[2, 2])?);
    let r = ep.dispatch(&args)?;
    // The "expert": each received row times the sum of its local picks' weights.
    let rows = r.hidden_states.as_slice::<f32>()?;
    let ids_r = r.topk_ids.as_ref().expect("rank-major rows carry their ids").as_slice::<i32>()?;
    let w_r = r.topk_weights.as_ref().expect("weights were given").as_slice::<f32>()?;
    let mut out = vec![0.0f32; rows.len()];
    for row in 0..(r.tokens_per_rank * ep_world(&r)) as usize {
        let f: f32 = (0..top_k as usize).filter(|&j| ids_r[row * 2 + j] >= 0).map(|j| w_r[row * 2 + j]).sum();
        for c in 0..hidden as usize {
            out[row * 3 + c] = rows[row * 3 + c] * f;
        }
    }
    let shape = r.hidden_states.shape().to_vec();
    drop(r); // the views end here: combine may reuse their memory
    let y = ep.combine(&TensorRef::from_slice(&out, &shape)?)?;
    Ok(y.as_slice::<f32>()?.to_vec())
}

fn ep_world(r: &DispatchResult<'_>) -> i32 {
    r.recv_counts.shape()[0] as i32
}

fn main() {
    let threads: Vec<_> = thread_group(2).into_iter().map(|bs| std::thread::spawn(move || rank_main(bs))).collect();
    for (rank, t) in threads.into_iter().enumerate() {
        let y = t.join().unwrap().unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        // Token 0 picked experts 0 and 2 (weights 0.5 + 0.25), token 1 expert 1 (1.0).
        let x: Vec<f32> = (0..6).map(|v| (v + 10 * rank) as f32).collect();
        let expected: Vec<f32> = x.iter().enumerate().map(|(i, v)| if i < 3 { v * 0.75 } else { *v }).collect();
        assert_eq!(y, expected, "rank {rank}");
        println!("rank {rank}: {y:?}");
    }
}
