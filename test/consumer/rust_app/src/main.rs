//! One rank, HOST backend: three tokens out, one with no expert, back scaled.
use moe_ep::{Backend, Config, DType, DispatchArgs, MoeEp, Params, SingleRank, TensorRef};
use std::sync::Arc;

fn main() -> moe_ep::Result<()> {
    let params = Params::new(2, 1, 4, 2)?.hidden_dtype(DType::F32).combine_dtype(DType::F32);
    let config = Config::new()?.backend(Backend::Host);
    let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&config))?;
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let ids = [1i32, -1, 0];
    let out = {
        let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[3, 2])?,
                                               TensorRef::from_slice(&ids, &[3, 1])?))?;
        let rows: Vec<f32> = r.hidden_states.as_slice::<f32>()?.iter().map(|v| 10.0 * v).collect();
        (rows, r.hidden_states.shape().to_vec())
    };
    let y = ep.combine(&TensorRef::from_slice(&out.0, &out.1)?)?.as_slice::<f32>()?.to_vec();
    assert_eq!(y, [10.0, 20.0, 0.0, 0.0, 50.0, 60.0]);
    ep.destroy()?;
    println!("rust app OK: moe_ep {:?}", moe_ep::version()?);
    Ok(())
}
