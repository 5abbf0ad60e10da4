/*
 * moe_ep_c.h -- the stable C ABI of libmoe_ep.
 *
 * moe_ep moves Mixture-of-Experts tokens between the GPUs of an
 * expert-parallel (EP) group:
 *   dispatch  sends every token to each rank that owns at least one of its
 *             selected experts (once per rank, never once per expert);
 *   combine   brings each rank's already weighted, locally reduced expert
 *             output back to the token's source rank and sums it over ranks.
 *
 * Conventions that hold for the whole header:
 *   - C99 and C++ clean; only <stdint.h> and <stddef.h>; no CUDA header.
 *     A stream is passed as `void*` holding a `cudaStream_t` (NULL = the
 *     legacy default stream).
 *   - Every function returns a moe_ep_status_t.  On failure a thread-local
 *     message naming the argument, the expected and the actual value can be
 *     read with moe_ep_last_error().  No C++ exception ever crosses the ABI.
 *   - Every public struct starts with `uint32_t struct_size`.  Fill it with the
 *     matching exported *_init() function (FFI users cannot expand macros),
 *     passing the size of the struct as the caller's header declares it:
 *     moe_ep_config_init(&config, sizeof config).  An *_init() writes exactly
 *     that many bytes: the defaults of the fields this library knows, zero
 *     beyond them, and struct_size = the size passed.
 *     A smaller struct written against an older header is accepted and its
 *     missing tail takes the defaults; a larger one from a newer header is
 *     accepted only if the bytes this library does not know are all zero.
 *     struct_size must end on a field boundary of a released layout of the
 *     struct, at or past the end of its first released layout (or be a newer,
 *     larger size: a multiple of the struct's alignment, at most 1024); any
 *     other value is INVALID_ARGUMENT naming the struct.
 *     Output structs are written up to the caller's struct_size only.
 *   - Enumerations are stored in structs as int32_t.  There is no `bool`:
 *     flags are int32_t, 0 = off, anything else = on.
 *   - Collective calls (create, destroy, dispatch, combine) must be made by
 *     every rank of the group, in the same order.
 *   - Threading: the free functions are thread safe.  A handle is used by one
 *     thread at a time; different handles may be used from different threads.
 */
#ifndef MOE_EP_C_H
#define MOE_EP_C_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MOE_EP_API
#elif defined(__GNUC__)
#define MOE_EP_API __attribute__((visibility("default")))
#else
#define MOE_EP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                   */
/* ------------------------------------------------------------------------ */

#define MOE_EP_VERSION_MAJOR 0
#define MOE_EP_VERSION_MINOR 1
#define MOE_EP_VERSION_PATCH 0
/* MAJOR*10000 + MINOR*100 + PATCH */
#define MOE_EP_VERSION_CODE \
  (MOE_EP_VERSION_MAJOR * 10000 + MOE_EP_VERSION_MINOR * 100 + MOE_EP_VERSION_PATCH)

/* ------------------------------------------------------------------------ */
/* Status codes                                                              */
/* ------------------------------------------------------------------------ */

typedef int32_t moe_ep_status_t;

enum {
  MOE_EP_SUCCESS = 0,
  MOE_EP_ERROR_INVALID_ARGUMENT = 1, /* a host-side argument is wrong         */
  MOE_EP_ERROR_UNSUPPORTED = 2,      /* valid, but not on this platform/build */
  MOE_EP_ERROR_CUDA = 3,             /* a CUDA runtime or driver call failed   */
  MOE_EP_ERROR_BOOTSTRAP = 4,        /* a bootstrap callback failed            */
  MOE_EP_ERROR_OUT_OF_MEMORY = 5,    /* host or device allocation failed       */
  MOE_EP_ERROR_TIMEOUT = 6,          /* a peer did not answer in timeout_ms    */
  MOE_EP_ERROR_INVALID_STATE = 7,    /* call out of order, or handle unusable  */
  MOE_EP_ERROR_INVALID_INPUT = 8,    /* bad device-side data (e.g. expert ids) */
  MOE_EP_ERROR_INTERNAL = 9          /* a bug in moe_ep: please report it      */
};

/* Static, never-NULL name of a status ("MOE_EP_ERROR_TIMEOUT"). */
MOE_EP_API const char* moe_ep_status_string(moe_ep_status_t status);

/* The message of the last failing call made by this thread ("" if none).
 * The pointer stays valid until the next moe_ep call on this thread. */
MOE_EP_API const char* moe_ep_last_error(void);

/* Sets this thread's last-error message (NULL or "" clears it); always SUCCESS.
 * For bootstrap callbacks and companion libraries: a callback that fails may
 * call it before returning non-zero, and moe_ep appends the message to its own
 * ("bootstrap->allgather(...) returned 5 on rank 1: <your message>"). */
MOE_EP_API moe_ep_status_t moe_ep_set_last_error(const char* message);

/* Runtime library version; any pointer may be NULL. */
MOE_EP_API moe_ep_status_t moe_ep_get_version(int32_t* major, int32_t* minor, int32_t* patch);

/* ------------------------------------------------------------------------ */
/* Tensors: binary-identical to DLPack's DLTensor                            */
/* ------------------------------------------------------------------------ */

