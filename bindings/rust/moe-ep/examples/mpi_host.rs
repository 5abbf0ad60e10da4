//! The MPI adapter from Rust, on the HOST backend: every rank sends 3 tokens
//! to 2 experts each and checks that combine returns them (weights sum to 1),
//! rank-major and then in the expert-packed receive layout.
//!     cargo build --features mpi --example mpi_host && mpiexec -n 2 target/debug/examples/mpi_host
//! Written for Open MPI without an MPI crate: MPI_Init and MPI_Finalize are
//! declared here, and MPI_COMM_WORLD is reached through its Fortran handle,
//! which is 0 in Open MPI (checked against OMPI_COMM_WORLD_SIZE).  With the
//! `mpi` crate, use `MpiBootstrap::from_raw_comm` on `comm.as_raw()`.
use moe_ep::*;
use std::ffi::c_char;
use std::sync::Arc;

#[link(name = "mpi")]
unsafe extern "C" {
    fn MPI_Init(argc: *mut i32, argv: *mut *mut *mut c_char) -> i32;
    fn MPI_Finalize() -> i32;
}

const OPEN_MPI_COMM_WORLD_FINT: i32 = 0;

fn run() -> Result<()> {
    let bs = Arc::new(MpiBootstrap::from_fortran_handle(OPEN_MPI_COMM_WORLD_FINT)?);
    let (me, world) = (bs.rank(), bs.world_size());
    if let Ok(n) = std::env::var("OMPI_COMM_WORLD_SIZE") {
        assert_eq!(n.parse::<i32>().unwrap(), world, "fint 0 is not MPI_COMM_WORLD here");
    }
    let (experts, k, hidden, tokens) = (2 * world, 2usize, 4usize, 3usize);
    let params = Params::new(experts, k as i32, tokens as i32, hidden as i32)?
        .hidden_dtype(DType::F32)
        .combine_dtype(DType::F32);
    let mut ep = MoeEp::new(bs.clone(), &params, Some(&Config::new()?.backend(Backend::Host)))?;
    let x: Vec<f32> = (0..tokens * hidden).map(|v| (v as i32 + 100 * me) as f32).collect();
    let ids: Vec<i32> = (0..tokens * k).map(|v| (me + v as i32) % experts).collect();
    let w = vec![0.5f32; tokens * k];
    let out = {
        let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[tokens as i64, hidden as i64])?,
                                               TensorRef::from_slice(&ids, &[tokens as i64, k as i64])?)
                            .weights(TensorRef::from_slice(&w, &[tokens as i64, k as i64])?))?;
        let rows = r.hidden_states.as_slice::<f32>()?;
        let rids = r.topk_ids.as_ref().expect("rank-major rows carry their ids").as_slice::<i32>()?;
        let rw = r.topk_weights.as_ref().expect("weights were given").as_slice::<f32>()?;
        let mut out = vec![0.0f32; rows.len()];
        for p in 0..rows.len() / hidden {
            let f: f32 = (0..k).filter(|&j| rids[p * k + j] >= 0).map(|j| rw[p * k + j]).sum();
            for c in 0..hidden {
                out[p * hidden + c] = f * rows[p * hidden + c];
            }
        }
        (out, r.hidden_states.shape().to_vec())
    };
    let y = ep.combine(&TensorRef::from_slice(&out.0, &out.1)?)?.as_slice::<f32>()?.to_vec();
    assert_eq!(y, x, "rank {me}: combine did not return the tokens");
    ep.destroy()?;
    // EXPERT_PACKED: one row per (token, local pick), every row the token it
    // names in row_sources; identity experts, combine weights and sums them.
    let packed = params.receive_layout(ReceiveLayout::ExpertPacked).expert_alignment(2);
    let mut ep = MoeEp::new(bs.clone(), &packed, Some(&Config::new()?.backend(Backend::Host)))?;
    let rows = {
        let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[tokens as i64, hidden as i64])?,
                                               TensorRef::from_slice(&ids, &[tokens as i64, k as i64])?)
                            .weights(TensorRef::from_slice(&w, &[tokens as i64, k as i64])?))?;
        let rows = r.hidden_states.as_slice::<f32>()?.to_vec();
        let sources = r.row_sources.as_ref().expect("expert layout").as_slice::<i32>()?;
        let offsets = r.expert_offsets.as_ref().expect("expert_packed").as_slice::<i32>()?;
        assert!(offsets.iter().all(|o| o % 2 == 0), "rank {me}: offsets {offsets:?} not aligned to 2");
        let mut pairs = 0;
        for (row, src) in sources.chunks(3).enumerate().filter(|(_, s)| s[0] >= 0) {
            let t = src[1] as usize;
            let want: Vec<f32> = (0..hidden).map(|c| ((t * hidden + c) as i32 + 100 * src[0]) as f32).collect();
            assert_eq!(&rows[row * hidden..(row + 1) * hidden], &want[..], "rank {me}: row {row} from {src:?}");
            pairs += 1;
        }
        // Every pick is valid and a token's picks are distinct: each pick of
        // an expert here (2 per rank) is one row.
        let mine = (0..world).flat_map(|s| (0..tokens * k).map(move |v| (s + v as i32) % experts))
            .filter(|id| id / 2 == me).count();
        assert_eq!(pairs, mine, "rank {me}: pairs received");
        rows
    };
    let y = ep.combine(&TensorRef::from_slice(&rows, &[(rows.len() / hidden) as i64, hidden as i64])?)?
        .as_slice::<f32>()?.to_vec();
    assert_eq!(y, x, "rank {me}: expert-packed combine did not return the tokens");
    ep.destroy()?;
    println!("rank {me}/{world}: MPI adapter, HOST backend, {tokens} tokens back, rank-major and expert-packed");
    Ok(())
}

fn main() {
    // Before MPI_Init the adapter refuses, and says why.
    match MpiBootstrap::from_fortran_handle(OPEN_MPI_COMM_WORLD_FINT) {
        Err(e) => assert!(e.status == Status::INVALID_STATE && e.message.contains("MPI_Init not called yet"),
                          "unexpected error before MPI_Init: {e}"),
        Ok(_) => panic!("the MPI adapter accepted a communicator before MPI_Init"),
    }
    unsafe { MPI_Init(std::ptr::null_mut(), std::ptr::null_mut()) };
    let r = run();
    // The bootstrap (its duplicated communicator) is released inside run().
    unsafe { MPI_Finalize() };
    if let Err(e) = r {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
