//! Safe Rust wrapper over libmoe_ep (MoE expert-parallel dispatch/combine).
//!
//! ```no_run
//! use moe_ep::{Backend, Config, DispatchArgs, DType, MoeEp, Params, SingleRank, TensorRef};
//! use std::sync::Arc;
//! # fn main() -> moe_ep::Result<()> {
//! let params = Params::new(4, 2, 8, 3)?.hidden_dtype(DType::F32).combine_dtype(DType::F32);
//! let mut ep = MoeEp::new(Arc::new(SingleRank), &params, Some(&Config::new()?.backend(Backend::Host)))?;
//! let x = vec![1.0f32; 6];
//! let ids = vec![0i32, 1, 2, 3];
//! let r = ep.dispatch(&DispatchArgs::new(TensorRef::from_slice(&x, &[2, 3])?,
//!                                        TensorRef::from_slice(&ids, &[2, 2])?))?;
//! let rows = r.hidden_states.as_slice::<f32>()?.to_vec();
//! drop(r);
//! let y = ep.combine(&TensorRef::from_slice(&rows, &[8, 3])?)?;
//! assert_eq!(y.shape(), &[2, 3]);
//! # Ok(()) }
//! ```
//!
//! Every call checks the library's status and returns `Err(Error { status,
//! message })`.  The handle is destroyed on `Drop` (or with `destroy()`,
//! which reports the status); result views borrow the handle, so the borrow
//! checker enforces the library's validity rules.
mod bootstrap;
mod error;
mod library_bootstrap;
#[cfg(feature = "mpi")]
mod mpi;
mod store;
mod tensor;

pub use bootstrap::{thread_group, Bootstrap, BoxError, SingleRank, ThreadRank};
pub use store::{RejoinBootstrap, Store, StoreBootstrap};
pub use error::{Error, Result, Status};
#[cfg(feature = "mpi")]
pub use mpi::MpiBootstrap;
pub use tensor::{DType, Device, Element, TensorMut, TensorRef, View};

use error::check;
use moe_ep_sys as sys;
use std::ffi::{c_void, CString};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

/// Library version (major, minor, patch).
pub fn version() -> Result<(i32, i32, i32)> {
    let (mut a, mut b, mut c) = (0, 0, 0);
    check(unsafe { sys::moe_ep_get_version(&mut a, &mut b, &mut c) })?;
    Ok((a, b, c))
}

/// Whether the NVLINK_TWO_SIDED backend can run on CUDA device `device`.
/// Local, no collective; false where there is no GPU or driver.
pub fn is_platform_supported(device: i32) -> Result<bool> {
    let mut s = 0;
    check(unsafe { sys::moe_ep_is_platform_supported(device, &mut s) })?;
    Ok(s != 0)
}

/// `moe_ep_params_t`, starting from the library's defaults.
#[derive(Clone, Copy, Debug)]
pub struct Params(sys::moe_ep_params_t);

impl Params {
    pub fn new(num_experts: i32, top_k: i32, max_tokens_per_rank: i32, hidden_size: i32) -> Result<Self> {
        let mut p = sys::moe_ep_params_t::default();
        check(unsafe { sys::moe_ep_params_init(&mut p, std::mem::size_of_val(&p)) })?;
        p.num_experts = num_experts;
        p.top_k = top_k;
        p.max_tokens_per_rank = max_tokens_per_rank;
        p.hidden_size = hidden_size;
        Ok(Params(p))
    }
    pub fn hidden_dtype(mut self, d: DType) -> Self {
        self.0.hidden_dtype = d.raw();
        self
    }
    pub fn hidden_row_elems(mut self, n: i32) -> Self {
        self.0.hidden_row_elems = n;
        self
    }
    pub fn scales(mut self, row_elems: i32, d: DType) -> Self {
        self.0.scale_row_elems = row_elems;
        self.0.scale_dtype = d.raw();
        self
    }
    pub fn invalid_expert_id(mut self, id: i32) -> Self {
        self.0.invalid_expert_id = id;
        self
    }
    pub fn eplb_stats(mut self, on: bool) -> Self {
        self.0.enable_eplb_stats = on as i32;
        self
    }
    pub fn combine_dtype(mut self, d: DType) -> Self {
        self.0.combine_dtype = d.raw();
        self
    }
    /// How dispatch lays out the received rows (docs/semantics.md, "Receive
    /// layouts"); the same on every rank.  The expert layouts run on the HOST
    /// backend; the GPU backends refuse them at create (UNSUPPORTED).
    pub fn receive_layout(mut self, l: ReceiveLayout) -> Self {
        self.0.receive_layout = l.raw();
        self
    }
    /// `ReceiveLayout::ExpertMajor`: rows per local expert; 0 (default) =
    /// world_size * max_tokens_per_rank.  Pairs beyond it are counted in
    /// `DispatchResult::dropped_pairs`, never written.
    pub fn expert_capacity(mut self, rows: i32) -> Self {
        self.0.expert_capacity = rows;
        self
    }
    /// `ReceiveLayout::ExpertPacked`: every expert's first row is a multiple
    /// of it, 1..256; 0 (default) = 1.
    pub fn expert_alignment(mut self, rows: i32) -> Self {
        self.0.expert_alignment = rows;
        self
    }
    /// `ReceiveLayout::ExpertPacked`: rows of the result, a multiple of the
    /// alignment; 0 (default) = the worst case.
    pub fn expert_rows(mut self, rows: i32) -> Self {
        self.0.expert_rows = rows;
        self
    }
    /// Expert layouts: the expert output already carries the pick weights,
    /// so combine adds the rows as they are instead of multiplying each by
    /// its `row_weights` entry.
    pub fn expert_output_weighted(mut self, on: bool) -> Self {
        self.0.expert_output_weighted = on as i32;
        self
    }
    /// Expert layouts with scales: how `hidden_states_scale` is laid out.
    pub fn scale_layout(mut self, l: ScaleLayout) -> Self {
        self.0.scale_layout = l.raw();
        self
    }
    /// What dispatch moves between ranks (docs/semantics.md, "A low-precision
    /// wire"); the same on every rank.  `WireFormat::Fp8E4m3Block128` needs a
    /// BF16, F16 or F32 `hidden_dtype` and no `scales` (the library makes
    /// them): the result's `hidden_states` are then `DType::FP8_E4M3FN`
    /// `[P, R]` (read them with `View::as_bits::<u8>`) and
    /// `hidden_states_scale` F32 `[P, ceil(R / 128)]` (expert layouts: their
    /// shapes), unless `dispatch_dequantize`.
    pub fn dispatch_wire(mut self, w: WireFormat) -> Self {
        self.0.dispatch_wire = w.raw();
        self
    }
    /// What combine moves between ranks: with `WireFormat::Fp8E4m3Block128`
    /// each rank's rows cross as e4m3 and are dequantized to f32 before the
    /// ordered sum.  Combine's tensors do not change.
    pub fn combine_wire(mut self, w: WireFormat) -> Self {
        self.0.combine_wire = w.raw();
        self
    }
    /// The scale rule of the FP8 wires (only with one of them).
    pub fn wire_scale(mut self, s: WireScale) -> Self {
        self.0.wire_scale = s.raw();
        self
    }
    /// With an FP8 dispatch wire: the receiver dequantizes, so
    /// `hidden_states` has `hidden_dtype` again and there are no scales.
    pub fn dispatch_dequantize(mut self, on: bool) -> Self {
        self.0.dispatch_dequantize = on as i32;
        self
    }
    pub fn raw(&self) -> &sys::moe_ep_params_t {
        &self.0
    }
}