/* DLPack device types (DLDeviceType). */
enum {
  MOE_EP_DEVICE_CPU = 1,      /* kDLCPU      */
  MOE_EP_DEVICE_CUDA = 2,     /* kDLCUDA     */
  MOE_EP_DEVICE_CUDA_HOST = 3 /* kDLCUDAHost */
};

/* DLPack dtype codes (DLDataTypeCode), DLPack 1.1 numbering. */
enum {
  MOE_EP_DTYPE_INT = 0,
  MOE_EP_DTYPE_UINT = 1,
  MOE_EP_DTYPE_FLOAT = 2,
  MOE_EP_DTYPE_BFLOAT = 4,
  MOE_EP_DTYPE_FLOAT8_E4M3FN = 10,
  MOE_EP_DTYPE_FLOAT8_E5M2 = 12,
  MOE_EP_DTYPE_FLOAT4_E2M1FN = 17
};

typedef struct moe_ep_device_t {
  int32_t device_type; /* MOE_EP_DEVICE_* (DLDevice.device_type) */
  int32_t device_id;   /* CUDA ordinal, 0 for the CPU           */
} moe_ep_device_t;

typedef struct moe_ep_dtype_t {
  uint8_t code;   /* MOE_EP_DTYPE_*   */
  uint8_t bits;   /* 4, 8, 16, 32, 64 */
  uint16_t lanes; /* 1                */
} moe_ep_dtype_t;

/* Same layout as DLTensor: a DLTensor* may be passed where a
 * const moe_ep_tensor_t* is expected, and vice versa. */
typedef struct moe_ep_tensor_t {
  void* data;
  moe_ep_device_t device;
  int32_t ndim;
  moe_ep_dtype_t dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; NULL = compact row-major */
  uint64_t byte_offset;
} moe_ep_tensor_t;

/* ------------------------------------------------------------------------ */
/* Bootstrap: how ranks exchange a few bytes at create and destroy            */
/* ------------------------------------------------------------------------ */

/* Gather `bytes_per_rank` bytes from every rank: rank r's `send` lands at
 * recv + r*bytes_per_rank on every rank.  Blocking.  Returns 0 on success. */
typedef int32_t (*moe_ep_allgather_fn)(void* ctx, const void* send, void* recv,
                                       size_t bytes_per_rank);
/* Blocks until every rank has entered it.  Returns 0 on success. */
typedef int32_t (*moe_ep_barrier_fn)(void* ctx);

/* The struct is copied by moe_ep_create, but ctx and the callbacks must stay
 * valid until every handle created from it is destroyed: the HOST backend moves
 * data with them on every call, and destroy may call barrier.
 *
 * Waits: with world_size > 1, the allgathers of moe_ep_create's agreement steps
 * and of every HOST dispatch/combine run on a thread owned by the handle, and
 * the calling thread waits for each at most config->timeout_ms (TIMEOUT).  A
 * callback that never returns is then left running on that thread: destroy does
 * not wait for it, and it keeps using ctx until it returns, so keep ctx valid
 * (or make the callbacks return, e.g. by aborting the launcher's collective)
 * until then.  With world_size == 1 the callbacks run on the calling thread.
 * Everything a peer sends through the callbacks is checked before use; a
 * mismatch (counts, sizes, a differing runtime_max_tokens_per_rank) is
 * INVALID_INPUT. */
typedef struct moe_ep_bootstrap_t {
  uint32_t struct_size;
  int32_t rank;       /* this process's rank in the EP group, 0..world_size-1 */
  int32_t world_size; /* number of ranks (the EP size)                         */
  void* ctx;          /* passed back to the callbacks untouched                */
  moe_ep_allgather_fn allgather;
  moe_ep_barrier_fn barrier;
} moe_ep_bootstrap_t;

/* Zeroes the struct and sets struct_size; rank = 0, world_size = 0.
 * struct_size: sizeof(moe_ep_bootstrap_t) of the caller's header. */
MOE_EP_API moe_ep_status_t moe_ep_bootstrap_init(moe_ep_bootstrap_t* bootstrap, size_t struct_size);

/* ------------------------------------------------------------------------ */
/* Parameters and configuration                                              */
/* ------------------------------------------------------------------------ */

