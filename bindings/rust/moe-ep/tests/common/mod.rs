//! Set-up shared by the integration tests (`mod common;` in each): the HOST
//! configuration, the deterministic generator every rank builds every rank's
//! inputs from, random routed inputs, the ranks as threads.  Each test crate
//! uses a part of it.
#![allow(dead_code)]

use moe_ep::*;
use std::sync::Arc;

/// The HOST backend with a timeout long enough for a loaded machine.
pub fn host() -> Config {
    Config::new().unwrap().backend(Backend::Host).timeout_ms(60_000)
}

/// `Params` with f32 rows and an f32 combine.
pub fn f32_params(num_experts: usize, top_k: usize, max_tokens_per_rank: usize, hidden: usize) -> Params {
    Params::new(num_experts as i32, top_k as i32, max_tokens_per_rank as i32, hidden as i32)
        .unwrap()
        .hidden_dtype(DType::F32)
        .combine_dtype(DType::F32)
}

/// Deterministic xorshift generator: every rank builds every rank's inputs.
pub struct Rng(pub u64);

impl Rng {
    /// The generator of a test case's `seed`.
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly symmetric values in [-scale / 2, scale / 2).
    pub fn value(&mut self, scale: f32) -> f32 {
        (self.unit() - 0.5) * scale
    }
}

/// One rank's inputs: `t` tokens, rows `x` [t, h], picks `ids` [t, k]
/// (distinct experts, some masked to -1), weights `w` [t, k].
#[derive(Clone)]
pub struct RankInput {
    pub t: usize,
    pub x: Vec<f32>,
    pub ids: Vec<i32>,
    pub w: Vec<f32>,
}

/// Every rank's inputs from `seed`: 0..=tpr tokens per rank (none on
/// `empty_rank`), k distinct experts per token of which each is masked to -1
/// with probability 1 / `mask_one_in`.
pub fn random_inputs(seed: u64, world: usize, e: usize, k: usize, h: usize, tpr: usize, mask_one_in: u64,
                     empty_rank: Option<usize>) -> Vec<RankInput> {
    let mut rng = Rng::seeded(seed);
    (0..world)
        .map(|s| {
            let t = if empty_rank == Some(s) { 0 } else { rng.below(tpr as u64 + 1) as usize };
            let mut ids = Vec::new();
            for _ in 0..t {
                let mut picks: Vec<i32> = Vec::new();
                while picks.len() < k {
                    let id = rng.below(e as u64) as i32;
                    if !picks.contains(&id) {
                        picks.push(id);
                    }
                }
                for p in picks.iter_mut() {
                    if rng.below(mask_one_in) == 0 {
                        *p = -1; // masked pick
                    }
                }
                ids.extend(picks);
            }
            let x = (0..t * h).map(|_| rng.unit() * 2.0 - 1.0).collect();
            let w = (0..t * k).map(|_| rng.unit()).collect();
            RankInput { t, x, ids, w }
        })
        .collect()
}

/// Runs `f(rank, bootstrap)` on `world` ranks, each a thread of one
/// `thread_group`; the results in rank order (a rank's panic fails the test).
pub fn on_ranks<R, F>(world: usize, f: F) -> Vec<R>
where
    R: Send + 'static,
    F: Fn(usize, Arc<ThreadRank>) -> R + Send + Sync + 'static,
{
    let f = Arc::new(f);
    let handles: Vec<_> = thread_group(world as i32)
        .into_iter()
        .enumerate()
        .map(|(me, bs)| {
            let f = f.clone();
            std::thread::spawn(move || f(me, bs))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
}

/// The bit patterns, for bitwise comparisons that also hold for NaN.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