/// `MOE_EP_LAYOUT_*`: how dispatch lays out the received rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiveLayout {
    /// `[world_size * tokens_per_rank, R]`, one row per received token, by
    /// source rank (the default).
    RankMajor,
    /// `[E_local, capacity, R]`: one row per (token, local pick), a segment
    /// per local expert, `expert_counts` rows of each written.
    ExpertMajor,
    /// `[expert_rows, R]`: expert e's rows at `[expert_offsets[e],
    /// expert_offsets[e] + expert_counts[e])`, offsets aligned.
    ExpertPacked,
}

impl ReceiveLayout {
    fn raw(self) -> i32 {
        match self {
            ReceiveLayout::RankMajor => sys::MOE_EP_LAYOUT_RANK_MAJOR,
            ReceiveLayout::ExpertMajor => sys::MOE_EP_LAYOUT_EXPERT_MAJOR,
            ReceiveLayout::ExpertPacked => sys::MOE_EP_LAYOUT_EXPERT_PACKED,
        }
    }
}

/// `MOE_EP_SCALES_*`: the layout of `hidden_states_scale` in an expert layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleLayout {
    /// Row-aligned with `hidden_states` (the default).
    RowMajor,
    /// fp32 scales only: `[S, align4(expert_rows)]` (ExpertPacked) or
    /// `[E_local, S, align4(capacity)]` (ExpertMajor), the TMA-aligned layout
    /// grouped FP8 GEMMs read.
    ColumnMajor,
}

impl ScaleLayout {
    fn raw(self) -> i32 {
        match self {
            ScaleLayout::RowMajor => sys::MOE_EP_SCALES_ROW_MAJOR,
            ScaleLayout::ColumnMajor => sys::MOE_EP_SCALES_COLUMN_MAJOR,
        }
    }
}

/// `MOE_EP_WIRE_*`: what crosses between ranks in dispatch or combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireFormat {
    /// The rows as they are (the default).
    AsIs,
    /// float8 e4m3fn values with one f32 scale per 128 elements of a row (the
    /// last block of a row may be shorter), quantized by the library.
    Fp8E4m3Block128,
}

impl WireFormat {
    fn raw(self) -> i32 {
        match self {
            WireFormat::AsIs => sys::MOE_EP_WIRE_AS_IS,
            WireFormat::Fp8E4m3Block128 => sys::MOE_EP_WIRE_FP8_E4M3_BLOCK128,
        }
    }
}

/// `MOE_EP_WIRE_SCALE_*`: how an FP8 wire picks a block's scale from its amax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireScale {
    /// `amax / 448` in f32 (the default).
    Fp32,
    /// The power of two at or above `amax / 448` (one exponent byte, as
    /// DeepSeek-style GEMMs consume them), still stored as f32.
    Ue8m0,
}

impl WireScale {
    fn raw(self) -> i32 {
        match self {
            WireScale::Fp32 => sys::MOE_EP_WIRE_SCALE_FP32,
            WireScale::Ue8m0 => sys::MOE_EP_WIRE_SCALE_UE8M0,
        }
    }
}

/// `MOE_EP_BACKEND_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Auto,
    NvlinkTwoSided,
    Host,
    /// NCCL moves the bytes (several nodes, GPUs without NVLink); NCCL is loaded at run time.
    Nccl,
}

/// `MOE_EP_PHASE_*`: which call `MoeEp::last_path` asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Dispatch,
    Combine,
}

