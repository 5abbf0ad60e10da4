//! Raw declarations of `include/moe_ep_c.h`, written by hand (no bindgen: CI
//! cannot download crates).  `tests/layout.rs` checks every struct's size,
//! alignment and field offsets against the C compiler.
//!
//! Enumerations are plain `i32` constants, never Rust `enum`s: the library may
//! hand back a value this crate does not know yet, and a Rust enum holding an
//! unlisted value is undefined behaviour.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

pub type moe_ep_status_t = i32;

pub const MOE_EP_VERSION_MAJOR: i32 = 0;
pub const MOE_EP_VERSION_MINOR: i32 = 1;
pub const MOE_EP_VERSION_PATCH: i32 = 0;

pub const MOE_EP_SUCCESS: moe_ep_status_t = 0;
pub const MOE_EP_ERROR_INVALID_ARGUMENT: moe_ep_status_t = 1;
pub const MOE_EP_ERROR_UNSUPPORTED: moe_ep_status_t = 2;
pub const MOE_EP_ERROR_CUDA: moe_ep_status_t = 3;
pub const MOE_EP_ERROR_BOOTSTRAP: moe_ep_status_t = 4;
pub const MOE_EP_ERROR_OUT_OF_MEMORY: moe_ep_status_t = 5;
pub const MOE_EP_ERROR_TIMEOUT: moe_ep_status_t = 6;
pub const MOE_EP_ERROR_INVALID_STATE: moe_ep_status_t = 7;
pub const MOE_EP_ERROR_INVALID_INPUT: moe_ep_status_t = 8;
pub const MOE_EP_ERROR_INTERNAL: moe_ep_status_t = 9;

pub const MOE_EP_DEVICE_CPU: i32 = 1;
pub const MOE_EP_DEVICE_CUDA: i32 = 2;
pub const MOE_EP_DEVICE_CUDA_HOST: i32 = 3;

pub const MOE_EP_DTYPE_INT: u8 = 0;
pub const MOE_EP_DTYPE_UINT: u8 = 1;
pub const MOE_EP_DTYPE_FLOAT: u8 = 2;
pub const MOE_EP_DTYPE_BFLOAT: u8 = 4;
pub const MOE_EP_DTYPE_FLOAT8_E4M3FN: u8 = 10;
pub const MOE_EP_DTYPE_FLOAT8_E5M2: u8 = 12;
pub const MOE_EP_DTYPE_FLOAT4_E2M1FN: u8 = 17;

pub const MOE_EP_BACKEND_AUTO: i32 = 0;
pub const MOE_EP_BACKEND_NVLINK_TWO_SIDED: i32 = 1;
pub const MOE_EP_BACKEND_HOST: i32 = 2;
pub const MOE_EP_BACKEND_NCCL: i32 = 3;

// moe_ep_params_t::receive_layout and ::scale_layout (docs/semantics.md, "Receive layouts").
pub const MOE_EP_LAYOUT_RANK_MAJOR: i32 = 0;
pub const MOE_EP_LAYOUT_EXPERT_MAJOR: i32 = 1;
pub const MOE_EP_LAYOUT_EXPERT_PACKED: i32 = 2;
pub const MOE_EP_SCALES_ROW_MAJOR: i32 = 0;
pub const MOE_EP_SCALES_COLUMN_MAJOR: i32 = 1;

// moe_ep_params_t::dispatch_wire, ::combine_wire and ::wire_scale
// (docs/semantics.md, "A low-precision wire").
pub const MOE_EP_WIRE_AS_IS: i32 = 0;
pub const MOE_EP_WIRE_FP8_E4M3_BLOCK128: i32 = 1;
pub const MOE_EP_WIRE_SCALE_FP32: i32 = 0;
pub const MOE_EP_WIRE_SCALE_UE8M0: i32 = 1;

/// Phases of a call, for `moe_ep_get_last_path`.
pub const MOE_EP_PHASE_DISPATCH: i32 = 0;
pub const MOE_EP_PHASE_COMBINE: i32 = 1;

/// `moe_ep_config_t::failure_policy` (docs/reliability.md, "Surviving a dead rank").
pub const MOE_EP_ON_FAILURE_FAIL_HANDLE: i32 = 0;
pub const MOE_EP_ON_FAILURE_MASK: i32 = 1;