typedef struct moe_ep_params_t {
  uint32_t struct_size;
  int32_t num_experts;         /* > 0, divisible by world_size                 */
  int32_t top_k;               /* 1..num_experts                               */
  int32_t max_tokens_per_rank; /* > 0: largest local_num_tokens of any call    */
  int32_t hidden_size;         /* > 0: elements per row of combine's tensors   */
  /* Dispatch payload.  Rows travel as opaque bytes, so fp8 or packed fp4 work:
   * a row is hidden_row_elems elements of hidden_dtype.                       */
  moe_ep_dtype_t hidden_dtype; /* default bf16                                 */
  int32_t hidden_row_elems;    /* 0 (default) = hidden_size                    */
  /* Optional per-row scales (hidden_states_scale), row-aligned with hidden.   */
  int32_t scale_row_elems;     /* 0 (default) = no scales                      */
  moe_ep_dtype_t scale_dtype;  /* default fp32                                 */
  int32_t invalid_expert_id;   /* default -1; must lie outside [0,num_experts) */
  int32_t enable_eplb_stats;   /* default 0; 1 = produce eplb_gathered_stats   */
  moe_ep_dtype_t combine_dtype;/* dtype of combine's expert_output and output:
                                  bf16 (default), fp16 or fp32                 */
  /* Receive layout (docs/semantics.md, "Receive layouts").  Every field below
   * must be the same on every rank; a field of a layout not chosen must be 0.
   * Every backend has every layout.                                          */
  int32_t receive_layout;         /* MOE_EP_LAYOUT_*, default RANK_MAJOR          */
  int32_t expert_capacity;        /* EXPERT_MAJOR: rows per local expert, 1 ..
                                     world_size * max_tokens_per_rank; 0 (default)
                                     = world_size * max_tokens_per_rank           */
  int32_t expert_alignment;       /* EXPERT_PACKED: every expert's first row is a
                                     multiple of it, 1..256; 0 (default) = 1      */
  int32_t expert_rows;            /* EXPERT_PACKED: rows of the result, alignment
                                     padding included, a multiple of
                                     expert_alignment; 0 (default) = the worst
                                     case (docs/semantics.md)                     */
  int32_t expert_output_weighted; /* expert layouts: 0 (default) = combine
                                     multiplies each row by its pick's weight;
                                     1 = the expert output already carries them */
  int32_t scale_layout;           /* expert layouts with scales: MOE_EP_SCALES_*  */
  /* Low-precision wire (docs/semantics.md, "A low-precision wire").  Every
   * field below must be the same on every rank.  Every backend has every
   * format.                                                                  */
  int32_t dispatch_wire;       /* MOE_EP_WIRE_*, default AS_IS; FP8 needs a
                                  bf16, fp16 or fp32 hidden_dtype and
                                  scale_row_elems 0 (the library makes the
                                  scales)                                    */
  int32_t combine_wire;        /* MOE_EP_WIRE_*, default AS_IS               */
  int32_t wire_scale;          /* MOE_EP_WIRE_SCALE_*, with an FP8 wire only */
  int32_t dispatch_dequantize; /* dispatch_wire FP8: 0 (default) = the result
                                  holds e4m3 rows [P, R] and fp32 scales
                                  [P, ceil(R / 128)]; 1 = rows dequantized
                                  back to hidden_dtype, no scales           */
} moe_ep_params_t;

/* params->dispatch_wire and params->combine_wire: what crosses between ranks. */
enum {
  MOE_EP_WIRE_AS_IS = 0,            /* the rows as they are (default)            */
  MOE_EP_WIRE_FP8_E4M3_BLOCK128 = 1 /* float8 e4m3fn values, one fp32 scale per
                                       128 elements of a row (the last block of
                                       a row may be shorter)                    */
};

/* params->wire_scale: how an FP8 wire picks a block's scale from its amax. */
enum {
  MOE_EP_WIRE_SCALE_FP32 = 0, /* amax / 448 in fp32 (default)                   */
  MOE_EP_WIRE_SCALE_UE8M0 = 1 /* the power of two at or above amax / 448       */
};

/* params->receive_layout: how dispatch lays out the received rows. */
enum {
  MOE_EP_LAYOUT_RANK_MAJOR = 0,   /* [world_size * tokens_per_rank, R]: one row per
                                     received token, segments by source rank   */
  MOE_EP_LAYOUT_EXPERT_MAJOR = 1, /* [E_local, expert_capacity, R]: one row per
                                     (token, local pick), a segment per expert  */
  MOE_EP_LAYOUT_EXPERT_PACKED = 2 /* [expert_rows, R]: expert e's rows at
                                     [expert_offsets[e], + expert_counts[e]),
                                     offsets aligned to expert_alignment rows  */
};

/* params->scale_layout (expert layouts, scale_row_elems > 0). */
enum {
  MOE_EP_SCALES_ROW_MAJOR = 0,   /* [rows, S], row-aligned with hidden_states    */
  MOE_EP_SCALES_COLUMN_MAJOR = 1 /* fp32 only: [S, rows_aligned] (EXPERT_PACKED)
                                    or [E_local, S, capacity_aligned]
                                    (EXPERT_MAJOR), rows rounded up to a
                                    multiple of 4 (16 bytes): the TMA-aligned
                                    layout grouped FP8 GEMMs read              */
};

/* Fills the defaults; struct_size: sizeof(moe_ep_params_t) of the caller's header. */
MOE_EP_API moe_ep_status_t moe_ep_params_init(moe_ep_params_t* params, size_t struct_size);

enum {
  MOE_EP_BACKEND_AUTO = 0,             /* NVLINK_TWO_SIDED when every rank supports
                                          it on one host, else NCCL when it loads on
                                          every rank with a GPU, else HOST; agreed
                                          over all ranks (MOE_EP_LOG=info logs it)  */
  MOE_EP_BACKEND_NVLINK_TWO_SIDED = 1, /* GPUs of one NVLink domain                */
  MOE_EP_BACKEND_HOST = 2,             /* CPU tensors over the bootstrap           */
  MOE_EP_BACKEND_NCCL = 3              /* CUDA tensors over NCCL, loaded at run time
                                          (libnccl.so.2, or MOE_EP_NCCL_LIBRARY):
                                          several nodes, GPUs without NVLink       */
};

