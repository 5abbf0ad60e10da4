"""torch tensors through the Python bindings, checked against a torch model.

Run as: MOE_EP_TEST_TMPDIR=$(mktemp -d) mpiexec -n 2 python -m pytest bindings/python/tests/test_torch.py

- CPU: torch.distributed (gloo) bootstrap, HOST backend, bf16 CPU tensors.
- GPU (skipped without CUDA): NVLINK_TWO_SIDED backend on CUDA tensors, with
  the torch.distributed NCCL bootstrap and with the mpi4py one.
- The receive layouts with torch tensors: on CPU (HOST), and on the GPU
  backends, which either refuse them (UNSUPPORTED) or are checked against
  layout_checks' model.

Rank and world size come from the launcher's environment and torch.distributed
meets through a file in $MOE_EP_TEST_TMPDIR, so that only the mpi4py test
depends on mpi4py being built against the launcher's MPI.

Every rank builds every rank's inputs from one seed, so each computes its
expected results locally; assertions follow each test's collective calls."""

import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import moe_ep  # noqa: E402


def _launcher_env(*names, default):
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


RANK = _launcher_env("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", default=0)
WORLD = _launcher_env("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE", default=1)
HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device visible to torch")


# --- a torch model of docs/semantics.md §4 ------------------------------------------------------