/// The path a call took (`moe_ep_get_last_path`); names from `moe_ep_path_name`.
pub const MOE_EP_PATH_NONE: i32 = 0;
pub const MOE_EP_PATH_HOST: i32 = 1;
pub const MOE_EP_PATH_NCCL: i32 = 2;
pub const MOE_EP_PATH_DISPATCH_SMALL: i32 = 16;
pub const MOE_EP_PATH_DISPATCH_SMALL_BULK: i32 = 17;
pub const MOE_EP_PATH_DISPATCH_SCAN: i32 = 18;
pub const MOE_EP_PATH_DISPATCH_SCAN_BULK: i32 = 19;
pub const MOE_EP_PATH_DISPATCH_LOOKBACK: i32 = 20;
pub const MOE_EP_PATH_DISPATCH_LOOKBACK_BULK: i32 = 21;
pub const MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE: i32 = 22;
pub const MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE: i32 = 23;
pub const MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE: i32 = 24;
pub const MOE_EP_PATH_COMBINE_SMALL_PUSH: i32 = 32;
pub const MOE_EP_PATH_COMBINE_SERIAL_PUSH: i32 = 33;
pub const MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH: i32 = 34;
pub const MOE_EP_PATH_COMBINE_PULL_ROWS: i32 = 35;
pub const MOE_EP_PATH_COMBINE_PULL_SEGMENTS: i32 = 36;
pub const MOE_EP_PATH_COMBINE_PULL_REGISTERS: i32 = 37;
pub const MOE_EP_PATH_COMBINE_PULL_UNALIGNED: i32 = 38;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct moe_ep_device_t {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct moe_ep_dtype_t {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// Binary-identical to DLPack's `DLTensor`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_ep_tensor_t {
    pub data: *mut c_void,
    pub device: moe_ep_device_t,
    pub ndim: i32,
    pub dtype: moe_ep_dtype_t,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

impl Default for moe_ep_tensor_t {
    fn default() -> Self {
        Self {
            data: std::ptr::null_mut(),
            device: moe_ep_device_t::default(),
            ndim: 0,
            dtype: moe_ep_dtype_t::default(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
}

pub type moe_ep_allgather_fn = Option<
    unsafe extern "C" fn(ctx: *mut c_void, send: *const c_void, recv: *mut c_void, bytes_per_rank: usize) -> i32,
>;
pub type moe_ep_barrier_fn = Option<unsafe extern "C" fn(ctx: *mut c_void) -> i32>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_ep_bootstrap_t {
    pub struct_size: u32,
    pub rank: i32,
    pub world_size: i32,
    pub ctx: *mut c_void,
    pub allgather: moe_ep_allgather_fn,
    pub barrier: moe_ep_barrier_fn,
}

impl Default for moe_ep_bootstrap_t {
    /// All zero, no callbacks: what `moe_ep_bootstrap_init` then fills.
    fn default() -> Self {
        Self { struct_size: 0, rank: 0, world_size: 0, ctx: std::ptr::null_mut(), allgather: None, barrier: None }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct moe_ep_params_t {
    pub struct_size: u32,
    pub num_experts: i32,
    pub top_k: i32,
    pub max_tokens_per_rank: i32,
    pub hidden_size: i32,
    pub hidden_dtype: moe_ep_dtype_t,
    pub hidden_row_elems: i32,
    pub scale_row_elems: i32,
    pub scale_dtype: moe_ep_dtype_t,
    pub invalid_expert_id: i32,
    pub enable_eplb_stats: i32,
    pub combine_dtype: moe_ep_dtype_t,
    pub receive_layout: i32,
    pub expert_capacity: i32,
    pub expert_alignment: i32,
    pub expert_rows: i32,
    pub expert_output_weighted: i32,
    pub scale_layout: i32,
    pub dispatch_wire: i32,
    pub combine_wire: i32,
    pub wire_scale: i32,
    pub dispatch_dequantize: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_ep_config_t {
    pub struct_size: u32,
    pub backend: i32,
    pub num_sms: i32,
    pub timeout_ms: i32,
    pub device: i32,
    pub zero_copy_combine: i32,
    pub micro_batches: i32,
    pub failure_policy: i32,
    pub rejoin: i32,
    pub store_address: *const c_char,
    pub store_prefix: *const c_char,
}

impl Default for moe_ep_config_t {
    /// All zero, the strings NULL: what `moe_ep_config_init` then fills.
    fn default() -> Self {
        Self {
            struct_size: 0,
            backend: 0,
            num_sms: 0,
            timeout_ms: 0,
            device: 0,
            zero_copy_combine: 0,
            micro_batches: 0,
            failure_policy: 0,
            rejoin: 0,
            store_address: std::ptr::null(),
            store_prefix: std::ptr::null(),
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct moe_ep_dispatch_args_t {
    pub struct_size: u32,
    pub hidden_states: *const moe_ep_tensor_t,
    pub topk_ids: *const moe_ep_tensor_t,
    pub topk_weights: *const moe_ep_tensor_t,
    pub hidden_states_scale: *const moe_ep_tensor_t,
    pub runtime_max_tokens_per_rank: i32,
    pub eplb_local_stats: *const moe_ep_tensor_t,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct moe_ep_dispatch_result_t {
    pub struct_size: u32,
    pub tokens_per_rank: i32,
    pub hidden_states: moe_ep_tensor_t,
    pub topk_ids: moe_ep_tensor_t,
    pub topk_weights: moe_ep_tensor_t,
    pub hidden_states_scale: moe_ep_tensor_t,
    pub recv_counts: moe_ep_tensor_t,
    pub local_expert_counts: moe_ep_tensor_t,
    pub eplb_gathered_stats: moe_ep_tensor_t,
    pub combine_input: moe_ep_tensor_t,
    pub expert_counts: moe_ep_tensor_t,
    pub expert_offsets: moe_ep_tensor_t,
    pub row_sources: moe_ep_tensor_t,
    pub row_weights: moe_ep_tensor_t,
    pub dropped_pairs: moe_ep_tensor_t,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct moe_ep_combine_result_t {
    pub struct_size: u32,
    pub output: moe_ep_tensor_t,
}

/// What `moe_ep_poll_health` reports; `moe_ep_health_init` sets `failed_rank = -1`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct moe_ep_health_t {
    pub struct_size: u32,
    /// SUCCESS, or the sticky status that broke the handle (its message in `moe_ep_last_error`).
    pub status: moe_ep_status_t,
    /// The peer a timeout named; -1 when none is known.
    pub failed_rank: i32,
    /// Ranks active in the current mask.
    pub active_count: i32,
    /// 0 at create, +1 per `moe_ep_set_active_ranks`.
    pub mask_epoch: u64,
}

/// Opaque handle.
#[repr(C)]
pub struct moe_ep_handle_s {
    _private: [u8; 0],
}
pub type moe_ep_handle_t = *mut moe_ep_handle_s;

/// Opaque store server (`moe_ep_store_serve`).
#[repr(C)]
pub struct moe_ep_store_s {
    _private: [u8; 0],
}
pub type moe_ep_store_t = *mut moe_ep_store_s;

unsafe extern "C" {
    pub fn moe_ep_status_string(status: moe_ep_status_t) -> *const c_char;
    pub fn moe_ep_last_error() -> *const c_char;
    pub fn moe_ep_get_version(major: *mut i32, minor: *mut i32, patch: *mut i32) -> moe_ep_status_t;

    pub fn moe_ep_bootstrap_init(bootstrap: *mut moe_ep_bootstrap_t, struct_size: usize) -> moe_ep_status_t;
    pub fn moe_ep_params_init(params: *mut moe_ep_params_t, struct_size: usize) -> moe_ep_status_t;
    pub fn moe_ep_config_init(config: *mut moe_ep_config_t, struct_size: usize) -> moe_ep_status_t;
    pub fn moe_ep_dispatch_args_init(args: *mut moe_ep_dispatch_args_t, struct_size: usize) -> moe_ep_status_t;
    pub fn moe_ep_dispatch_result_init(result: *mut moe_ep_dispatch_result_t, struct_size: usize) -> moe_ep_status_t;
    pub fn moe_ep_combine_result_init(result: *mut moe_ep_combine_result_t, struct_size: usize) -> moe_ep_status_t;
    pub fn moe_ep_health_init(health: *mut moe_ep_health_t, struct_size: usize) -> moe_ep_status_t;

    pub fn moe_ep_is_platform_supported(device: i32, supported: *mut i32) -> moe_ep_status_t;
    pub fn moe_ep_workspace_size(params: *const moe_ep_params_t, config: *const moe_ep_config_t,
                                 world_size: i32, bytes: *mut u64) -> moe_ep_status_t;
    pub fn moe_ep_create(bootstrap: *const moe_ep_bootstrap_t, params: *const moe_ep_params_t,
                         config: *const moe_ep_config_t, handle: *mut moe_ep_handle_t) -> moe_ep_status_t;
    pub fn moe_ep_dispatch(handle: moe_ep_handle_t, args: *const moe_ep_dispatch_args_t,
                           result: *mut moe_ep_dispatch_result_t, stream: *mut c_void) -> moe_ep_status_t;
    pub fn moe_ep_combine(handle: moe_ep_handle_t, expert_output: *const moe_ep_tensor_t,
                          output: *const moe_ep_tensor_t, result: *mut moe_ep_combine_result_t,
                          stream: *mut c_void) -> moe_ep_status_t;
    /// Split phases: `slot` in 0 .. config.micro_batches - 1 (see moe_ep_c.h).
    pub fn moe_ep_dispatch_send(handle: moe_ep_handle_t, slot: i32, args: *const moe_ep_dispatch_args_t,
                                stream: *mut c_void) -> moe_ep_status_t;
    pub fn moe_ep_dispatch_recv(handle: moe_ep_handle_t, slot: i32, result: *mut moe_ep_dispatch_result_t,
                                stream: *mut c_void) -> moe_ep_status_t;
    pub fn moe_ep_combine_send(handle: moe_ep_handle_t, slot: i32, expert_output: *const moe_ep_tensor_t,
                               stream: *mut c_void) -> moe_ep_status_t;
    pub fn moe_ep_combine_recv(handle: moe_ep_handle_t, slot: i32, output: *const moe_ep_tensor_t,
                               result: *mut moe_ep_combine_result_t, stream: *mut c_void) -> moe_ep_status_t;
    pub fn moe_ep_get_backend(handle: moe_ep_handle_t, backend: *mut i32) -> moe_ep_status_t;
    pub fn moe_ep_get_last_path(handle: moe_ep_handle_t, phase: i32, path: *mut i32) -> moe_ep_status_t;
    /// A static string: "dispatch_small", ...; "unknown" for other values.
    pub fn moe_ep_path_name(path: i32) -> *const c_char;
    pub fn moe_ep_get_async_error(handle: moe_ep_handle_t, status: *mut moe_ep_status_t) -> moe_ep_status_t;
    /// Host memory only, never blocks; writes `health` up to its `struct_size`.
    pub fn moe_ep_poll_health(handle: moe_ep_handle_t, health: *mut moe_ep_health_t) -> moe_ep_status_t;
    /// `active[0 .. world_size)`: 1 active, 0 inactive; `world_size` must be the handle's.
    pub fn moe_ep_get_active_ranks(handle: moe_ep_handle_t, active: *mut u8, world_size: i32) -> moe_ep_status_t;
    /// Collective, every rank passing the same mask; between pairs only.
    pub fn moe_ep_set_active_ranks(handle: moe_ep_handle_t, active: *const u8, world_size: i32) -> moe_ep_status_t;
    pub fn moe_ep_destroy(handle: *mut moe_ep_handle_t) -> moe_ep_status_t;

    /// Listens on `host:port` (`host` NULL = every interface, `port` 0 = any free port).
    pub fn moe_ep_store_serve(host: *const c_char, port: i32, store: *mut moe_ep_store_t) -> moe_ep_status_t;
    pub fn moe_ep_store_port(store: moe_ep_store_t, port: *mut i32) -> moe_ep_status_t;
    /// Stops the server and sets `*store` to NULL; NULL is a no-op.
    pub fn moe_ep_store_destroy(store: *mut moe_ep_store_t) -> moe_ep_status_t;
    /// Fills `bootstrap` (its `struct_size` from `moe_ep_bootstrap_init`, the full size) with the
    /// library's callbacks over the store at `address` ("host:port") under `prefix`.
    pub fn moe_ep_bootstrap_from_store(address: *const c_char, prefix: *const c_char, rank: i32, world_size: i32,
                                       timeout_ms: i32, bootstrap: *mut moe_ep_bootstrap_t) -> moe_ep_status_t;
    /// Releases a bootstrap from `moe_ep_bootstrap_from_store`; one already released is a no-op.
    pub fn moe_ep_bootstrap_release(bootstrap: *mut moe_ep_bootstrap_t) -> moe_ep_status_t;
}

// The Open MPI bootstrap adapter (`include/moe_ep_mpi.h`), exported by
// libmoe_ep_mpi.so; declared and linked only with the `mpi` feature.
#[cfg(feature = "mpi")]
unsafe extern "C" {
    /// `mpi_comm` points at an `MPI_Comm` of the MPI libmoe_ep_mpi was built with;
    /// `struct_size`: `size_of::<moe_ep_bootstrap_t>()`, checked before the
    /// communicator is duplicated (the rule of `moe_ep_bootstrap_init`).
    pub fn moe_ep_mpi_bootstrap_init(mpi_comm: *const c_void, bootstrap: *mut moe_ep_bootstrap_t,
                                     struct_size: usize) -> moe_ep_status_t;
    /// The communicator's Fortran handle (`MPI_Comm_c2f`).
    pub fn moe_ep_mpi_bootstrap_init_fint(mpi_fint: i32, bootstrap: *mut moe_ep_bootstrap_t,
                                          struct_size: usize) -> moe_ep_status_t;
    pub fn moe_ep_mpi_bootstrap_release(bootstrap: *mut moe_ep_bootstrap_t) -> moe_ep_status_t;
}
