# MoeEp.jl: a thin ccall mirror of include/moe_ep_c.h.
#
# UNTESTED: Julia cannot be installed on the machines this project is built
# and tested on.  The module is kept small and mechanical (one Julia struct per
# C struct, one function per C function) so that it can be checked by reading
# it against the header.  See docs/ffi.md.
#
# The library is $MOE_EP_LIBRARY if set, else libmoe_ep.so.0 from the loader's
# path.  Julia arrays are column-major: a row-major C tensor of shape [T, H] is
# a Julia array of size (H, T); the helpers below reverse the dimensions.
module MoeEp

export MoeEpError, get_version, Params, Config, SingleRankBootstrap, Handle, create, dispatch, combine,
       dispatch_send, dispatch_recv, combine_send, combine_recv, backend, last_path, path_name, async_error,
       poll_health, active_ranks, set_active_ranks!, destroy!, Store, serve_store, store_port, store_address,
       close_store!, StoreBootstrap, RejoinBootstrap, release_bootstrap!

const libmoe_ep = get(ENV, "MOE_EP_LIBRARY", "libmoe_ep.so.0")

# --- statuses -----------------------------------------------------------------------
const SUCCESS = Int32(0)
const ERROR_INVALID_ARGUMENT = Int32(1)
const ERROR_UNSUPPORTED = Int32(2)
const ERROR_CUDA = Int32(3)
const ERROR_BOOTSTRAP = Int32(4)
const ERROR_OUT_OF_MEMORY = Int32(5)
const ERROR_TIMEOUT = Int32(6)
const ERROR_INVALID_STATE = Int32(7)
const ERROR_INVALID_INPUT = Int32(8)
const ERROR_INTERNAL = Int32(9)

const DEVICE_CPU = Int32(1)
const DEVICE_CUDA = Int32(2)
const BACKEND_AUTO = Int32(0)
const BACKEND_NVLINK_TWO_SIDED = Int32(1)
const BACKEND_HOST = Int32(2)
const BACKEND_NCCL = Int32(3)
const PHASE_DISPATCH = Int32(0)
const PHASE_COMBINE = Int32(1)
# Params(receive_layout=..., scale_layout=...): docs/semantics.md, "Receive layouts".
const LAYOUT_RANK_MAJOR = Int32(0)
const LAYOUT_EXPERT_MAJOR = Int32(1)
const LAYOUT_EXPERT_PACKED = Int32(2)
const SCALES_ROW_MAJOR = Int32(0)
const SCALES_COLUMN_MAJOR = Int32(1)
# Params(dispatch_wire=..., combine_wire=..., wire_scale=...): docs/semantics.md,
# "A low-precision wire".
const WIRE_AS_IS = Int32(0)
const WIRE_FP8_E4M3_BLOCK128 = Int32(1)
const WIRE_SCALE_FP32 = Int32(0)
const WIRE_SCALE_UE8M0 = Int32(1)
# Config(failure_policy=...): docs/reliability.md, "Surviving a dead rank".
const ON_FAILURE_FAIL_HANDLE = Int32(0)
const ON_FAILURE_MASK = Int32(1)

struct MoeEpError <: Exception
    status::Int32
    message::String
end
Base.showerror(io::IO, e::MoeEpError) = print(io, status_string(e.status), ": ", e.message)

status_string(s::Integer) = unsafe_string(ccall((:moe_ep_status_string, libmoe_ep), Cstring, (Int32,), s))
last_error() = unsafe_string(ccall((:moe_ep_last_error, libmoe_ep), Cstring, ()))

# Every call goes through here: a non-SUCCESS status throws with the
# thread-local message, read before any other library call can overwrite it.
function check(status::Int32)
    status == SUCCESS || throw(MoeEpError(status, last_error()))
    return nothing
end

# --- structs (field order and types exactly as in moe_ep_c.h) -------------------------
struct Device
    device_type::Int32
    device_id::Int32
end

struct DType
    code::UInt8
    bits::UInt8
    lanes::UInt16
end
const F32 = DType(2, 32, 1)
const F16 = DType(2, 16, 1)
const BF16 = DType(4, 16, 1)
const I32 = DType(0, 32, 1)
const FP8_E4M3FN = DType(10, 8, 1)   # rows of an FP8 dispatch wire, held as UInt8 codes