typedef struct moe_ep_config_t {
  uint32_t struct_size;
  int32_t backend;    /* MOE_EP_BACKEND_*, default AUTO                        */
  int32_t num_sms;    /* SMs the kernels may use; 0 (default) = choose         */
  int32_t timeout_ms; /* > 0, default 30000.  Bounds each wait for a peer:
                         any backend: each bootstrap exchange of create's
                         agreement steps; HOST: each exchange of dispatch
                         (two) and combine (one); NVLINK_TWO_SIDED: each
                         device-side wait of the kernels, and create's fd
                         exchange.  Not bounded by
                         it: bootstrap calls made on the calling thread (with
                         world_size == 1, and the NVLink backend's create-time
                         calls other than the fd exchange).  Expiry: TIMEOUT,
                         and the handle is unusable (destroy it), unless
                         failure_policy is MASK (below).                     */
  int32_t device;     /* CUDA ordinal; -1 (default) = the current device       */
  int32_t zero_copy_combine; /* 0 (default) = off, else on: every dispatch result holds
                         combine_input, a [P, hidden_size] combine_dtype view
                         of the workspace that the expert computation may
                         write its output into and pass to combine as
                         expert_output (no copy).  The view holds world_size *
                         max_tokens_per_rank * hidden_size combine_dtype
                         elements; on NVLINK_TWO_SIDED it replaces the push
                         combine's landing rows, so the workspace grows by
                         max_tokens_per_rank rows only (moe_ep_workspace_size
                         counts it).  Must be the same on every rank.  On
                         NVLINK_TWO_SIDED combine then pulls each peer's rows
                         from the peer's view; an expert_output elsewhere is
                         first copied into this rank's view on the stream. */
  int32_t micro_batches;     /* 1 (default; 0 is read as 1) or 2: buffer slots, one
                             dispatch/combine pair in flight per slot, for the
                             split calls below (docs/overlap.md).  Each slot has
                             its own result buffers; moe_ep_workspace_size counts
                             them.  Must be the same on every rank.  Every
                             backend takes 2.                                     */
  /* What a peer that stops answering does to the handle (docs/reliability.md,
   * "Surviving a dead rank").  MOE_EP_ON_FAILURE_* (below); must be the same on
   * every rank.                                                               */
  int32_t failure_policy;    /* 0 = MOE_EP_ON_FAILURE_FAIL_HANDLE (default): TIMEOUT,
                                the handle is unusable.  MOE_EP_ON_FAILURE_MASK
                                (HOST and NVLINK_TWO_SIDED): the survivors drop
                                the failed rank from the active-rank mask
                                through the store at store_address and go on;
                                needs store_address.                             */
  int32_t rejoin;            /* 0 (default), or 1: this process replaces a failed
                                rank of a running MASK group (HOST or
                                NVLINK_TWO_SIDED; backend AUTO takes the
                                group's).  moe_ep_create then
                                reads only rank and world_size of the bootstrap
                                (its callbacks may be NULL: the group is met
                                through the store) and returns once the
                                survivors admit it with moe_ep_set_active_ranks. */
  const char* store_address; /* "host:port" of a moe_ep store (moe_ep_store_serve);
                                NULL (default) = none.  Copied by create.      */
  const char* store_prefix;  /* the group's name in the store; NULL (default) =
                                "moe_ep".  Groups that share a store need
                                distinct prefixes; a replacement uses its
                                group's prefix.                                */
} moe_ep_config_t;

/* Fills the defaults; struct_size: sizeof(moe_ep_config_t) of the caller's header. */
MOE_EP_API moe_ep_status_t moe_ep_config_init(moe_ep_config_t* config, size_t struct_size);

/* ------------------------------------------------------------------------ */
/* Dispatch and combine arguments and results                                */
/* ------------------------------------------------------------------------ */

/* T = local_num_tokens (may differ per rank, may be 0), K = top_k,
 * R = hidden_row_elems, S = scale_row_elems, E = num_experts.
 * All tensors live on the handle's device (CUDA backend) or on the CPU (HOST),
 * and are compact row-major (strides NULL or equal to the compact ones). */
typedef struct moe_ep_dispatch_args_t {
  uint32_t struct_size;
  const moe_ep_tensor_t* hidden_states;       /* [T, R] hidden_dtype, required      */
  const moe_ep_tensor_t* topk_ids;            /* [T, K] int32, required             */
  const moe_ep_tensor_t* topk_weights;        /* [T, K] fp32, optional (NULL)       */
  const moe_ep_tensor_t* hidden_states_scale; /* [T, S] scale_dtype; required iff S>0 */
  int32_t runtime_max_tokens_per_rank;        /* 0 = max_tokens_per_rank; else the
                                                 same value on every rank, >= every
                                                 rank's T, <= max_tokens_per_rank    */
  const moe_ep_tensor_t* eplb_local_stats;    /* [E] int32, optional; when NULL and
                                                 eplb stats are on, the library counts
                                                 the valid picks of topk_ids         */
} moe_ep_dispatch_args_t;