/// What `MoeEp::poll_health` reports (`moe_ep_health_t`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// SUCCESS, or the sticky TIMEOUT, CUDA or INTERNAL that broke the handle.
    pub status: Status,
    /// That status with the library's message; None when healthy.
    pub error: Option<Error>,
    /// The peer a timeout named; None when none is known (on HOST and NCCL
    /// set only by `FailurePolicy::Mask`: the lowest rank the survivors dropped).
    pub failed_rank: Option<i32>,
    /// Ranks active in the current mask.
    pub active_count: i32,
    /// 0 at create, +1 per `MoeEp::set_active_ranks`.
    pub mask_epoch: u64,
}

/// `MOE_EP_ON_FAILURE_*`: what a peer that stops answering does to the
/// handle (docs/reliability.md, "Surviving a dead rank").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// TIMEOUT, and the handle is unusable (the default).
    FailHandle,
    /// HOST and NVLINK_TWO_SIDED: the survivors drop the failed rank from the
    /// active-rank mask through the store at `Config::store_address` and go
    /// on; the failing call returns TIMEOUT naming it, `MoeEp::poll_health`
    /// shows `failed_rank` and the new `mask_epoch` (on NVLINK_TWO_SIDED the
    /// poll reports TIMEOUT, not sticky, as soon as a kernel gave up: the
    /// next call recovers).
    Mask,
}

/// `moe_ep_config_t`, starting from the library's defaults.
///
/// The two strings are kept as owned `CString`s; the C struct, with pointers
/// into them, is made only for the call that reads it (`MoeEp::new`,
/// `workspace_size`), which the library copies.  So a `Config` is plain data
/// (`Send + Sync` without an `unsafe impl`).
#[derive(Clone, Debug)]
pub struct Config {
    struct_size: u32,
    backend: i32,
    num_sms: i32,
    timeout_ms: i32,
    device: i32,
    zero_copy_combine: i32,
    micro_batches: i32,
    failure_policy: i32,
    rejoin: i32,
    store_address: Option<CString>,
    store_prefix: Option<CString>,
}

/// A string argument for a `const char*`: refused with its name when it holds a NUL byte.
pub(crate) fn c_string(value: &str, name: &str) -> Result<CString> {
    CString::new(value).map_err(|_| {
        Error::new(Status::INVALID_ARGUMENT, format!("{name}: expected a string without NUL bytes, got {value:?}"))
    })
}

impl Config {
    pub fn new() -> Result<Self> {
        let mut c = sys::moe_ep_config_t::default();
        check(unsafe { sys::moe_ep_config_init(&mut c, std::mem::size_of_val(&c)) })?;
        // moe_ep_config_init leaves both strings NULL (the defaults).
        Ok(Config {
            struct_size: c.struct_size,
            backend: c.backend,
            num_sms: c.num_sms,
            timeout_ms: c.timeout_ms,
            device: c.device,
            zero_copy_combine: c.zero_copy_combine,
            micro_batches: c.micro_batches,
            failure_policy: c.failure_policy,
            rejoin: c.rejoin,
            store_address: None,
            store_prefix: None,
        })
    }
    pub fn backend(mut self, b: Backend) -> Self {
        self.backend = match b {
            Backend::Auto => sys::MOE_EP_BACKEND_AUTO,
            Backend::NvlinkTwoSided => sys::MOE_EP_BACKEND_NVLINK_TWO_SIDED,
            Backend::Host => sys::MOE_EP_BACKEND_HOST,
            Backend::Nccl => sys::MOE_EP_BACKEND_NCCL,
        };
        self
    }
    pub fn num_sms(mut self, n: i32) -> Self {
        self.num_sms = n;
        self
    }
    pub fn timeout_ms(mut self, ms: i32) -> Self {
        self.timeout_ms = ms;
        self
    }
    pub fn device(mut self, d: i32) -> Self {
        self.device = d;
        self
    }
    /// Every dispatch result then holds `combine_input`, a view to write the
    /// expert output into; `MoeEp::combine_from_input` combines it in place.
    pub fn zero_copy_combine(mut self, on: bool) -> Self {
        self.zero_copy_combine = on as i32;
        self
    }
    /// 1 (default) or 2: buffer slots for the split calls
    /// (`MoeEp::dispatch_send` ...), one micro-batch in flight per slot.
    pub fn micro_batches(mut self, n: i32) -> Self {
        self.micro_batches = n;
        self
    }
    /// What a peer that stops answering does (the same on every rank);
    /// `FailurePolicy::Mask` needs `store_address`.
    pub fn failure_policy(mut self, p: FailurePolicy) -> Self {
        self.failure_policy = match p {
            FailurePolicy::FailHandle => sys::MOE_EP_ON_FAILURE_FAIL_HANDLE,
            FailurePolicy::Mask => sys::MOE_EP_ON_FAILURE_MASK,
        };
        self
    }
    /// This process replaces a failed rank of a running `FailurePolicy::Mask`
    /// group: `MoeEp::new` (with a `RejoinBootstrap`) returns once the
    /// survivors admit it with `MoeEp::set_active_ranks`.
    pub fn rejoin(mut self, on: bool) -> Self {
        self.rejoin = on as i32;
        self
    }
    /// `"host:port"` of a moe_ep store (`Store::address`).  A string holding
    /// a NUL byte is `Err(INVALID_ARGUMENT)`; the library checks the rest at
    /// create.
    pub fn store_address(mut self, address: &str) -> Result<Self> {
        self.store_address = Some(c_string(address, "store_address")?);
        Ok(self)
    }
    /// The group's name in the store (default "moe_ep"); groups that share
    /// a store need distinct prefixes, and a replacement passes its group's.
    pub fn store_prefix(mut self, prefix: &str) -> Result<Self> {
        self.store_prefix = Some(c_string(prefix, "store_prefix")?);
        Ok(self)
    }
    /// The C struct.  Its `store_address` and `store_prefix` point into
    /// `self`: valid while `self` is alive and unchanged.
    pub fn to_raw(&self) -> sys::moe_ep_config_t {
        let text = |s: &Option<CString>| s.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        sys::moe_ep_config_t {
            struct_size: self.struct_size,
            backend: self.backend,
            num_sms: self.num_sms,
            timeout_ms: self.timeout_ms,
            device: self.device,
            zero_copy_combine: self.zero_copy_combine,
            micro_batches: self.micro_batches,
            failure_policy: self.failure_policy,
            rejoin: self.rejoin,
            store_address: text(&self.store_address),
            store_prefix: text(&self.store_prefix),
        }
    }
}