dtype_of(::Type{Float32}) = F32
dtype_of(::Type{Float16}) = F16
dtype_of(::Type{Int32}) = I32

struct Tensor               # == DLTensor
    data::Ptr{Cvoid}
    device::Device
    ndim::Int32
    dtype::DType
    shape::Ptr{Int64}
    strides::Ptr{Int64}
    byte_offset::UInt64
end
const NO_TENSOR = Tensor(C_NULL, Device(0, 0), 0, DType(0, 0, 0), C_NULL, C_NULL, 0)

mutable struct Bootstrap
    struct_size::UInt32
    rank::Int32
    world_size::Int32
    ctx::Ptr{Cvoid}
    allgather::Ptr{Cvoid}
    barrier::Ptr{Cvoid}
end

mutable struct Params
    struct_size::UInt32
    num_experts::Int32
    top_k::Int32
    max_tokens_per_rank::Int32
    hidden_size::Int32
    hidden_dtype::DType
    hidden_row_elems::Int32
    scale_row_elems::Int32
    scale_dtype::DType
    invalid_expert_id::Int32
    enable_eplb_stats::Int32
    combine_dtype::DType
    receive_layout::Int32
    expert_capacity::Int32
    expert_alignment::Int32
    expert_rows::Int32
    expert_output_weighted::Int32
    scale_layout::Int32
    dispatch_wire::Int32
    combine_wire::Int32
    wire_scale::Int32
    dispatch_dequantize::Int32
end

mutable struct Config
    struct_size::UInt32
    backend::Int32
    num_sms::Int32
    timeout_ms::Int32
    device::Int32
    zero_copy_combine::Int32
    micro_batches::Int32
    failure_policy::Int32        # docs/reliability.md, "Surviving a dead rank"
    rejoin::Int32
    store_address::Ptr{Cchar}    # into a String kept alive with the Config (_CONFIG_STRINGS)
    store_prefix::Ptr{Cchar}
end

# The strings a Config's pointers point into, kept for as long as the Config
# lives (create copies them; Julia strings do not move).
const _CONFIG_STRINGS = WeakKeyDict{Any,Vector{String}}()

function _c_string(s::AbstractString, name::AbstractString)
    str = String(s)
    Base.containsnul(str) && throw(MoeEpError(ERROR_INVALID_ARGUMENT,
                                              "$name: expected a string without NUL bytes, got $(repr(str))"))
    return str
end

mutable struct DispatchArgs
    struct_size::UInt32
    hidden_states::Ptr{Tensor}
    topk_ids::Ptr{Tensor}
    topk_weights::Ptr{Tensor}
    hidden_states_scale::Ptr{Tensor}
    runtime_max_tokens_per_rank::Int32
    eplb_local_stats::Ptr{Tensor}
end

mutable struct DispatchResult
    struct_size::UInt32
    tokens_per_rank::Int32
    hidden_states::Tensor
    topk_ids::Tensor
    topk_weights::Tensor
    hidden_states_scale::Tensor
    recv_counts::Tensor
    local_expert_counts::Tensor
    eplb_gathered_stats::Tensor
    combine_input::Tensor
    expert_counts::Tensor
    expert_offsets::Tensor
    row_sources::Tensor
    row_weights::Tensor
    dropped_pairs::Tensor
end

mutable struct CombineResult
    struct_size::UInt32
    output::Tensor
end

mutable struct Health
    struct_size::UInt32
    status::Int32
    failed_rank::Int32
    active_count::Int32
    mask_epoch::UInt64
end

# --- init functions: defaults come from the library, never from here ------------------
function get_version()
    a, b, c = Ref{Int32}(0), Ref{Int32}(0), Ref{Int32}(0)
    check(ccall((:moe_ep_get_version, libmoe_ep), Int32, (Ref{Int32}, Ref{Int32}, Ref{Int32}), a, b, c))
    return (a[], b[], c[])
end