/* Zeroes the struct; struct_size: sizeof(moe_ep_dispatch_args_t) of the caller's header. */
MOE_EP_API moe_ep_status_t moe_ep_dispatch_args_init(moe_ep_dispatch_args_t* args, size_t struct_size);

/* P = world_size * tokens_per_rank receive rows, rank-major: rows
 * [s*tokens_per_rank, s*tokens_per_rank + recv_counts[s]) hold the tokens that
 * rank s sent here in ascending source token order; the other rows of each
 * segment are padding (topk_ids all invalid_expert_id, topk_weights 0).
 * Absent results have data == NULL and ndim == 0.  The views (and their shape
 * arrays) are owned by the handle and stay valid until the matching combine is
 * issued.  They live in the handle's device memory (CUDA) or host memory (HOST). */
typedef struct moe_ep_dispatch_result_t {
  uint32_t struct_size;
  int32_t tokens_per_rank;
  moe_ep_tensor_t hidden_states;        /* [P, R]                                  */
  moe_ep_tensor_t topk_ids;             /* [P, K] int32, global ids; picks owned by
                                           other ranks = invalid_expert_id         */
  moe_ep_tensor_t topk_weights;         /* [P, K] fp32, if weights were given      */
  moe_ep_tensor_t hidden_states_scale;  /* [P, S], if S > 0                         */
  moe_ep_tensor_t recv_counts;          /* [world_size] int32                      */
  moe_ep_tensor_t local_expert_counts;  /* [E / world_size] int32: received
                                           (row, pick) pairs per local expert      */
  moe_ep_tensor_t eplb_gathered_stats;  /* [world_size, E] int32, if eplb stats on */
  moe_ep_tensor_t combine_input;        /* [P, hidden_size] combine_dtype, if the
                                           handle was created with
                                           config->zero_copy_combine: write the
                                           expert output here and pass this view
                                           (or an equal tensor: same address,
                                           [P, H] or [world_size, tokens_per_rank,
                                           H]) as combine's expert_output.  Its
                                           contents are undefined after dispatch;
                                           valid until the matching combine is
                                           issued, like the other views.  In an
                                           expert layout: [E_local, capacity, H]
                                           or [expert_rows, H]                   */
  /* Expert layouts only (params->receive_layout != RANK_MAJOR; absent
   * otherwise).  Then hidden_states is [E_local, capacity, R] (EXPERT_MAJOR)
   * or [expert_rows, R] (EXPERT_PACKED), hidden_states_scale follows
   * params->scale_layout, and topk_ids and topk_weights are absent.  A row is
   * one (source token, pick of a local expert); inside an expert, rows are in
   * ascending (source rank, source token, pick) order.                       */
  moe_ep_tensor_t expert_counts;  /* [E_local] int32: rows written per local
                                     expert (received pairs that fit)     */
  moe_ep_tensor_t expert_offsets; /* [E_local + 1] int32, EXPERT_PACKED only:
                                     expert e's first row; [E_local] = the
                                     aligned total                        */
  moe_ep_tensor_t row_sources;    /* [rows, 3] int32: source rank, source
                                     token, pick index; -1 on padding rows */
  moe_ep_tensor_t row_weights;    /* [rows] fp32: the pick's weight (1.0 when
                                     dispatch had no topk_weights), 0 on
                                     padding rows                          */
  moe_ep_tensor_t dropped_pairs;  /* [1] int32: pairs that did not fit the
                                     capacity (or expert_rows): counted,
                                     never written, not an error           */
} moe_ep_dispatch_result_t;

/* Zeroes the struct; struct_size: sizeof(moe_ep_dispatch_result_t) of the caller's header. */
MOE_EP_API moe_ep_status_t moe_ep_dispatch_result_init(moe_ep_dispatch_result_t* result,
                                                       size_t struct_size);

typedef struct moe_ep_combine_result_t {
  uint32_t struct_size;
  moe_ep_tensor_t output; /* [T, hidden_size] combine_dtype, T of the matching
                             dispatch; the caller's tensor, or library-owned memory
                             valid until the next combine on this handle         */
} moe_ep_combine_result_t;

/* Zeroes the struct; struct_size: sizeof(moe_ep_combine_result_t) of the caller's header. */
MOE_EP_API moe_ep_status_t moe_ep_combine_result_init(moe_ep_combine_result_t* result,
                                                      size_t struct_size);

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct moe_ep_handle_s* moe_ep_handle_t;

/* Whether the NVLINK_TWO_SIDED backend can run on CUDA device `device`.
 * Local: no collective, no allocation that outlives the call.  Returns
 * SUCCESS with *supported = 0 where there is no GPU or no driver. */
MOE_EP_API moe_ep_status_t moe_ep_is_platform_supported(int32_t device, int32_t* supported);

/* Bytes of memory create will allocate per rank for these arguments (device
 * memory for the CUDA backend, host memory for HOST).  Local, no allocation.
 * config may be NULL (defaults). */
MOE_EP_API moe_ep_status_t moe_ep_workspace_size(const moe_ep_params_t* params,
                                                 const moe_ep_config_t* config,
                                                 int32_t world_size, uint64_t* bytes);