class TorchCase:
    def __init__(self, seed, world, E, K, H, tpr, dtype=torch.bfloat16, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.world, self.E, self.K, self.H, self.tpr, self.dtype = world, E, K, H, tpr, dtype
        self.epr = E // world
        self.inputs = []
        for s in range(world):
            T = 0 if (s == world - 1 and seed % 2) else int(torch.randint(0, tpr + 1, (1,), generator=g))
            ids = torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K].to(torch.int32)  # distinct
            ids[torch.rand(T, K, generator=g) < 0.2] = -1  # masked picks
            x = torch.randn(T, H, generator=g).to(dtype)
            w = torch.rand(T, K, generator=g)
            self.inputs.append(tuple(t.to(device) for t in (x, ids, w)))

    def owner(self, ids):
        return torch.where(ids >= 0, ids // self.epr, torch.full_like(ids, -1))

    def dispatch(self, me):
        P, dev = self.world * self.tpr, self.inputs[0][0].device
        out = {"hidden_states": torch.zeros(P, self.H, dtype=self.dtype, device=dev),
               "topk_ids": torch.full((P, self.K), -1, dtype=torch.int32, device=dev),
               "topk_weights": torch.zeros(P, self.K, device=dev),
               "recv_counts": torch.zeros(self.world, dtype=torch.int32, device=dev),
               "local_expert_counts": torch.zeros(self.epr, dtype=torch.int32, device=dev)}
        for s, (x, ids, w) in enumerate(self.inputs):
            mine = self.owner(ids) == me
            sel = mine.any(dim=1).nonzero().flatten()  # ascending source token order
            rows = slice(s * self.tpr, s * self.tpr + sel.numel())
            out["recv_counts"][s] = sel.numel()
            out["hidden_states"][rows] = x[sel]
            out["topk_ids"][rows] = torch.where(mine[sel], ids[sel], torch.full_like(ids[sel], -1))
            out["topk_weights"][rows] = w[sel]
            local = (ids[sel][mine[sel]] - me * self.epr).long()
            out["local_expert_counts"] += torch.bincount(local, minlength=self.epr).to(torch.int32)
        return out

    def expert_output(self, r):
        """Weighted, locally reduced output of rank r's experts: each row times
        the sum over its local picks of w * (id + 1); padding rows NaN."""
        d = self.dispatch(r)
        ids, w = d["topk_ids"], d["topk_weights"]
        factor = torch.where(ids >= 0, w * (ids + 1).float(), torch.zeros_like(w)).sum(dim=1)
        eo = (d["hidden_states"].float() * factor[:, None]).to(self.dtype)
        for s in range(self.world):
            eo[s * self.tpr + int(d["recv_counts"][s]):(s + 1) * self.tpr] = float("nan")
        return eo

    def combine(self, me):
        """fp32 sum over ranks in ascending order, rounded once to dtype."""
        x, ids, _ = self.inputs[me]
        acc = torch.zeros(x.shape[0], self.H, device=x.device)
        for r in range(self.world):
            eo = self.expert_output(r).float()
            mask = (self.owner(ids) == r).any(dim=1)
            slots = torch.cumsum(mask.long(), 0) - 1
            acc[mask] = acc[mask] + eo[me * self.tpr + slots[mask]]
        return acc.to(self.dtype)


def run_and_compare(ep, case, stream=None, out_buffer=False):
    """All collective calls first, then the assertions.  A local failure
    between dispatch and combine is held back until combine was issued, so
    that the peers' combine is not left without this rank's data."""
    x, ids, w = case.inputs[RANK]
    r = ep.dispatch(x, ids, w, stream=stream)
    held = None
    got = {}
    try:
        for name in ("hidden_states", "topk_ids", "topk_weights", "recv_counts", "local_expert_counts"):
            view = getattr(r, name)
            assert view is not None, f"dispatch returned no {name} (T = {x.shape[0]} on rank {RANK})"
            got[name] = torch.from_dlpack(view).clone()
        view_device = r.hidden_states.device
    except Exception as e:  # raised below, after combine
        held = e
    eo = case.expert_output(RANK)
    if out_buffer:
        out = torch.full((x.shape[0], case.H), 7.0, dtype=case.dtype, device=x.device)
        y = ep.combine(eo, out, stream=stream)
        assert y is out
    else:
        y = torch.from_dlpack(ep.combine(eo, stream=stream)).clone()
    if x.is_cuda:
        torch.cuda.synchronize()
    err = ep.async_error()
    if held is not None:
        raise held

    assert err is None, err
    assert view_device == ((moe_ep.DEVICE_CUDA, x.device.index) if x.is_cuda else (moe_ep.DEVICE_CPU, 0))
    exp = case.dispatch(RANK)
    assert torch.equal(got["recv_counts"], exp["recv_counts"])
    for s in range(case.world):
        rows = slice(s * case.tpr, s * case.tpr + int(exp["recv_counts"][s]))
        assert torch.equal(got["hidden_states"][rows], exp["hidden_states"][rows]), f"rows from source {s}"
    assert torch.equal(got["topk_ids"], exp["topk_ids"])
    assert torch.equal(got["topk_weights"], exp["topk_weights"])
    assert torch.equal(got["local_expert_counts"], exp["local_expert_counts"])
    assert y.dtype == case.dtype and tuple(y.shape) == (x.shape[0], case.H)
    expected = case.combine(RANK)
    assert torch.equal(y, expected), f"max |diff| {(y.float() - expected.float()).abs().max()}"


def run_rounds(ep, cases, stream=None, out_buffer_rounds=()):
    """Several dispatch/combine rounds on one handle.  Every rank runs every
    round even when one fails (a rank that left early would leave its peers
    waiting), and the failures are reported at the end."""
    failures = []
    for i, case in enumerate(cases):
        try:
            run_and_compare(ep, case, stream=stream, out_buffer=i in out_buffer_rounds)
        except AssertionError as e:
            failures.append(f"round {i}: {e}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def world_group():
    if HAS_CUDA:
        torch.cuda.set_device(RANK % torch.cuda.device_count())
    tmp = os.environ.get("MOE_EP_TEST_TMPDIR")
    if not tmp and WORLD > 1:
        pytest.fail("MOE_EP_TEST_TMPDIR must name a fresh directory shared by the ranks")
    path = os.path.join(tmp or os.getcwd(), "torch_rendezvous")
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=RANK, world_size=WORLD)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def nccl_group(world_group):
    if not HAS_CUDA:
        pytest.skip("no CUDA device visible to torch")
    if torch.cuda.device_count() < WORLD:
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the
        # library itself runs several ranks per GPU, its bootstrap is what cannot.
        pytest.skip(f"an NCCL process group needs a GPU per rank: {WORLD} ranks, "
                    f"{torch.cuda.device_count()} GPUs")
    return dist.new_group(backend="nccl")


def test_cpu_host_backend_with_gloo_bootstrap(world_group):
    case = TorchCase(seed=3, world=WORLD, E=4 * WORLD, K=3, H=33, tpr=9)
    bs = moe_ep.from_torch_distributed(world_group)
    assert (bs.rank, bs.world_size) == (RANK, WORLD)
    with moe_ep.MoeEp(bs, num_experts=case.E, top_k=case.K, max_tokens_per_rank=case.tpr, hidden_size=case.H,
                      hidden_dtype=torch.bfloat16, combine_dtype=torch.bfloat16, backend="host") as ep:
        run_rounds(ep, [case, TorchCase(seed=4, world=WORLD, E=4 * WORLD, K=3, H=33, tpr=9)], out_buffer_rounds=(1,))


def gpu_case(seed, **kw):
    dev = torch.device("cuda", torch.cuda.current_device())
    args = dict(world=WORLD, E=8 * WORLD, K=4, H=257, tpr=24)  # odd hidden: no multiple-of-16 rule
    args.update(kw)
    return TorchCase(seed=seed, device=dev, **args)


def gpu_ep(bs, case):
    return moe_ep.MoeEp(bs, num_experts=case.E, top_k=case.K, max_tokens_per_rank=case.tpr, hidden_size=case.H,
                        hidden_dtype=case.dtype, combine_dtype=case.dtype, backend="nvlink",
                        device=torch.cuda.current_device(), timeout_ms=20000)


@needs_cuda
def test_gpu_nvlink_with_nccl_bootstrap(nccl_group):
    case = gpu_case(5)
    with gpu_ep(moe_ep.from_torch_distributed(nccl_group), case) as ep:
        # Seed 5 gives the last rank no tokens (T = 0: an empty CUDA tensor,
        # whose data pointer may be NULL); seed 6 combines into a caller buffer.
        run_rounds(ep, [gpu_case(seed) for seed in (5, 6, 7)], stream=torch.cuda.current_stream(),
                   out_buffer_rounds=(1,))


def _layout_run(bs, backend, device, index, **extra):
    """SPECS[index] of layout_checks through torch tensors on `device`; None
    when the backend refuses the layout (UNSUPPORTED, on every rank alike)."""
    np = pytest.importorskip("numpy")
    import layout_checks
    from conftest import host_kwargs
    _, ep_kwargs, _, how = layout_checks.SPECS[index]
    case = layout_checks.spec_case(index, WORLD)
    models = [layout_checks.layout_model(case, r, ep_kwargs) for r in range(WORLD)]
    kw = host_kwargs(case, **extra)
    kw["backend"] = backend
    try:
        ep = moe_ep.MoeEp(bs, **kw, **ep_kwargs)
    except moe_ep.MoeEpError as e:
        if e.status != moe_ep.ERROR_UNSUPPORTED:
            raise
        assert "receive_layout" in e.message, e.message
        return None, e.message
    with ep, moe_ep.MoeEp(bs, **kw) as rank_major:
        # Zero-copy writes go through View.write, a host-only helper: plain here.
        got = layout_checks.run_rank(ep, rank_major, case, RANK, models[RANK],
                                     how="plain" if how == "zero_copy" else how,
                                     to_numpy=lambda v: torch.from_dlpack(v).cpu().numpy().copy(),
                                     to_input=lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device))
    layout_checks.compare(case, RANK, got, models)
    return got, None