"""Keywords left as `nothing` keep the library's defaults.  `receive_layout`
(LAYOUT_RANK_MAJOR, LAYOUT_EXPERT_MAJOR or LAYOUT_EXPERT_PACKED) and the
fields of the expert layouts (`expert_capacity`, `expert_alignment`,
`expert_rows`, `expert_output_weighted`, `scale_layout` = SCALES_ROW_MAJOR or
SCALES_COLUMN_MAJOR) are described in docs/semantics.md, "Receive layouts".
`dispatch_wire` and `combine_wire` (WIRE_AS_IS or WIRE_FP8_E4M3_BLOCK128),
`wire_scale` (WIRE_SCALE_FP32 or WIRE_SCALE_UE8M0) and `dispatch_dequantize`
choose the low-precision wire (docs/semantics.md, "A low-precision wire"):
with an FP8 dispatch wire `dispatch` returns `hidden_states` as UInt8 e4m3fn
codes (R, P) and `hidden_states_scale` as Float32 (ceil(R / 128), P), unless
`dispatch_dequantize`."""
function Params(num_experts, top_k, max_tokens_per_rank, hidden_size; hidden_dtype=nothing, combine_dtype=nothing,
                scale_row_elems=nothing, scale_dtype=nothing, receive_layout=nothing, expert_capacity=nothing,
                expert_alignment=nothing, expert_rows=nothing, expert_output_weighted=nothing, scale_layout=nothing,
                dispatch_wire=nothing, combine_wire=nothing, wire_scale=nothing, dispatch_dequantize=nothing)
    p = Params(0, 0, 0, 0, 0, DType(0, 0, 0), 0, 0, DType(0, 0, 0), 0, 0, DType(0, 0, 0), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    check(ccall((:moe_ep_params_init, libmoe_ep), Int32, (Ref{Params}, Csize_t), p, sizeof(Params)))
    p.num_experts, p.top_k, p.max_tokens_per_rank, p.hidden_size = num_experts, top_k, max_tokens_per_rank, hidden_size
    hidden_dtype === nothing || (p.hidden_dtype = hidden_dtype)
    combine_dtype === nothing || (p.combine_dtype = combine_dtype)
    scale_row_elems === nothing || (p.scale_row_elems = Int32(scale_row_elems))
    scale_dtype === nothing || (p.scale_dtype = scale_dtype)
    receive_layout === nothing || (p.receive_layout = Int32(receive_layout))
    expert_capacity === nothing || (p.expert_capacity = Int32(expert_capacity))
    expert_alignment === nothing || (p.expert_alignment = Int32(expert_alignment))
    expert_rows === nothing || (p.expert_rows = Int32(expert_rows))
    expert_output_weighted === nothing || (p.expert_output_weighted = Int32(expert_output_weighted))
    scale_layout === nothing || (p.scale_layout = Int32(scale_layout))
    dispatch_wire === nothing || (p.dispatch_wire = Int32(dispatch_wire))
    combine_wire === nothing || (p.combine_wire = Int32(combine_wire))
    wire_scale === nothing || (p.wire_scale = Int32(wire_scale))
    dispatch_dequantize === nothing || (p.dispatch_dequantize = Int32(dispatch_dequantize))
    return p
end

"""Keywords left as `nothing` keep the library's defaults.  `failure_policy`
(ON_FAILURE_FAIL_HANDLE or ON_FAILURE_MASK, HOST backend), `store_address`
("host:port" of a `Store`, needed by MASK), `store_prefix` (the group's name in
the store) and `rejoin` (1: replace a failed rank of a running MASK group, with
a `RejoinBootstrap`) are described in docs/reliability.md, "Surviving a dead
rank".  The strings are kept alive with the Config."""
function Config(; backend=nothing, timeout_ms=nothing, device=nothing, zero_copy_combine=nothing,
                micro_batches=nothing, failure_policy=nothing, rejoin=nothing, store_address=nothing,
                store_prefix=nothing)
    c = Config(0, 0, 0, 0, 0, 0, 0, 0, 0, C_NULL, C_NULL)
    check(ccall((:moe_ep_config_init, libmoe_ep), Int32, (Ref{Config}, Csize_t), c, sizeof(Config)))
    backend === nothing || (c.backend = backend)
    timeout_ms === nothing || (c.timeout_ms = timeout_ms)
    device === nothing || (c.device = device)
    zero_copy_combine === nothing || (c.zero_copy_combine = Int32(zero_copy_combine))
    micro_batches === nothing || (c.micro_batches = Int32(micro_batches))
    failure_policy === nothing || (c.failure_policy = Int32(failure_policy))
    rejoin === nothing || (c.rejoin = Int32(rejoin))
    kept = String[]
    if store_address !== nothing
        push!(kept, _c_string(store_address, "store_address"))
        c.store_address = Ptr{Cchar}(pointer(kept[end]))
    end
    if store_prefix !== nothing
        push!(kept, _c_string(store_prefix, "store_prefix"))
        c.store_prefix = Ptr{Cchar}(pointer(kept[end]))
    end
    isempty(kept) || (_CONFIG_STRINGS[c] = kept)
    return c
end

# --- bootstrap: a group of one, with callbacks written in Julia ------------------------
function _copy_allgather(ctx::Ptr{Cvoid}, send::Ptr{Cvoid}, recv::Ptr{Cvoid}, n::Csize_t)::Int32
    n == 0 || Base.unsafe_copyto!(Ptr{UInt8}(recv), Ptr{UInt8}(send), n)
    return Int32(0)
end
_no_barrier(ctx::Ptr{Cvoid})::Int32 = Int32(0)

function SingleRankBootstrap()
    b = Bootstrap(0, 0, 0, C_NULL, C_NULL, C_NULL)
    check(ccall((:moe_ep_bootstrap_init, libmoe_ep), Int32, (Ref{Bootstrap}, Csize_t), b, sizeof(Bootstrap)))
    b.rank, b.world_size = 0, 1
    b.allgather = @cfunction(_copy_allgather, Int32, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}, Csize_t))
    b.barrier = @cfunction(_no_barrier, Int32, (Ptr{Cvoid},))
    return b