/* Collective.  Validates everything, agrees on the backend and parameters with
 * every rank (a mismatch fails on every rank), allocates and maps the
 * workspace.  config may be NULL (defaults).  On failure *handle is NULL. */
MOE_EP_API moe_ep_status_t moe_ep_create(const moe_ep_bootstrap_t* bootstrap,
                                         const moe_ep_params_t* params,
                                         const moe_ep_config_t* config,
                                         moe_ep_handle_t* handle);

/* Collective, stream-ordered, no host synchronisation (CUDA-graph capturable
 * with a fixed tokens_per_rank).  Invalid arguments return INVALID_ARGUMENT
 * before anything is launched; the handle stays usable. */
MOE_EP_API moe_ep_status_t moe_ep_dispatch(moe_ep_handle_t handle,
                                           const moe_ep_dispatch_args_t* args,
                                           moe_ep_dispatch_result_t* result,
                                           void* stream);

/* Collective, stream-ordered.  expert_output: [P, hidden_size] or
 * [world_size, tokens_per_rank, hidden_size] combine_dtype, row i holding the
 * output for receive row i of the matching dispatch (in an expert layout:
 * [E_local, capacity, hidden_size] or [E_local * capacity, hidden_size]
 * (EXPERT_MAJOR), [expert_rows, hidden_size] (EXPERT_PACKED), unweighted
 * unless params->expert_output_weighted; combine applies the weights and sums
 * a token's rows on each rank in ascending local-expert order in fp32).  output: [T, hidden_size]
 * combine_dtype, or NULL for library-owned memory.  Sums over ranks in
 * ascending rank order with fp32 accumulation: bitwise reproducible.
 * expert_output may be the dispatch result's combine_input view (zero-copy
 * combine input, same results bitwise as a copy of it); a tensor that overlaps
 * that view without starting at its address is INVALID_ARGUMENT. */
MOE_EP_API moe_ep_status_t moe_ep_combine(moe_ep_handle_t handle,
                                          const moe_ep_tensor_t* expert_output,
                                          const moe_ep_tensor_t* output,
                                          moe_ep_combine_result_t* result,
                                          void* stream);

/* Split phases (docs/overlap.md).  Each of dispatch and combine in two halves:
 * a send half that returns once the rows are on their way, and a receive half
 * that waits (bounded by timeout_ms) and produces the results, the same bits as
 * the fused call.  moe_ep_dispatch is exactly dispatch_send + dispatch_recv on
 * slot 0, moe_ep_combine combine_send + combine_recv on slot 0.  `slot` is the
 * micro-batch, 0 .. config->micro_batches - 1; each slot follows
 *   IDLE -dispatch_send-> DISPATCH_SENT -dispatch_recv-> DISPATCHED
 *        -combine_send-> COMBINE_SENT -combine_recv-> IDLE
 * and any other call on it is INVALID_STATE (nothing launched, the handle
 * stays usable).  Collective, stream-ordered, graph-capturable.  Dispatch
 * results of a slot stay valid until its combine_send is issued; a
 * library-owned combine output until the slot's next combine_recv.  Only the
 * HOST backend implements them yet: elsewhere they return UNSUPPORTED. */
MOE_EP_API moe_ep_status_t moe_ep_dispatch_send(moe_ep_handle_t handle, int32_t slot,
                                                const moe_ep_dispatch_args_t* args, void* stream);
MOE_EP_API moe_ep_status_t moe_ep_dispatch_recv(moe_ep_handle_t handle, int32_t slot, moe_ep_dispatch_result_t* result,
                                                void* stream);
/* expert_output as for moe_ep_combine; may be reused once the call's stream
 * work is done (the slot's combine_input view: until its next dispatch_send). */
MOE_EP_API moe_ep_status_t moe_ep_combine_send(moe_ep_handle_t handle, int32_t slot,
                                               const moe_ep_tensor_t* expert_output, void* stream);
/* output: [T, hidden_size] combine_dtype, or NULL for library-owned memory. */
MOE_EP_API moe_ep_status_t moe_ep_combine_recv(moe_ep_handle_t handle, int32_t slot, const moe_ep_tensor_t* output,
                                               moe_ep_combine_result_t* result, void* stream);

/* The backend this handle runs on (MOE_EP_BACKEND_NVLINK_TWO_SIDED, _HOST or
 * _NCCL): what AUTO chose, agreed on every rank.  Tells an application created
 * with AUTO where its tensors must live (CPU memory for HOST, the handle's
 * device otherwise).  Local, no synchronisation. */
MOE_EP_API moe_ep_status_t moe_ep_get_backend(moe_ep_handle_t handle, int32_t* backend);

/* Phases of a call, for moe_ep_get_last_path. */
enum {
  MOE_EP_PHASE_DISPATCH = 0,
  MOE_EP_PHASE_COMBINE = 1
};

/* The path a call took: the kernels and schedule the library chose for its
 * size, its tensors and the settings (docs/api.md, "Environment variables").
 * Results are the same on every path. */
