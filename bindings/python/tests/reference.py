"""A numpy model of dispatch and combine, written from docs/semantics.md §4 and moe_ep_c.h
(not from the library's sources), plus deterministic random cases.

Every rank builds the inputs of *every* rank from the same seed, so each can
compute its own expected result without communication."""

import copy

import numpy as np


class Case:
    def __init__(self, seed, world, num_experts, top_k, hidden, tokens_per_rank, max_tokens_per_rank=None,
                 invalid=-1, masked_fraction=0.2, with_weights=True, scale_elems=0, combine_dtype=np.float32,
                 zero_rank=None):
        rng = np.random.default_rng(seed)
        self.world, self.E, self.K, self.H = world, num_experts, top_k, hidden
        self.tpr = tokens_per_rank
        self.max_tpr = max_tokens_per_rank or tokens_per_rank
        self.invalid = invalid
        self.scale_elems = scale_elems
        self.combine_dtype = np.dtype(combine_dtype)
        self.inputs = []
        for s in range(world):
            # Token counts differ per rank, one rank may send nothing.
            T = 0 if s == zero_rank else int(rng.integers(0, tokens_per_rank + 1))
            ids = np.stack([rng.permutation(num_experts)[:top_k] for _ in range(T)]).astype(np.int32) \
                if T else np.zeros((0, top_k), np.int32)
            ids[rng.random(ids.shape) < masked_fraction] = invalid
            x = rng.standard_normal((T, hidden)).astype(np.float32)
            w = rng.random((T, top_k)).astype(np.float32) if with_weights else None
            sc = rng.random((T, scale_elems)).astype(np.float32) if scale_elems else None
            self.inputs.append({"x": x, "ids": ids, "w": w, "scale": sc})

    @property
    def experts_per_rank(self):
        return self.E // self.world

    def owner(self, ids):
        return np.where((ids >= 0) & (ids < self.E), ids // self.experts_per_rank, -1)

    def goes_to(self, ids, dest):
        """[T] bool: the token has at least one valid pick owned by dest."""
        return (self.owner(ids) == dest).any(axis=1)

    def dispatch(self, me):
        """Expected receive buffers of rank `me`."""
        P = self.world * self.tpr
        out = {
            "hidden_states": np.zeros((P, self.H), np.float32),
            "topk_ids": np.full((P, self.K), self.invalid, np.int32),
            "topk_weights": np.zeros((P, self.K), np.float32),
            "hidden_states_scale": np.zeros((P, self.scale_elems), np.float32),
            "recv_counts": np.zeros(self.world, np.int32),
            "local_expert_counts": np.zeros(self.experts_per_rank, np.int32),
            "eplb_gathered_stats": np.zeros((self.world, self.E), np.int32),
        }
        for s, inp in enumerate(self.inputs):
            sel = np.nonzero(self.goes_to(inp["ids"], me))[0]  # ascending source token order
            rows = slice(s * self.tpr, s * self.tpr + len(sel))
            out["recv_counts"][s] = len(sel)
            ids = inp["ids"][sel]
            mine = self.owner(ids) == me
            out["topk_ids"][rows] = np.where(mine, ids, self.invalid)
            out["hidden_states"][rows] = inp["x"][sel]
            if inp["w"] is not None:
                out["topk_weights"][rows] = inp["w"][sel]
            if self.scale_elems:
                out["hidden_states_scale"][rows] = inp["scale"][sel]
            np.add.at(out["local_expert_counts"], ids[mine] - me * self.experts_per_rank, 1)
            valid = inp["ids"][(inp["ids"] >= 0) & (inp["ids"] < self.E)]
            out["eplb_gathered_stats"][s] = np.bincount(valid, minlength=self.E)
        return out

    def masked(self, active):
        """The same case under an active-rank mask (docs/semantics.md, "Active
        ranks"): a copy whose picks of experts owned by an inactive rank, and
        every pick of an inactive rank's own tokens, read the invalid id.  The
        library's results under the mask are those of this copy."""
        out = copy.deepcopy(self)
        for s, inp in enumerate(out.inputs):
            owner = self.owner(inp["ids"])
            drop = (owner >= 0) & (~np.asarray(active, bool)[np.maximum(owner, 0)] | (not active[s]))
            inp["ids"][drop] = self.invalid
        return out

    def expert_output(self, rank):
        """What rank's experts return for its receive rows: each row is the sum
        over its local picks of weight * (expert_id + 1) * hidden_row (the
        weighted, locally reduced output the spec asks for), and padding rows
        are NaN, so that a combine that reads padding is caught."""
        d = self.dispatch(rank)
        ids, w = d["topk_ids"], d["topk_weights"]
        valid = ids != self.invalid
        factor = np.where(valid, w * (ids + 1), 0).sum(axis=1, dtype=np.float32)
        out = (d["hidden_states"] * factor[:, None]).astype(self.combine_dtype)
        for s in range(self.world):
            out[s * self.tpr + d["recv_counts"][s]:(s + 1) * self.tpr] = np.nan
        return out

    def combine(self, me):
        """Expected combine output of rank `me`: for every token, the expert
        outputs of the ranks it went to, summed in fp32 in ascending rank order,
        then rounded to combine_dtype."""
        ids = self.inputs[me]["ids"]
        T = ids.shape[0]
        acc = np.zeros((T, self.H), np.float32)
        for r in range(self.world):
            eo = self.expert_output(r).astype(np.float32)
            mask = self.goes_to(ids, r)
            slots = np.cumsum(mask) - 1
            for t in np.nonzero(mask)[0]:
                acc[t] = acc[t] + eo[me * self.tpr + slots[t]]
        return acc.astype(self.combine_dtype)

    def combine_closed_form(self, me):
        """The same quantity without the library's layout: every valid pick's
        weight * (id + 1) * x.  Equal to combine() up to rounding."""
        inp = self.inputs[me]
        valid = (inp["ids"] >= 0) & (inp["ids"] < self.E)  # the invalid id and bad ids add nothing
        w = inp["w"] if inp["w"] is not None else np.zeros(inp["ids"].shape, np.float32)
        factor = np.where(valid, w * (inp["ids"] + 1), 0).sum(axis=1)
        return inp["x"] * factor[:, None]


def align_up(n, a):
    return (n + a - 1) // a * a


class ExpertLayout:
    """The expert layouts of docs/semantics.md §4 ("Receive layouts"), modelled
    for rank `me` of a Case: which (source rank, source token, pick) lands in
    which row, the counts, offsets and drops, and the combine that sums a
    token's rows."""

    def __init__(self, case, me, layout, capacity=0, alignment=0, expert_rows=0, scale_layout="row_major",
                 weighted=False):
        self.case, self.me, self.layout = case, me, layout
        self.scale_layout, self.weighted = scale_layout, weighted
        El, W, mtpr = case.experts_per_rank, case.world, case.max_tpr
        self.El = El
        # Every received pair per local expert, in ascending (source rank,
        # source token, pick) order.
        pairs = [[] for _ in range(El)]
        for s, inp in enumerate(case.inputs):
            ids = inp["ids"]
            for t in range(ids.shape[0]):
                for k in range(case.K):
                    g = int(ids[t, k])
                    if 0 <= g < case.E and g // El == me:
                        pairs[g - me * El].append((s, t, k))
        self.received = np.array([len(p) for p in pairs], np.int32)
        self.row_of = {}  # (s, t, k) -> row, for the pairs written
        if layout == "expert_major":
            self.capacity = capacity or W * mtpr
            self.rows = El * self.capacity
            self.offsets = None
            counts = [min(len(p), self.capacity) for p in pairs]
            starts = [e * self.capacity for e in range(El)]
        else:
            a = alignment or 1
            worst = (W * mtpr * min(case.K, El) + El * (a - 1)) // a * a
            self.rows = expert_rows or worst
            starts, counts, off = [], [], 0
            for p in pairs:
                starts.append(off)
                counts.append(min(len(p), self.rows - off))
                off = align_up(off + counts[-1], a)
            self.offsets = np.array(starts + [off], np.int32)
        self.counts = np.array(counts, np.int32)
        self.dropped = int(self.received.sum() - self.counts.sum())
        for e, p in enumerate(pairs):
            for j, pair in enumerate(p[:counts[e]]):
                self.row_of[pair] = starts[e] + j
        self.expert_of_row = np.full(self.rows, -1, np.int64)
        self.sources = np.full((self.rows, 3), -1, np.int32)
        self.weights = np.zeros(self.rows, np.float32)
        for (s, t, k), row in self.row_of.items():
            inp = case.inputs[s]
            self.expert_of_row[row] = int(inp["ids"][t, k])
            self.sources[row] = (s, t, k)
            self.weights[row] = inp["w"][t, k] if inp["w"] is not None else 1.0

    def shape(self, width):
        if self.layout == "expert_major":
            return (self.El, self.capacity, width)
        return (self.rows, width)

    def hidden_rows(self):
        """[rows, R] expected payload; padding rows NaN (unspecified)."""
        out = np.full((self.rows, self.case.H), np.nan, np.float32)
        for (s, t, _), row in self.row_of.items():
            out[row] = self.case.inputs[s]["x"][t]
        return out

    def scale_rows(self):
        """[rows, S] expected scales; padding NaN."""
        S = self.case.scale_elems
        out = np.full((self.rows, S), np.nan, np.float32)
        for (s, t, _), row in self.row_of.items():
            out[row] = self.case.inputs[s]["scale"][t]
        return out

    def scales_from_result(self, got):
        """The library's hidden_states_scale as [rows, S], whichever scale layout."""
        S = self.case.scale_elems
        if self.scale_layout == "row_major":
            return got.reshape(self.rows, S)
        if self.layout == "expert_packed":
            assert got.shape == (S, align_up(self.rows, 4))
            return got[:, :self.rows].T
        cap = self.capacity
        assert got.shape == (self.El, S, align_up(cap, 4))
        return got[:, :, :cap].transpose(0, 2, 1).reshape(self.rows, S)

    def expert_output(self, hidden_rows):
        """What the experts return in this layout: row i of expert g is
        (g + 1) * x (weighted: times the pick's weight too, as a GEMM epilogue
        would), in combine_dtype; padding rows NaN, so a combine that reads
        one is caught."""
        dt = self.case.combine_dtype
        out = np.full((self.rows, self.case.H), np.nan, dt)
        for row in np.nonzero(self.expert_of_row >= 0)[0]:
            y = hidden_rows[row] * np.float32(self.expert_of_row[row] + 1)
            if self.weighted:
                y = y * self.weights[row]
            out[row] = y.astype(dt)
        return out

    def partials(self, expert_output):
        """Per (token, rank) partial sum, as combine forms it on the rank the
        token went to: {(t, s): row}, `s` the token's source, for the tokens
        of every source that this rank received.  Rows in ascending (local
        expert, pick) order, each w * y rounded to fp32 before it is added,
        from 0.0; rounded to combine_dtype."""
        dt = self.case.combine_dtype
        rows_of_token = {}
        for (s, t, k), row in self.row_of.items():
            rows_of_token.setdefault((s, t), []).append((int(self.expert_of_row[row]), k, row))
        out = {}
        for s, inp in enumerate(self.case.inputs):
            for t in np.nonzero(self.case.goes_to(inp["ids"], self.me))[0]:
                acc = np.zeros(self.case.H, np.float32)
                for _, _, row in sorted(rows_of_token.get((s, int(t)), [])):
                    y = expert_output[row].astype(np.float32)
                    acc = acc + (y if self.weighted else (self.weights[row] * y).astype(np.float32))
                out[(s, int(t))] = acc.astype(dt)
        return out


def expert_layout_combine(layouts, me):
    """Expected combine output of rank `me` when every rank r's experts
    returned layouts[r]'s expert_output(): the partials summed over ranks in
    ascending order in fp32, rounded to combine_dtype."""
    case = layouts[me].case
    T = case.inputs[me]["ids"].shape[0]
    acc = np.zeros((T, case.H), np.float32)
    for r, lay in enumerate(layouts):
        parts = lay.partials(lay.expert_output(lay.hidden_rows()))
        for t in range(T):
            if (me, t) in parts:
                acc[t] = acc[t] + parts[(me, t)].astype(np.float32)
    return acc.astype(case.combine_dtype)