def test_cpu_expert_layouts_with_torch_tensors(world_group):
    for index in (0, 4):  # expert_packed aligned with scales; expert_major with drops, weighted
        got, _ = _layout_run(moe_ep.from_torch_distributed(world_group), "host", "cpu", index)
        assert got is not None


@needs_cuda
def test_gpu_expert_layouts_or_unsupported(nccl_group):
    # The GPU backends lay out rank-major only for now: create refuses the
    # expert layouts with UNSUPPORTED naming receive_layout.  Once one has
    # them, the same model checks its results.
    for backend in ("nvlink", "nccl"):
        for index in (0, 3):
            got, why = _layout_run(moe_ep.from_torch_distributed(nccl_group), backend,
                                   torch.device("cuda", torch.cuda.current_device()), index,
                                   device=torch.cuda.current_device())
            if got is None:
                print(f"{backend}: {why}")


@needs_cuda
def test_gpu_nvlink_with_mpi4py_bootstrap_on_a_side_stream(world_group):
    MPI = pytest.importorskip("mpi4py.MPI")
    comm = MPI.COMM_WORLD
    if comm.Get_size() != WORLD:  # the same on every rank: all skip together
        pytest.skip(f"mpi4py sees {comm.Get_size()} rank(s), the launcher {WORLD}: "
                    f"mpi4py is built against another MPI ({MPI.Get_library_version().splitlines()[0]})")
    case = gpu_case(8, dtype=torch.float16, K=2, H=64, tpr=5)
    side = torch.cuda.Stream()
    with moe_ep.from_mpi4py(comm) as bs, gpu_ep(bs, case) as ep:
        side.wait_stream(torch.cuda.current_stream())  # inputs were made on the current stream
        with torch.cuda.stream(side):
            run_rounds(ep, [case, gpu_case(9, dtype=torch.float16, K=2, H=64, tpr=5)], stream=side)


@needs_cuda
def test_gpu_health_poll_and_all_active_mask(nccl_group):
    """The GPU backends: a healthy poll before and after a pair, the
    all-active mask accepted (epoch 1), any other refused with UNSUPPORTED
    naming the backend on every rank, the handle still usable after."""
    for backend in ("nvlink", "nccl"):
        case = gpu_case(10, K=2, H=64, tpr=8)
        with moe_ep.MoeEp(moe_ep.from_torch_distributed(nccl_group), num_experts=case.E, top_k=case.K,
                          max_tokens_per_rank=case.tpr, hidden_size=case.H, hidden_dtype=case.dtype,
                          combine_dtype=case.dtype, backend=backend, device=torch.cuda.current_device(),
                          timeout_ms=20000) as ep:
            healthy = ep.poll_health()
            ep.set_active_ranks([True] * WORLD)
            refused = None
            if WORLD > 1:
                try:
                    ep.set_active_ranks([r != WORLD - 1 for r in range(WORLD)])
                except moe_ep.MoeEpError as e:
                    refused = e
            run_rounds(ep, [case], stream=torch.cuda.current_stream())
            torch.cuda.synchronize()
            after, mask = ep.poll_health(), ep.active_ranks()
        assert (healthy.status, healthy.error, healthy.failed_rank) == (moe_ep.SUCCESS, None, -1), backend
        assert (healthy.active_count, healthy.mask_epoch) == (WORLD, 0), backend
        if WORLD > 1:
            assert refused is not None and refused.status == moe_ep.ERROR_UNSUPPORTED, (backend, refused)
            assert ("nvlink_two_sided" if backend == "nvlink" else "nccl") in refused.message, refused.message
        assert (after.status, after.error, after.failed_rank) == (moe_ep.SUCCESS, None, -1), backend
        assert (after.active_count, after.mask_epoch, mask) == (WORLD, 1, [True] * WORLD), backend
