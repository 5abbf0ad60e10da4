# One rank, HOST backend: dispatch three tokens, double them in a toy
# "expert", combine.  Run:
#   MOE_EP_LIBRARY=/path/to/libmoe_ep.so.0 julia --project=bindings/julia/MoeEp \
#       bindings/julia/MoeEp/examples/single_rank.jl
using MoeEp

println("libmoe_ep ", get_version())
params = Params(2, 1, 4, 2; hidden_dtype=MoeEp.F32, combine_dtype=MoeEp.F32)
h = create(SingleRankBootstrap(), params, Config(backend=MoeEp.BACKEND_HOST))
try
    x = Float32[1 3 5; 2 4 6]        # (hidden=2, T=3): tokens [1,2], [3,4], [5,6]
    ids = Int32[1 -1 0]              # (top_k=1, T=3): the middle token picks nothing
    r = dispatch(h, x, ids)
    @assert r.recv_counts == Int32[2]
    @assert last_path(h, MoeEp.PHASE_DISPATCH) == "host"
    rows = copy(r.hidden_states)     # (2, 4): copy before combine reuses the memory
    y = combine(h, 2 .* rows)        # (2, 3)
    @assert y == Float32[2 0 10; 4 0 12]
    @assert last_path(h, MoeEp.PHASE_COMBINE) == "host"
    println("combined: ", y)
    @assert async_error(h) === nothing
    health = poll_health(h)          # host state only: cheap enough for every step
    @assert health.error === nothing && health.failed_rank == -1 && health.mask_epoch == 0
    set_active_ranks!(h, [true])     # one rank: only the all-active mask
    @assert active_ranks(h) == [true] && poll_health(h).mask_epoch == 1
    err = try                        # not world_size entries: refused, naming world_size
        set_active_ranks!(h, [true, true]); nothing
    catch e
        e
    end
    @assert err isa MoeEpError && err.status == MoeEp.ERROR_INVALID_ARGUMENT && occursin("world_size", err.message)
finally
    destroy!(h)
end