/// Calls `f` with the C config of `config` (NULL for None); its strings
/// point into `config`, which outlives the call.
fn with_config<R>(config: Option<&Config>, f: impl FnOnce(*const sys::moe_ep_config_t) -> R) -> R {
    let raw = config.map(Config::to_raw);
    f(raw.as_ref().map_or(ptr::null(), |c| c as *const _))
}

/// Bytes `MoeEp::new` would allocate per rank.  Local, no allocation.
pub fn workspace_size(params: &Params, config: Option<&Config>, world_size: i32) -> Result<u64> {
    let mut n = 0u64;
    check(with_config(config, |c| unsafe { sys::moe_ep_workspace_size(&params.0, c, world_size, &mut n) }))?;
    Ok(n)
}

/// Inputs of one dispatch (see moe_ep_dispatch_args_t).
#[derive(Clone, Copy, Debug)]
pub struct DispatchArgs<'a> {
    pub hidden_states: TensorRef<'a>,
    pub topk_ids: TensorRef<'a>,
    pub topk_weights: Option<TensorRef<'a>>,
    pub hidden_states_scale: Option<TensorRef<'a>>,
    /// 0 = max_tokens_per_rank.
    pub runtime_max_tokens_per_rank: i32,
    pub eplb_local_stats: Option<TensorRef<'a>>,
}

impl<'a> DispatchArgs<'a> {
    pub fn new(hidden_states: TensorRef<'a>, topk_ids: TensorRef<'a>) -> Self {
        DispatchArgs {
            hidden_states,
            topk_ids,
            topk_weights: None,
            hidden_states_scale: None,
            runtime_max_tokens_per_rank: 0,
            eplb_local_stats: None,
        }
    }
    pub fn weights(mut self, t: TensorRef<'a>) -> Self {
        self.topk_weights = Some(t);
        self
    }
    pub fn scales(mut self, t: TensorRef<'a>) -> Self {
        self.hidden_states_scale = Some(t);
        self
    }
    pub fn runtime_max_tokens_per_rank(mut self, n: i32) -> Self {
        self.runtime_max_tokens_per_rank = n;
        self
    }
    pub fn eplb_local_stats(mut self, t: TensorRef<'a>) -> Self {
        self.eplb_local_stats = Some(t);
        self
    }
}

/// What dispatch returned: P = world_size * tokens_per_rank receive rows,
/// rank-major, or in an expert layout (`Params::receive_layout`) one row per
/// (source token, local pick).  Borrows the handle until dropped.
#[derive(Debug)]
pub struct DispatchResult<'h> {
    pub tokens_per_rank: i32,
    /// `[P, R]`; expert layouts: `[E_local, capacity, R]` or `[expert_rows, R]`.
    pub hidden_states: View<'h>,
    /// `[P, K]` int32; None in the expert layouts (the rows carry their pick).
    pub topk_ids: Option<View<'h>>,
    pub topk_weights: Option<View<'h>>,
    pub hidden_states_scale: Option<View<'h>>,
    pub recv_counts: View<'h>,
    pub local_expert_counts: View<'h>,
    pub eplb_gathered_stats: Option<View<'h>>,
    /// [P, hidden_size] combine_dtype, with `Config::zero_copy_combine`: write
    /// the expert output here (`as_mut_slice`), drop the result, then call
    /// `MoeEp::combine_from_input`.  Expert layouts: the layout's rows.
    pub combine_input: Option<View<'h>>,
    // The expert layouts' results; None in `ReceiveLayout::RankMajor`.
    /// `[E_local]` int32: rows written per local expert.
    pub expert_counts: Option<View<'h>>,
    /// `[E_local + 1]` int32, ExpertPacked only: each expert's first row, the
    /// last entry the aligned total.
    pub expert_offsets: Option<View<'h>>,
    /// `[rows, 3]` int32: source rank, source token, pick index; -1 on padding.
    pub row_sources: Option<View<'h>>,
    /// `[rows]` f32: the pick's weight (1.0 without `topk_weights`), 0 on padding.
    pub row_weights: Option<View<'h>>,
    /// `[1]` int32: pairs beyond the capacity (or `expert_rows`): counted,
    /// never written, not an error.
    pub dropped_pairs: Option<View<'h>>,
}

fn required<'h>(t: &sys::moe_ep_tensor_t, name: &str) -> Result<View<'h>> {
    View::from_raw(t).ok_or_else(|| Error::new(Status::INTERNAL, format!("dispatch returned no {name}")))
}