end

# --- the store and its bootstrap (docs/reliability.md, "Surviving a dead rank") ------------

"""A moe_ep store server on threads of this process until `close_store!` (or
the finalizer: it is not collective).  Serve it from a process that outlives
the ranks; it has no authentication."""
mutable struct Store
    ptr::Ptr{Cvoid}
    host::Union{String,Nothing}
end

"""Listens on host:port (`host` nothing = every interface, `port` 0 = any free port)."""
function serve_store(host::Union{AbstractString,Nothing}=nothing, port::Integer=0)
    h = host === nothing ? nothing : _c_string(host, "host")
    out = Ref{Ptr{Cvoid}}(C_NULL)
    GC.@preserve h begin
        check(ccall((:moe_ep_store_serve, libmoe_ep), Int32, (Ptr{UInt8}, Int32, Ref{Ptr{Cvoid}}),
                    h === nothing ? C_NULL : pointer(h), port, out))
    end
    s = Store(out[], h)
    finalizer(close_store!, s)
    return s
end

"""The port the store listens on."""
function store_port(s::Store)
    s.ptr == C_NULL && throw(MoeEpError(ERROR_INVALID_STATE, "this moe_ep store was closed"))
    p = Ref{Int32}(0)
    check(ccall((:moe_ep_store_port, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{Int32}), s.ptr, p))
    return p[]
end

"""\"host:port\" for `Config(store_address=...)` and `StoreBootstrap` (127.0.0.1
for a store on every interface)."""
store_address(s::Store) = string(something(s.host, "127.0.0.1"), ":", store_port(s))

"""Stops the server; idempotent."""
function close_store!(s::Store)
    ref = Ref{Ptr{Cvoid}}(s.ptr)
    s.ptr = C_NULL
    check(ccall((:moe_ep_store_destroy, libmoe_ep), Int32, (Ref{Ptr{Cvoid}},), ref))
end

"""The library's bootstrap over the store at `address` under `prefix` (unique
per group and run), each wait bounded by `timeout_ms`: for launchers without
MPI.  Release it with `release_bootstrap!` after every handle made from it is
destroyed (not before: a callback left running after a timeout uses it)."""
function StoreBootstrap(address::AbstractString, prefix::AbstractString, rank::Integer, world_size::Integer;
                        timeout_ms::Integer=30000)
    a, p = _c_string(address, "address"), _c_string(prefix, "prefix")
    b = Bootstrap(0, 0, 0, C_NULL, C_NULL, C_NULL)
    check(ccall((:moe_ep_bootstrap_init, libmoe_ep), Int32, (Ref{Bootstrap}, Csize_t), b, sizeof(Bootstrap)))
    check(ccall((:moe_ep_bootstrap_from_store, libmoe_ep), Int32,
                (Cstring, Cstring, Int32, Int32, Int32, Ref{Bootstrap}), a, p, rank, world_size, timeout_ms, b))
    return b