enum {
  MOE_EP_PATH_NONE = 0,                        /* no call of that phase yet        */
  MOE_EP_PATH_HOST = 1,                        /* HOST backend                     */
  MOE_EP_PATH_NCCL = 2,                        /* NCCL backend                     */
  MOE_EP_PATH_DISPATCH_SMALL = 16,             /* NVLink small-batch kernel, rows
                                                  through registers                */
  MOE_EP_PATH_DISPATCH_SMALL_BULK = 17,        /* ... rows by bulk copies          */
  MOE_EP_PATH_DISPATCH_SCAN = 18,              /* general kernel routing by scan   */
  MOE_EP_PATH_DISPATCH_SCAN_BULK = 19,         /* ... rows by bulk copies          */
  MOE_EP_PATH_DISPATCH_LOOKBACK = 20,          /* general kernel routing by
                                                  look-back                        */
  MOE_EP_PATH_DISPATCH_LOOKBACK_BULK = 21,     /* ... rows by bulk copies          */
  MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE = 22,    /* small-batch kernel, FP8 dispatch
                                                  wire encoded as rows are sent */
  MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE = 23,     /* scan, the same               */
  MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE = 24, /* look-back, the same          */
  MOE_EP_PATH_COMBINE_SMALL_PUSH = 32,         /* NVLink small-batch push kernel   */
  MOE_EP_PATH_COMBINE_SERIAL_PUSH = 33,        /* push, then reduce                */
  MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH = 34,    /* reduce while the rows arrive     */
  MOE_EP_PATH_COMBINE_PULL_ROWS = 35,          /* zero-copy pull, whole rows per
                                                  bulk copy                        */
  MOE_EP_PATH_COMBINE_PULL_SEGMENTS = 36,      /* zero-copy pull, 2 KiB segments   */
  MOE_EP_PATH_COMBINE_PULL_REGISTERS = 37,     /* zero-copy pull through registers */
  MOE_EP_PATH_COMBINE_PULL_UNALIGNED = 38      /* zero-copy pull of rows that are
                                                  not 16-byte aligned              */
};

/* The path (MOE_EP_PATH_*) of this handle's last call of `phase`
 * (MOE_EP_PHASE_*) on this rank; MOE_EP_PATH_NONE before the first.  Also
 * logged, once per path, with MOE_EP_LOG=info.  Local, no synchronisation. */
MOE_EP_API moe_ep_status_t moe_ep_get_last_path(moe_ep_handle_t handle, int32_t phase, int32_t* path);

/* A path's name ("dispatch_small", ...; "unknown" for other values). */
MOE_EP_API const char* moe_ep_path_name(int32_t path);

/* Errors found on the device after a call returned (bad expert ids, timeouts).
 * Synchronises with the handle's outstanding work.  *status = SUCCESS if none;
 * otherwise the first error, its message in moe_ep_last_error().  Sticky:
 * after a TIMEOUT, CUDA_ERROR or INTERNAL (from this query, a dispatch or a
 * combine) the group may be out of step or the device state unknown, so every
 * later dispatch, combine and moe_ep_get_async_error of the handle returns
 * that first status and message (destroy still completes); INVALID_INPUT is
 * cleared once read. */
MOE_EP_API moe_ep_status_t moe_ep_get_async_error(moe_ep_handle_t handle,
                                                  moe_ep_status_t* status);

/* ------------------------------------------------------------------------ */
/* Health and the active-rank mask (docs/semantics.md, "Active ranks")       */
/* ------------------------------------------------------------------------ */

/* What moe_ep_poll_health reports. */
typedef struct moe_ep_health_t {
  uint32_t struct_size;
  moe_ep_status_t status; /* the handle's error state: SUCCESS, or the sticky
                             status that broke it (TIMEOUT, CUDA, INTERNAL),
                             its message in moe_ep_last_error().  Under
                             failure_policy MASK on NVLINK_TWO_SIDED also
                             TIMEOUT when a kernel gave up on a peer: the
                             results of the calls since are invalid, and the
                             handle's next call recovers (it returns TIMEOUT,
                             and the poll SUCCESS again)                   */
  int32_t failed_rank;    /* the peer a timeout named; -1 when none is known */
  int32_t active_count;   /* ranks active in the current mask             */
  uint64_t mask_epoch;    /* 0 at create, +1 per moe_ep_set_active_ranks   */
} moe_ep_health_t;

/* Zeroes the struct (failed_rank = -1); struct_size: sizeof(moe_ep_health_t)
 * of the caller's header. */
MOE_EP_API moe_ep_status_t moe_ep_health_init(moe_ep_health_t* health, size_t struct_size);

/* The handle's health, from host memory only: never synchronises with the
 * device, never waits for a peer, never blocks (a few loads; a server may call
 * it every step).  Reads the handle's sticky error and, on NVLINK_TWO_SIDED,
 * the host-mapped word the device's timeout watch writes, so a timeout a
 * kernel found is reported before any query synchronises; elsewhere it reports
 * what the host knows.  Device errors that only a synchronising query finds
 * (bad expert ids) are left to moe_ep_get_async_error.  Writes health up to
 * its struct_size.  Local; follows the handle's threading rule. */
MOE_EP_API moe_ep_status_t moe_ep_poll_health(moe_ep_handle_t handle, moe_ep_health_t* health);