/// Calls `f` with the C arguments of `args`; the descriptors' shapes point
/// into `args`, which outlives the call.
fn with_dispatch_args<R>(args: &DispatchArgs<'_>, f: impl FnOnce(&sys::moe_ep_dispatch_args_t) -> R) -> Result<R> {
    let hidden = args.hidden_states.raw();
    let ids = args.topk_ids.raw();
    let weights = args.topk_weights.as_ref().map(|t| t.raw());
    let scales = args.hidden_states_scale.as_ref().map(|t| t.raw());
    let eplb = args.eplb_local_stats.as_ref().map(|t| t.raw());
    let opt = |t: &Option<sys::moe_ep_tensor_t>| t.as_ref().map_or(ptr::null(), |t| t as *const _);
    let mut a = sys::moe_ep_dispatch_args_t {
        struct_size: 0,
        hidden_states: ptr::null(),
        topk_ids: ptr::null(),
        topk_weights: ptr::null(),
        hidden_states_scale: ptr::null(),
        runtime_max_tokens_per_rank: 0,
        eplb_local_stats: ptr::null(),
    };
    check(unsafe { sys::moe_ep_dispatch_args_init(&mut a, std::mem::size_of_val(&a)) })?;
    a.hidden_states = &hidden;
    a.topk_ids = &ids;
    a.topk_weights = opt(&weights);
    a.hidden_states_scale = opt(&scales);
    a.runtime_max_tokens_per_rank = args.runtime_max_tokens_per_rank;
    a.eplb_local_stats = opt(&eplb);
    Ok(f(&a))
}

/// None when the caller gave `output`, else the library-owned output view.
fn combine_output<'h>(caller_output: bool, r: &sys::moe_ep_combine_result_t) -> Result<Option<View<'h>>> {
    if caller_output {
        return Ok(None);
    }
    // T == 0 gives data NULL with ndim 2: still a (empty) view.
    Ok(Some(View::from_raw(&r.output).ok_or_else(|| Error::new(Status::INTERNAL, "combine returned no output"))?))
}

/// One moe_ep handle.  `Send` (a handle is used by one thread at a time) but
/// not `Sync`.
pub struct MoeEp {
    raw: sys::moe_ep_handle_t,
    // The library calls back into the bootstrap until destroy: boxed so that
    // the ctx pointer it holds stays valid for the handle's whole life.  Not
    // dropped when a call timed out with a callback possibly still running
    // on the library's exchange thread (Drop leaks it then; see Ctx).
    ctx: ManuallyDrop<Box<bootstrap::Ctx>>,
    // Per slot: the last dispatch's combine_input (address, device, dtype,
    // shape), for combine_from_input / combine_send_from_input; None without
    // zero_copy_combine or once that slot's combine was issued.
    combine_input: Vec<Option<CombineInput>>,
}

// [P, H], or an expert layout's [E_local, capacity, H] / [expert_rows, H].
type CombineInput = (*mut c_void, Device, DType, Vec<i64>);

// SAFETY: the library allows a handle to move between threads as long as one
// thread uses it at a time, which &mut self guarantees; the bootstrap is
// Send + Sync.
unsafe impl Send for MoeEp {}

impl MoeEp {
    /// Collective: every rank of the bootstrap's group calls it.
    /// `config` None = the library's defaults.
    pub fn new(bootstrap: Arc<dyn Bootstrap>, params: &Params, config: Option<&Config>) -> Result<Self> {
        // A MASK handle calls the callbacks during create only: afterwards it
        // exchanges through the store.
        let mask = config.is_some_and(|c| c.failure_policy == sys::MOE_EP_ON_FAILURE_MASK);
        let ctx = bootstrap::Ctx::new(bootstrap, !mask);
        let b = ctx.raw()?;
        let mut raw: sys::moe_ep_handle_t = ptr::null_mut();
        let status = with_config(config, |c| unsafe { sys::moe_ep_create(&b, &params.0, c, &mut raw) });
        if status == sys::MOE_EP_ERROR_TIMEOUT {
            // An agreement step's callback may still be running on the
            // library's thread, with this ctx: it must outlive it.
            ctx.abandon();
        }
        if let Err(e) = Self::with_bootstrap_error(&ctx, check(status)) {
            if ctx.abandoned() {
                Box::leak(ctx); // on purpose, see Drop
            }
            return Err(e);
        }
        Ok(MoeEp { raw, ctx: ManuallyDrop::new(ctx), combine_input: Vec::new() })
    }