end

"""Releases a `StoreBootstrap`; again is a no-op."""
function release_bootstrap!(b::Bootstrap)
    check(ccall((:moe_ep_bootstrap_release, libmoe_ep), Int32, (Ref{Bootstrap},), b))
end

"""Rank and world size only, no callbacks: for a replacement rank,
`create(RejoinBootstrap(r, w), params, Config(...; rejoin=1))`."""
function RejoinBootstrap(rank::Integer, world_size::Integer)
    b = Bootstrap(0, 0, 0, C_NULL, C_NULL, C_NULL)
    check(ccall((:moe_ep_bootstrap_init, libmoe_ep), Int32, (Ref{Bootstrap}, Csize_t), b, sizeof(Bootstrap)))
    b.rank, b.world_size = rank, world_size
    return b
end

# --- handle ----------------------------------------------------------------------------
mutable struct Handle
    ptr::Ptr{Cvoid}
    bootstrap::Bootstrap   # the library calls back into it until destroy
    keep::Vector{Any}      # inputs and shape arrays in use by the current call
    slot_keep::Dict{Int32,Vector{Any}}  # the same per slot, for the split calls
end

"""Collective.  No finalizer: destroy is collective and must not run at a
moment the garbage collector picks; call `destroy!` on every rank."""
function create(bs::Bootstrap, p::Params, c::Union{Config,Nothing}=nothing)
    out = Ref{Ptr{Cvoid}}(C_NULL)
    if c === nothing
        check(ccall((:moe_ep_create, libmoe_ep), Int32, (Ref{Bootstrap}, Ref{Params}, Ptr{Cvoid}, Ref{Ptr{Cvoid}}),
                    bs, p, C_NULL, out))
    else
        # The Config keeps the strings its pointers point into (_CONFIG_STRINGS).
        GC.@preserve c begin
            check(ccall((:moe_ep_create, libmoe_ep), Int32, (Ref{Bootstrap}, Ref{Params}, Ref{Config}, Ref{Ptr{Cvoid}}),
                        bs, p, c, out))
        end
    end
    return Handle(out[], bs, Any[], Dict{Int32,Vector{Any}}())
end

# A host array as a row-major C tensor: Julia (H, T) column-major == C [T, H].
function host_tensor(a::Array{T}, keep::Vector{Any}; dtype::DType=dtype_of(T)) where {T}
    shape = Int64[reverse(size(a))...]
    push!(keep, a, shape)
    return Ref(Tensor(pointer(a), Device(DEVICE_CPU, 0), ndims(a), dtype, pointer(shape), C_NULL, 0))
end

# A library-owned host view as a Julia array (no copy), dimensions reversed.
function host_view(t::Tensor, ::Type{T}) where {T}
    t.data == C_NULL && t.ndim == 0 && return nothing
    dims = reverse(ntuple(i -> Int(unsafe_load(t.shape, i)), t.ndim))
    return unsafe_wrap(Array, Ptr{T}(t.data + t.byte_offset), dims)
end

"""Collective.  hidden: (R, T) array; ids: (K, T) Int32; weights: (K, T) Float32;
scales: (S, T) array of the params' scale dtype (`scale_type`), when
`scale_row_elems > 0`.  Returns a NamedTuple of arrays aliasing library
memory, valid until `combine`.
With `Config(zero_copy_combine=true)`, `combine_input` is an (H, P) array of
`combine_type` (Float32 or Float16: the handle's combine dtype, as `combine`
takes): write the expert output into it and pass it to `combine`, which then
reads it in place.
In an expert layout (`Params(receive_layout=LAYOUT_EXPERT_MAJOR)` or
`LAYOUT_EXPERT_PACKED`), with El = num_experts / world_size: `hidden_states`
is (R, capacity, El) or (R, expert_rows), one column per (token, local pick);
`topk_ids` and `topk_weights` are `nothing`; `expert_counts` (El),
`expert_offsets` (El + 1, EXPERT_PACKED: each expert's first row, 0-based, the
last the aligned total), `row_sources` (3, rows: source rank, source token,
pick index, 0-based; -1 on padding), `row_weights` (rows) and `dropped_pairs`
(1) describe them (`nothing` in rank-major).  `combine` then takes the expert
output in the same shape, unweighted unless `expert_output_weighted`."""
function dispatch(h::Handle, hidden::Array, ids::Matrix{Int32}; weights=nothing, scales=nothing,
                  hidden_type::Type=eltype(hidden), combine_type::Type=Float32,
                  scale_type::Type=(scales === nothing ? Float32 : eltype(scales)))
    keep = Any[]
    th = host_tensor(hidden, keep)
    ti = host_tensor(ids, keep)
    tw = weights === nothing ? nothing : host_tensor(weights, keep)
    ts = scales === nothing ? nothing : host_tensor(scales, keep)
    # The block's value is r: GC.@preserve may wrap its body in a new scope.
    r = GC.@preserve keep th ti tw ts begin
        args = _dispatch_args(th, ti, tw, ts)
        r = _dispatch_result()
        check(ccall((:moe_ep_dispatch, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{DispatchArgs}, Ref{DispatchResult}, Ptr{Cvoid}),
                    h.ptr, args, r, C_NULL))
        r
    end
    h.keep = keep
    return _dispatch_views(r, hidden_type, combine_type, scale_type)
