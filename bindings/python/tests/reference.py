"""A numpy model of dispatch and combine, written from docs/semantics.md §4 and moe_ep_c.h
(not from the library's sources), plus deterministic random cases.

Every rank builds the inputs of *every* rank from the same seed, so each can
compute its own expected result without communication."""

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