    /// A BOOTSTRAP failure says which callback failed and why.  A TIMEOUT of
    /// a handle that still calls its callbacks marks the ctx abandoned.
    fn with_bootstrap_error<T>(ctx: &bootstrap::Ctx, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if e.status == Status::TIMEOUT && ctx.callbacks_after_create() {
                ctx.abandon();
            }
        }
        r.map_err(|mut e| {
            if let Some(why) = ctx.take_error() {
                e.message = format!("{} ({why})", e.message);
            }
            e
        })
    }

    pub fn rank(&self) -> i32 {
        self.ctx.inner.rank()
    }
    pub fn world_size(&self) -> i32 {
        self.ctx.inner.world_size()
    }

    /// Collective dispatch on the legacy default stream (CPU tensors: no stream).
    pub fn dispatch(&mut self, args: &DispatchArgs<'_>) -> Result<DispatchResult<'_>> {
        unsafe { self.dispatch_on_stream(args, ptr::null_mut()) }
    }

    /// # Safety
    /// `stream` must be a valid `cudaStream_t` of the handle's device, or null.
    pub unsafe fn dispatch_on_stream(&mut self, args: &DispatchArgs<'_>, stream: *mut c_void)
                                     -> Result<DispatchResult<'_>> {
        let status = with_dispatch_args(args, |a| {
            let mut r = sys::moe_ep_dispatch_result_t::default();
            check(unsafe { sys::moe_ep_dispatch_result_init(&mut r, std::mem::size_of_val(&r)) })?;
            check(unsafe { sys::moe_ep_dispatch(self.raw, a, &mut r, stream) }).map(|_| r)
        })?;
        let r = Self::with_bootstrap_error(&self.ctx, status)?;
        self.dispatch_result(0, &r)
    }

    fn set_combine_input(&mut self, slot: i32, v: Option<CombineInput>) {
        let slot = slot as usize; // the library accepted it: 0 <= slot < micro_batches
        if self.combine_input.len() <= slot {
            self.combine_input.resize(slot + 1, None);
        }
        self.combine_input[slot] = v;
    }

    fn dispatch_result<'h>(&mut self, slot: i32, r: &sys::moe_ep_dispatch_result_t) -> Result<DispatchResult<'h>> {
        let combine_input = View::from_raw(&r.combine_input);
        self.set_combine_input(slot, combine_input.as_ref()
            .map(|v| (v.data_ptr(), v.device(), v.dtype(), v.shape().to_vec())));
        Ok(DispatchResult {
            combine_input,
            tokens_per_rank: r.tokens_per_rank,
            hidden_states: required(&r.hidden_states, "hidden_states")?,
            topk_ids: View::from_raw(&r.topk_ids),
            topk_weights: View::from_raw(&r.topk_weights),
            hidden_states_scale: View::from_raw(&r.hidden_states_scale),
            recv_counts: required(&r.recv_counts, "recv_counts")?,
            local_expert_counts: required(&r.local_expert_counts, "local_expert_counts")?,
            eplb_gathered_stats: View::from_raw(&r.eplb_gathered_stats),
            expert_counts: View::from_raw(&r.expert_counts),
            expert_offsets: View::from_raw(&r.expert_offsets),
            row_sources: View::from_raw(&r.row_sources),
            row_weights: View::from_raw(&r.row_weights),
            dropped_pairs: View::from_raw(&r.dropped_pairs),
        })
    }

    /// Collective combine into library-owned memory (valid until the next
    /// call on this handle, which the borrow enforces).
    pub fn combine(&mut self, expert_output: &TensorRef<'_>) -> Result<View<'_>> {
        unsafe { self.combine_on_stream(expert_output, None, ptr::null_mut()) }.map(|v| v.expect("output"))
    }

    /// Collective combine into the caller's `output` [T, hidden_size].
    pub fn combine_into(&mut self, expert_output: &TensorRef<'_>, output: &mut TensorMut<'_>) -> Result<()> {
        unsafe { self.combine_on_stream(expert_output, Some(output), ptr::null_mut()) }.map(|_| ())
    }

    /// Collective combine of the expert output the caller wrote into the last
    /// dispatch's `combine_input` (zero-copy), into library-owned memory.
    pub fn combine_from_input(&mut self) -> Result<View<'_>> {
        let eo = self.combine_input_tensor()?;
        unsafe { self.combine_on_stream(&eo, None, ptr::null_mut()) }.map(|v| v.expect("output"))
    }

    /// `combine_from_input` into the caller's `output` [T, hidden_size].
    pub fn combine_from_input_into(&mut self, output: &mut TensorMut<'_>) -> Result<()> {
        let eo = self.combine_input_tensor()?;
        unsafe { self.combine_on_stream(&eo, Some(output), ptr::null_mut()) }.map(|_| ())
    }

    fn combine_input_tensor(&self) -> Result<TensorRef<'static>> {
        self.combine_input_of(0)
    }

    fn combine_input_of(&self, slot: i32) -> Result<TensorRef<'static>> {
        let held = usize::try_from(slot).ok().and_then(|s| self.combine_input.get(s).cloned().flatten());
        let (data, device, dtype, shape) = held.ok_or_else(|| {
            Error::new(Status::INVALID_STATE,
                       format!("combine from combine_input: slot {slot} holds no combine_input view (the \
                                handle was created without Config::zero_copy_combine, or no dispatch of \
                                that slot is waiting for its combine)"))
        })?;
        // SAFETY: the library's view, valid until the combine this tensor is passed to.
        unsafe { TensorRef::from_raw(data, device, dtype, &shape) }
    }

    /// # Safety
    /// `stream` must be a valid `cudaStream_t` of the handle's device, or null.
    pub unsafe fn combine_on_stream(&mut self, expert_output: &TensorRef<'_>, output: Option<&mut TensorMut<'_>>,
                                    stream: *mut c_void) -> Result<Option<View<'_>>> {
        let eo = expert_output.raw();
        let out = output.as_ref().map(|t| t.raw());
        let mut r = sys::moe_ep_combine_result_t::default();
        check(unsafe { sys::moe_ep_combine_result_init(&mut r, std::mem::size_of_val(&r)) })?;
        let status = unsafe {
            sys::moe_ep_combine(self.raw, &eo, out.as_ref().map_or(ptr::null(), |t| t as *const _), &mut r,
                                stream)
        };
        Self::with_bootstrap_error(&self.ctx, check(status))?;
        self.set_combine_input(0, None); // issued: the view is no longer the caller's
        combine_output(out.is_some(), &r)
    }

    // Split phases (docs/overlap.md).  Each slot (0 .. micro_batches - 1) goes
    // IDLE -dispatch_send-> DISPATCH_SENT -dispatch_recv-> DISPATCHED
    // -combine_send-> COMBINE_SENT -combine_recv-> IDLE; any other call on it
    // is Err(INVALID_STATE) and the handle stays usable.  `dispatch` is
    // dispatch_send + dispatch_recv on slot 0, `combine` combine_send +
    // combine_recv on slot 0.  Results borrow the handle mutably, as those of
    // the fused calls do: copy out what a slot's dispatch produced before the
    // next call (the library would keep it valid until that slot's
    // combine_send, a library-owned combine output until its next
    // combine_recv; the borrow is the stricter, checked rule).

    /// Collective: the send half of dispatch on `slot`; returns once the rows
    /// are on their way.  The tensors of `args` are read by the call only.
    pub fn dispatch_send(&mut self, slot: i32, args: &DispatchArgs<'_>) -> Result<()> {
        unsafe { self.dispatch_send_on_stream(slot, args, ptr::null_mut()) }
    }

    /// # Safety
    /// `stream` must be a valid `cudaStream_t` of the handle's device, or
    /// null; `args`' tensors must stay alive until the stream's work is done.
    pub unsafe fn dispatch_send_on_stream(&mut self, slot: i32, args: &DispatchArgs<'_>, stream: *mut c_void)
                                          -> Result<()> {
        let status = with_dispatch_args(args, |a| check(unsafe { sys::moe_ep_dispatch_send(self.raw, slot, a, stream) }))?;
        Self::with_bootstrap_error(&self.ctx, status)
    }

    /// Collective: the receive half of dispatch on `slot`: waits for the rows
    /// (bounded by timeout_ms); the same result, bitwise, as `dispatch`.
    pub fn dispatch_recv(&mut self, slot: i32) -> Result<DispatchResult<'_>> {
        unsafe { self.dispatch_recv_on_stream(slot, ptr::null_mut()) }
    }

    /// # Safety
    /// `stream` must be a valid `cudaStream_t` of the handle's device, or null.
    pub unsafe fn dispatch_recv_on_stream(&mut self, slot: i32, stream: *mut c_void) -> Result<DispatchResult<'_>> {
        let mut r = sys::moe_ep_dispatch_result_t::default();
        check(unsafe { sys::moe_ep_dispatch_result_init(&mut r, std::mem::size_of_val(&r)) })?;
        let status = unsafe { sys::moe_ep_dispatch_recv(self.raw, slot, &mut r, stream) };
        Self::with_bootstrap_error(&self.ctx, check(status))?;
        self.dispatch_result(slot, &r)
    }

    /// Collective: the send half of combine on `slot` (expert_output as for
    /// `combine`); ends the validity of the slot's dispatch results.
    pub fn combine_send(&mut self, slot: i32, expert_output: &TensorRef<'_>) -> Result<()> {
        unsafe { self.combine_send_on_stream(slot, expert_output, ptr::null_mut()) }
    }

    /// `combine_send` of the expert output the caller wrote into the slot's
    /// `combine_input` (zero-copy).
    pub fn combine_send_from_input(&mut self, slot: i32) -> Result<()> {
        let eo = self.combine_input_of(slot)?;
        unsafe { self.combine_send_on_stream(slot, &eo, ptr::null_mut()) }
    }

    /// # Safety
    /// `stream` must be a valid `cudaStream_t` of the handle's device, or
    /// null; `expert_output` must stay alive until the stream's work is done.
    pub unsafe fn combine_send_on_stream(&mut self, slot: i32, expert_output: &TensorRef<'_>, stream: *mut c_void)
                                         -> Result<()> {
        let eo = expert_output.raw();
        let status = unsafe { sys::moe_ep_combine_send(self.raw, slot, &eo, stream) };
        Self::with_bootstrap_error(&self.ctx, check(status))?;
        self.set_combine_input(slot, None);
        Ok(())
    }

    /// Collective: the receive half of combine on `slot` into library-owned
    /// memory; the same bits as `combine`.
    pub fn combine_recv(&mut self, slot: i32) -> Result<View<'_>> {
        unsafe { self.combine_recv_on_stream(slot, None, ptr::null_mut()) }.map(|v| v.expect("output"))
    }

    /// `combine_recv` into the caller's `output` [T, hidden_size].
    pub fn combine_recv_into(&mut self, slot: i32, output: &mut TensorMut<'_>) -> Result<()> {
        unsafe { self.combine_recv_on_stream(slot, Some(output), ptr::null_mut()) }.map(|_| ())
    }

    /// # Safety
    /// `stream` must be a valid `cudaStream_t` of the handle's device, or null.
    pub unsafe fn combine_recv_on_stream(&mut self, slot: i32, output: Option<&mut TensorMut<'_>>,
                                         stream: *mut c_void) -> Result<Option<View<'_>>> {
        let out = output.as_ref().map(|t| t.raw());
        let mut r = sys::moe_ep_combine_result_t::default();
        check(unsafe { sys::moe_ep_combine_result_init(&mut r, std::mem::size_of_val(&r)) })?;
        let status = unsafe {
            sys::moe_ep_combine_recv(self.raw, slot, out.as_ref().map_or(ptr::null(), |t| t as *const _), &mut r,
                                     stream)
        };
        Self::with_bootstrap_error(&self.ctx, check(status))?;
        combine_output(out.is_some(), &r)
    }

    /// The backend this handle runs on: what `Backend::Auto` chose, the same
    /// on every rank (HOST takes CPU tensors, the others the handle's GPU).
    pub fn backend(&self) -> Result<Backend> {
        let mut b = -1;
        check(unsafe { sys::moe_ep_get_backend(self.raw, &mut b) })?;
        match b {
            sys::MOE_EP_BACKEND_NVLINK_TWO_SIDED => Ok(Backend::NvlinkTwoSided),
            sys::MOE_EP_BACKEND_HOST => Ok(Backend::Host),
            sys::MOE_EP_BACKEND_NCCL => Ok(Backend::Nccl),
            other => Err(Error::new(Status::INTERNAL, format!("moe_ep_get_backend returned {other}"))),
        }
    }

    /// The path this handle's last call of `phase` took on this rank, by
    /// name (`moe_ep_path_name`): "host", "nccl", "dispatch_small",
    /// "combine_overlapped_push", ...; "none" before the first such call.
    /// Which kernels and schedule the library chose; results are the same on
    /// every path.  Local, no synchronisation.
    pub fn last_path(&self, phase: Phase) -> Result<&'static str> {
        let phase = match phase {
            Phase::Dispatch => sys::MOE_EP_PHASE_DISPATCH,
            Phase::Combine => sys::MOE_EP_PHASE_COMBINE,
        };
        let mut path = -1;
        check(unsafe { sys::moe_ep_get_last_path(self.raw, phase, &mut path) })?;
        // SAFETY: moe_ep_path_name returns a NUL-terminated string literal of
        // the library, never NULL, valid while the library is loaded (always:
        // it is linked).
        let name = unsafe { std::ffi::CStr::from_ptr(sys::moe_ep_path_name(path)) };
        name.to_str().map_err(|_| Error::new(Status::INTERNAL, format!("moe_ep_path_name({path}) is not UTF-8")))
    }

    /// The first device-side error since the last check (synchronises with
    /// the handle's work), or None.
    pub fn async_error(&mut self) -> Result<Option<Error>> {
        let mut s = sys::MOE_EP_SUCCESS;
        check(unsafe { sys::moe_ep_get_async_error(self.raw, &mut s) })?;
        if s == sys::MOE_EP_SUCCESS {
            Ok(None)
        } else {
            Ok(Some(Error { status: Status(s), message: error::last_error() }))
        }
    }

    /// The handle's health, from host memory only (`moe_ep_poll_health`):
    /// never synchronises with the device, never waits for a peer, never
    /// blocks, so a server may call it every step.  Device errors only a
    /// synchronising query finds (bad expert ids) stay with `async_error`.
    /// Local.
    pub fn poll_health(&self) -> Result<Health> {
        let mut h = sys::moe_ep_health_t::default();
        check(unsafe { sys::moe_ep_health_init(&mut h, std::mem::size_of_val(&h)) })?;
        check(unsafe { sys::moe_ep_poll_health(self.raw, &mut h) })?;
        // The poll leaves the failure's message in moe_ep_last_error.
        let error = (h.status != sys::MOE_EP_SUCCESS)
            .then(|| Error { status: Status(h.status), message: error::last_error() });
        Ok(Health {
            status: Status(h.status),
            error,
            failed_rank: (h.failed_rank >= 0).then_some(h.failed_rank),
            active_count: h.active_count,
            mask_epoch: h.mask_epoch,
        })
    }

    /// The current active-rank mask, one entry per rank: true if active.
    /// Local, non-blocking.
    pub fn active_ranks(&self) -> Result<Vec<bool>> {
        let mut mask = vec![0u8; usize::try_from(self.world_size()).unwrap_or(0)];
        check(unsafe { sys::moe_ep_get_active_ranks(self.raw, mask.as_mut_ptr(), self.world_size()) })?;
        Ok(mask.into_iter().map(|a| a != 0).collect())
    }

    /// Collective over every rank of the group, each passing the same mask:
    /// `active[r]` true if rank r stays active (docs/semantics.md, "Active
    /// ranks").  At least one rank active; no pair in flight on any slot
    /// (INVALID_STATE otherwise).  From the next dispatch the experts of
    /// inactive ranks do not exist for the group: their picks are dropped,
    /// combine sums over the active ranks (not renormalised), an inactive
    /// rank's dispatch receives nothing and its combine output is zeros; an
    /// inactive rank still makes every collective call.
    /// `Health::mask_epoch` increments.  A mask whose length is not the
    /// handle's world size, or masks that differ between ranks, are
    /// INVALID_ARGUMENT on every rank.  Under
    /// `FailurePolicy::Mask` it is collective over the ranks active before
    /// or after it only, and at most one rank becomes active per call: how
    /// survivors admit a replacement (`Config::rejoin`, HOST and
    /// NVLINK_TWO_SIDED).
    pub fn set_active_ranks(&mut self, active: &[bool]) -> Result<()> {
        let mask: Vec<u8> = active.iter().map(|&a| a as u8).collect();
        let n = i32::try_from(mask.len()).map_err(|_| {
            Error::new(Status::INVALID_ARGUMENT,
                       format!("set_active_ranks: world_size: expected a 32-bit length, got {}", mask.len()))
        })?;
        let status = unsafe { sys::moe_ep_set_active_ranks(self.raw, mask.as_ptr(), n) };
        Self::with_bootstrap_error(&self.ctx, check(status))
    }

    /// Collective destroy, reporting its status (Drop does the same silently).
    pub fn destroy(mut self) -> Result<()> {
        let status = unsafe { sys::moe_ep_destroy(&mut self.raw) };
        self.raw = ptr::null_mut();
        Self::with_bootstrap_error(&self.ctx, check(status))
    }
}

impl Drop for MoeEp {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // Drop cannot return an error; destroy() is there for callers who
            // want the status.  The library sets the handle to NULL itself.
            let status = unsafe { sys::moe_ep_destroy(&mut self.raw) };
            self.raw = ptr::null_mut();
            let _ = Self::with_bootstrap_error(&self.ctx, check(status));
        }
        // After a timeout the library may still be inside a callback (or
        // about to enter the one it posted) on its exchange thread, and that
        // callback reads the ctx; nothing says when it is done, so the ctx,
        // and the bootstrap it holds, stay allocated for the rest of the
        // process (moe_ep_c.h, moe_ep_bootstrap_t: ctx stays valid until the
        // callback returns).
        if !self.ctx.abandoned() {
            // SAFETY: dropped once, here; the library no longer calls back.
            unsafe { ManuallyDrop::drop(&mut self.ctx) };
        }
    }
}