end

# The caller preserves th, ti, tw, ts (and what they point to) around the call.
function _dispatch_args(th, ti, tw, ts=nothing)
    args = DispatchArgs(0, C_NULL, C_NULL, C_NULL, C_NULL, 0, C_NULL)
    check(ccall((:moe_ep_dispatch_args_init, libmoe_ep), Int32, (Ref{DispatchArgs}, Csize_t), args, sizeof(DispatchArgs)))
    args.hidden_states = Base.unsafe_convert(Ptr{Tensor}, th)
    args.topk_ids = Base.unsafe_convert(Ptr{Tensor}, ti)
    tw === nothing || (args.topk_weights = Base.unsafe_convert(Ptr{Tensor}, tw))
    ts === nothing || (args.hidden_states_scale = Base.unsafe_convert(Ptr{Tensor}, ts))
    return args
end

function _dispatch_result()
    r = DispatchResult(0, 0, NO_TENSOR, NO_TENSOR, NO_TENSOR, NO_TENSOR, NO_TENSOR, NO_TENSOR, NO_TENSOR, NO_TENSOR,
                       NO_TENSOR, NO_TENSOR, NO_TENSOR, NO_TENSOR, NO_TENSOR)
    check(ccall((:moe_ep_dispatch_result_init, libmoe_ep), Int32, (Ref{DispatchResult}, Csize_t), r, sizeof(DispatchResult)))
    return r
end

function _dispatch_views(r::DispatchResult, hidden_type::Type, combine_type::Type, scale_type::Type=Float32)
    # An FP8 dispatch wire's rows are e4m3fn codes whatever was sent, and its
    # scales Float32: the result's dtype says which.
    fp8 = r.hidden_states.dtype == FP8_E4M3FN
    return (tokens_per_rank=r.tokens_per_rank,
            hidden_states=host_view(r.hidden_states, fp8 ? UInt8 : hidden_type),
            topk_ids=host_view(r.topk_ids, Int32),
            topk_weights=host_view(r.topk_weights, Float32),
            hidden_states_scale=host_view(r.hidden_states_scale, fp8 ? Float32 : scale_type),
            recv_counts=host_view(r.recv_counts, Int32),
            local_expert_counts=host_view(r.local_expert_counts, Int32),
            combine_input=host_view(r.combine_input, combine_type),
            expert_counts=host_view(r.expert_counts, Int32),
            expert_offsets=host_view(r.expert_offsets, Int32),
            row_sources=host_view(r.row_sources, Int32),
            row_weights=host_view(r.row_weights, Float32),
            dropped_pairs=host_view(r.dropped_pairs, Int32))
end

"""Collective.  expert_output: (H, P) array (expert layouts: the dispatch's
shape, (H, capacity, El) or (H, expert_rows)).  Returns an (H, T) array
aliasing library memory, valid until the next combine."""
function combine(h::Handle, expert_output::Array{T}) where {T}
    keep = Any[]
    te = host_tensor(expert_output, keep)
    r = CombineResult(0, NO_TENSOR)
    GC.@preserve keep te begin
        check(ccall((:moe_ep_combine_result_init, libmoe_ep), Int32, (Ref{CombineResult}, Csize_t), r, sizeof(CombineResult)))
        check(ccall((:moe_ep_combine, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{Tensor}, Ptr{Cvoid}, Ref{CombineResult}, Ptr{Cvoid}),
                    h.ptr, te, C_NULL, r, C_NULL))
    end
    h.keep = keep
    out = host_view(r.output, T)
    return out === nothing ? Array{T}(undef, 0, 0) : out