/* config->failure_policy. */
enum {
  MOE_EP_ON_FAILURE_FAIL_HANDLE = 0, /* a dead peer: TIMEOUT, the handle is unusable  */
  MOE_EP_ON_FAILURE_MASK = 1         /* HOST, NVLINK_TWO_SIDED: a dead peer is
                                        masked out, the survivors go on (needs
                                        a store)                                 */
};

/* The store: a small key/value server over TCP that survivors of a failure
 * agree through when the launcher's own collectives (MPI) died with a rank.
 * Serve it from a process that outlives the ranks (a launcher, an
 * orchestrator, a supervisor): hosted inside a rank, it dies with that rank
 * and takes every survivor's handle with it.  The server runs on threads of
 * the calling process until moe_ep_store_destroy.  It trusts nothing it
 * receives: frames are bounded (keys <= 1 KiB, values <= 1 GiB) and checked
 * before use; a malformed or stalled frame closes that connection only.  It
 * has no authentication: bind it to an address only the job can reach. */
typedef struct moe_ep_store_s* moe_ep_store_t;

/* Listens on host:port (host: a name or address, NULL = every interface;
 * port 0 = any free port, see moe_ep_store_port). */
MOE_EP_API moe_ep_status_t moe_ep_store_serve(const char* host, int32_t port, moe_ep_store_t* store);
/* The port the store listens on. */
MOE_EP_API moe_ep_status_t moe_ep_store_port(moe_ep_store_t store, int32_t* port);
/* Stops the server (waiting gets answer "not found") and sets *store to NULL;
 * NULL is a no-op. */
MOE_EP_API moe_ep_status_t moe_ep_store_destroy(moe_ep_store_t* store);

/* A bootstrap whose allgather and barrier go through the store at `address`
 * ("host:port") under `prefix` (unique per group and run), for launchers
 * without MPI.  Each wait is bounded by timeout_ms (the callback then returns
 * an error).  Fills *bootstrap (its struct_size set by moe_ep_bootstrap_init);
 * release it with moe_ep_bootstrap_release after every handle created from it
 * is destroyed. */
MOE_EP_API moe_ep_status_t moe_ep_bootstrap_from_store(const char* address, const char* prefix, int32_t rank,
                                                       int32_t world_size, int32_t timeout_ms,
                                                       moe_ep_bootstrap_t* bootstrap);
/* Closes a bootstrap from moe_ep_bootstrap_from_store and clears its ctx and
 * callbacks; one already released (ctx NULL) is a no-op. */
MOE_EP_API moe_ep_status_t moe_ep_bootstrap_release(moe_ep_bootstrap_t* bootstrap);

/* Copies the current mask: active[r] = 1 if rank r is active, 0 if not.
 * world_size must be the handle's.  Local, non-blocking. */
MOE_EP_API moe_ep_status_t moe_ep_get_active_ranks(moe_ep_handle_t handle, uint8_t* active, int32_t world_size);

/* Replaces the mask (active[r] != 0: rank r active).  Collective over every
 * rank of the group, each passing the same mask (a disagreement fails on every
 * rank with INVALID_ARGUMENT naming the first differing rank); at least one
 * rank stays active; no pair in flight on any slot (INVALID_STATE otherwise).
 * Takes effect from the next dispatch; mask_epoch increments.  On HOST and
 * NVLINK_TWO_SIDED an inactive rank still makes every collective call, in
 * the same order (the whole group still takes part in every exchange): its
 * dispatch sends and receives nothing, its combine output is zeros.  On
 * NVLINK_TWO_SIDED the mask lives on the device (the call waits for the
 * handle's queued work before writing it): a captured CUDA graph follows it
 * without recapture.  Under failure_policy MASK
 * the call is collective over the ranks active before or after it only
 * (through the store), at most one rank becomes active per call, and that is
 * how survivors admit a replacement (config->rejoin) or a rank they masked:
 * both sides' parameters are compared as at create.  An inactive rank makes
 * no exchange there (its dispatch and combine are local and empty); a peer
 * that fails during the call is masked out and the call returns TIMEOUT
 * naming it, the requested mask not applied.  On NVLINK_TWO_SIDED under
 * MASK a rank that comes back has its memory exchanged again with the same
 * credential checks as create, and the participants reset their workspaces
 * to the new mask, so that a captured graph still replays.  On NCCL, as on
 * NVLINK_TWO_SIDED under FAIL_HANDLE, the mask lives on the device and every
 * rank still takes part in every exchange. */
MOE_EP_API moe_ep_status_t moe_ep_set_active_ranks(moe_ep_handle_t handle, const uint8_t* active, int32_t world_size);

/* Collective when the group is healthy; releases everything and sets *handle
 * to NULL.  *handle == NULL (or handle == NULL) is a no-op.  Never hangs: after
 * a timeout it releases local resources without waiting for peers (a bootstrap
 * callback still blocked on the handle's exchange thread is left to finish on
 * its own, with its own copies of the data; see moe_ep_bootstrap_t). */
MOE_EP_API moe_ep_status_t moe_ep_destroy(moe_ep_handle_t* handle);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The Open MPI bootstrap adapter (libmoe_ep_mpi) is declared in its own
 * header, <moe_ep_mpi.h>, which includes this one. */

#endif /* MOE_EP_C_H */