end

# --- split phases (docs/overlap.md) -------------------------------------------------------
# Each slot (0 .. micro_batches - 1) goes IDLE -dispatch_send-> DISPATCH_SENT
# -dispatch_recv-> DISPATCHED -combine_send-> COMBINE_SENT -combine_recv-> IDLE;
# any other call on it throws MoeEpError(ERROR_INVALID_STATE) and the handle
# stays usable.  `dispatch` is dispatch_send + dispatch_recv on slot 0, `combine`
# combine_send + combine_recv on slot 0.

"""Collective: the send half of dispatch on `slot`; arguments as for `dispatch`."""
function dispatch_send(h::Handle, slot::Integer, hidden::Array, ids::Matrix{Int32}; weights=nothing, scales=nothing)
    keep = Any[]
    th = host_tensor(hidden, keep)
    ti = host_tensor(ids, keep)
    tw = weights === nothing ? nothing : host_tensor(weights, keep)
    ts = scales === nothing ? nothing : host_tensor(scales, keep)
    GC.@preserve keep th ti tw ts begin
        args = _dispatch_args(th, ti, tw, ts)
        check(ccall((:moe_ep_dispatch_send, libmoe_ep), Int32, (Ptr{Cvoid}, Int32, Ref{DispatchArgs}, Ptr{Cvoid}),
                    h.ptr, slot, args, C_NULL))
    end
    h.slot_keep[Int32(slot)] = keep
    return nothing
end

"""Collective: the receive half of dispatch on `slot`: the same NamedTuple as
`dispatch` (give `hidden_type`, the element type of the rows sent), valid until
the slot's `combine_send`."""
function dispatch_recv(h::Handle, slot::Integer; hidden_type::Type, combine_type::Type=Float32,
                       scale_type::Type=Float32)
    r = _dispatch_result()
    check(ccall((:moe_ep_dispatch_recv, libmoe_ep), Int32, (Ptr{Cvoid}, Int32, Ref{DispatchResult}, Ptr{Cvoid}),
                h.ptr, slot, r, C_NULL))
    return _dispatch_views(r, hidden_type, combine_type, scale_type)
end

"""Collective: the send half of combine on `slot`; expert_output as for
`combine`.  Ends the validity of the slot's dispatch results."""
function combine_send(h::Handle, slot::Integer, expert_output::Array)
    keep = Any[]
    te = host_tensor(expert_output, keep)
    GC.@preserve keep te begin
        check(ccall((:moe_ep_combine_send, libmoe_ep), Int32, (Ptr{Cvoid}, Int32, Ref{Tensor}, Ptr{Cvoid}),
                    h.ptr, slot, te, C_NULL))
    end
    h.slot_keep[Int32(slot)] = keep
    return nothing
end

"""Collective: the receive half of combine on `slot`.  Returns an (H, T) array
of element type `T` (the handle's combine dtype) aliasing library memory,
valid until the slot's next combine_recv."""
function combine_recv(h::Handle, slot::Integer, ::Type{T}) where {T}
    r = CombineResult(0, NO_TENSOR)
    check(ccall((:moe_ep_combine_result_init, libmoe_ep), Int32, (Ref{CombineResult}, Csize_t), r, sizeof(CombineResult)))
    check(ccall((:moe_ep_combine_recv, libmoe_ep), Int32, (Ptr{Cvoid}, Int32, Ptr{Cvoid}, Ref{CombineResult}, Ptr{Cvoid}),
                h.ptr, slot, C_NULL, r, C_NULL))
    out = host_view(r.output, T)
    return out === nothing ? Array{T}(undef, 0, 0) : out
end

"""The backend the handle runs on (BACKEND_NVLINK_TWO_SIDED, BACKEND_HOST or
BACKEND_NCCL): what BACKEND_AUTO chose, the same on every rank."""
function backend(h::Handle)
    b = Ref{Int32}(-1)
    check(ccall((:moe_ep_get_backend, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{Int32}), h.ptr, b))
    return b[]
end

"""A path's name (MOE_EP_PATH_*: "host", "dispatch_small", ...; "unknown" for other values)."""
path_name(p::Integer) = unsafe_string(ccall((:moe_ep_path_name, libmoe_ep), Cstring, (Int32,), p))

"""The path the handle's last call of `phase` (PHASE_DISPATCH or PHASE_COMBINE)
took on this rank, by name ("host", "nccl", "dispatch_small", ...; "none"
before the first such call).  Local, no synchronisation."""
function last_path(h::Handle, phase::Integer)
    p = Ref{Int32}(-1)
    check(ccall((:moe_ep_get_last_path, libmoe_ep), Int32, (Ptr{Cvoid}, Int32, Ref{Int32}), h.ptr, phase, p))
    return path_name(p[])
end

"""The first device-side error since the last check, or nothing."""
function async_error(h::Handle)
    s = Ref{Int32}(0)
    check(ccall((:moe_ep_get_async_error, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{Int32}), h.ptr, s))
    return s[] == SUCCESS ? nothing : MoeEpError(s[], last_error())
end

# --- health and the active-rank mask (docs/semantics.md, "Active ranks") ------------------

"""The handle's health from host memory only: never synchronises with the
device, never waits for a peer, never blocks (cheap enough for every step).
Returns a NamedTuple: `status` (SUCCESS, or the sticky ERROR_TIMEOUT,
ERROR_CUDA or ERROR_INTERNAL that broke the handle), `error` (that status as a
MoeEpError with the library's message, or `nothing`), `failed_rank` (the peer a
timeout named, 0-based; -1 when none is known; on HOST set only by ON_FAILURE_MASK),
`active_count`, `mask_epoch` (0 at create, +1 per `set_active_ranks!`).  Device
errors only a synchronising query finds stay with `async_error`.  Local."""
function poll_health(h::Handle)
    r = Health(0, 0, 0, 0, 0)
    check(ccall((:moe_ep_health_init, libmoe_ep), Int32, (Ref{Health}, Csize_t), r, sizeof(Health)))
    check(ccall((:moe_ep_poll_health, libmoe_ep), Int32, (Ptr{Cvoid}, Ref{Health}), h.ptr, r))
    # The poll leaves the failure's message in moe_ep_last_error.
    error = r.status == SUCCESS ? nothing : MoeEpError(r.status, last_error())
    return (status=r.status, error=error, failed_rank=r.failed_rank, active_count=r.active_count,
            mask_epoch=r.mask_epoch)
end

"""The current mask, a Vector{Bool} of world_size entries (index r + 1 for
rank r): true if the rank is active.  Local, non-blocking."""
function active_ranks(h::Handle)
    n = h.bootstrap.world_size
    mask = zeros(UInt8, n)
    check(ccall((:moe_ep_get_active_ranks, libmoe_ep), Int32, (Ptr{Cvoid}, Ptr{UInt8}, Int32), h.ptr, mask, n))
    return mask .!= 0
end

"""Collective over every rank, each passing the same mask: `active[r + 1]`
true if rank r stays active.  At least one rank active, no pair in flight on
any slot (ERROR_INVALID_STATE otherwise).  From the next dispatch the experts
of inactive ranks do not exist for the group: their picks are dropped, combine
sums over the active ranks (not renormalised), an inactive rank's dispatch
receives nothing and its combine output is zeros; an inactive rank still
makes every collective call (under failure_policy MASK on HOST and
NVLINK_TWO_SIDED: only the active ranks do).  A mask whose length is not
world_size, or masks that differ between ranks, throw ERROR_INVALID_ARGUMENT
on every rank."""
function set_active_ranks!(h::Handle, active::AbstractVector)
    mask = UInt8[a != 0 ? 1 : 0 for a in active]
    check(ccall((:moe_ep_set_active_ranks, libmoe_ep), Int32, (Ptr{Cvoid}, Ptr{UInt8}, Int32), h.ptr, mask,
                length(mask)))
    return nothing
end

"""Collective, idempotent."""
function destroy!(h::Handle)
    ref = Ref{Ptr{Cvoid}}(h.ptr)
    status = ccall((:moe_ep_destroy, libmoe_ep), Int32, (Ref{Ptr{Cvoid}},), ref)
    h.ptr = C_NULL
    empty!(h.keep)
    empty!(h.slot_keep)
    check(status)
end

end # module
