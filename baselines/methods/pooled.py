"""MuLo-SD's acceptance rule `pooled_threshold(k, tau)` (paper.md §5): a deterministic threshold on
the target's probability pooled over the draft token's codebook neighbourhood.

    accept x~_i  iff  sum_{x in B_k(x~_i)} p_i(x) >= tau

B_k(x) = x itself and its k - 1 nearest other codes in the tokenizer's latent space (L2 between code
vectors, baselines/framework/neighbours.py); k = 1 is "draft-token probability only" (ablation b). There is no
drafter probability q in the rule (the up-sampler yields tokens, not a distribution) and no
uniform: the rule is deterministic given p. A rejected position is resampled from p itself.

`anchor` (an extension, not in the paper): a rejected position is instead resampled from p
restricted to B_anchor(x~_i), the draft token's own codebook neighbourhood (from p when the target
gives that neighbourhood no mass), so that redrawing corrects a draft's detail instead of deciding
its content again; the resampler takes the same option for the rest of the resample set.

`confident` (an extension, not in the paper): a draft is also rejected when the target puts at least
that much mass on one code outside B_k(x~_i), i.e. where the target is sure of another token than
anything near the draft (a stricter rule exactly where the target knows the detail).

`below` (an extension, not in the paper): a rejected draft is accepted again when the draft
continues it below and the target, teacher-forced on it, accepts that continuation. With n >= 1,
for n passes: a rejected x~_i is accepted when the cell one row below, x~_{i+W}, is accepted and
lies in B_k(x~_i). The verification forward saw x~_i when it scored x~_{i+W}, so an accepted
continuation is the target's verdict on the object that x~_i starts: where raster order first
meets an object the target, having seen only background above, gives the object's first cell
little mass, and the rule would otherwise reject the object's start (docs/shapes_world.md, "A
verification that judges detail"). The block must be the image after its first token, in raster
order (the lowres draft with draft.rows: null and scope.rounds: 1; the decoder checks this).
"""
from __future__ import annotations

import torch
from torch import Tensor

from baselines.framework.acceptance import Verdict
from baselines.framework.canvas import Context
from baselines.framework.drafts import DraftSource
from baselines.methods.local import LocalScope
from baselines.framework.scope import RejectionScope


def pooled_mass(p: Tensor, drafts: Tensor, neighbours: Tensor | None) -> Tensor:
    """p [B, L, V], drafts [B, L], neighbours [V, k-1] int64 (or None for k = 1) -> [B, L]: the mass
    of p on the draft token plus its listed neighbours."""
    mass = p.gather(-1, drafts[..., None]).squeeze(-1)
    if neighbours is not None:
        mass = mass + p.gather(-1, neighbours[drafts]).sum(-1)  # neighbours never include x itself
    return mass


def anchor_set(tokens: Tensor, neighbours: Tensor | None) -> Tensor:
    """tokens [...], neighbours [V, a-1] (None: a = 1) -> [..., a] int64: each token and its
    neighbours (distinct codes)."""
    return tokens[..., None] if neighbours is None else torch.cat([tokens[..., None], neighbours[tokens]], -1)


def restricted(p: Tensor, keep: Tensor) -> Tensor:
    """p [..., V], keep [..., a] distinct codes -> [..., V] unnormalised: p on `keep`, zero
    elsewhere; p itself where `keep` has no mass (a sum of non-negative terms is 0 only when
    each term is)."""
    mass = p.gather(-1, keep)
    inside = torch.zeros_like(p).scatter_(-1, keep, mass)
    return torch.where(mass.sum(-1, keepdim=True) > 0, inside, p)


def anchored(p: Tensor, tokens: Tensor, neighbours: Tensor | None) -> Tensor:
    """p [..., V], tokens [...], neighbours [V, a-1] (None: a = 1) -> [..., V] unnormalised: p on
    each token and its neighbours, zero elsewhere; p itself where that mass is zero."""
    return restricted(p, anchor_set(tokens, neighbours))


def confident_elsewhere(p: Tensor, drafts: Tensor, neighbours: Tensor | None, level: float) -> Tensor:
    """p [B, L, V], drafts [B, L], neighbours [V, k-1] (None: k = 1) -> [B, L] bool: p gives at least
    `level` to one code outside the draft's k-neighbourhood."""
    outside = p.scatter(-1, anchor_set(drafts, neighbours), 0.0)
    return outside.amax(-1) >= level


def continued_below(accept: Tensor, drafts: Tensor, neighbours: Tensor | None, cols: int, passes: int,
                    inside: int) -> Tensor:
    """accept [B, L] bool, drafts [B, L] (raster order, rows of width `cols`; the first `inside`
    entries lie in the image, the rest past its end), neighbours [V, k-1] (None: k = 1) -> [B, L]
    bool: accept, with each rejected draft accepted again when the draft one row below (in the
    image) is accepted and lies in its k-neighbourhood; `passes` times (a rescued cell can rescue
    the one above it in the next pass)."""
    inside = min(inside, accept.shape[1])
    if inside <= cols:
        return accept
    above, below = drafts[:, :inside - cols], drafts[:, cols:inside]
    same = (anchor_set(above, neighbours) == below[..., None]).any(-1)  # [B, inside - W]
    head, tail = accept[:, :inside], accept[:, inside:]
    for _ in range(passes):
        head = torch.cat([head[:, :-cols] | (same & head[:, cols:]), head[:, -cols:]], 1)
    return torch.cat([head, tail], 1)


def anchor_table(ctx: Context, anchor: int) -> Tensor | None:
    """The neighbour table of B_anchor (None for anchor = 1: the token alone)."""
    return ctx.neighbours(anchor - 1) if anchor > 1 else None


class PooledThresholdRule:
    """`pooled_threshold`: accept when the pooled target mass of the draft's k-neighbourhood is >= tau.

    Args:
        k: codebook neighbourhood size, the draft token included (>= 1; clamped to V).
        tau: threshold in [0, 1]; 0 accepts every draft, higher is closer to the target.
        anchor: 0 (the paper): a rejection is resampled from p; a >= 1: from p restricted to the
            draft token's a-neighbourhood (see the module docstring).
        confident: None (the paper) or a level in (0, 1]: also reject a draft when p gives at least
            this much to one code outside its k-neighbourhood (module docstring).
        below: 0 (the paper) or n >= 1 passes: a rejected draft is accepted again when the
            accepted draft one row below lies in its k-neighbourhood (module docstring).

    With greedy sampling p is one-hot on the argmax, so for 0 < tau <= 1 the rule accepts exactly
    when the argmax lies in the draft's neighbourhood.
    """

    name = "pooled_threshold"

    def __init__(self, k: int = 16, tau: float = 0.1, anchor: int = 0,
                 confident: float | None = None, below: int = 0) -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"decoder accept.k (pooled_threshold) must be an integer >= 1, got {k!r}")
        if not 0.0 <= tau <= 1.0:
            raise ValueError(f"decoder accept.tau (pooled_threshold) must be in [0, 1], got {tau!r}")
        if int(anchor) != anchor or anchor < 0:
            raise ValueError(f"decoder accept.anchor (pooled_threshold) must be an integer >= 0 (0: resample "
                             f"from p), got {anchor!r}")
        if confident is not None and not 0.0 < confident <= 1.0:
            raise ValueError(f"decoder accept.confident (pooled_threshold) must be null (off) or in (0, 1], "
                             f"got {confident!r}")
        if int(below) != below or below < 0:
            raise ValueError(f"decoder accept.below (pooled_threshold) must be an integer >= 0 (0: off, n: "
                             f"rescue passes), got {below!r}")
        self.k = int(k)
        self.below = int(below)
        self.tau = float(tau)
        self.anchor = int(anchor)
        self.confident = None if confident is None else float(confident)

    def check_layout(self, draft: DraftSource, scope: RejectionScope) -> None:
        """`below` reads the block as the whole image in raster order after its first token: the
        lowres whole-image draft, verified once by the local scope; otherwise a ValueError."""
        if self.below and not (draft.whole_image and isinstance(scope, LocalScope) and scope.rounds == 1):
            raise ValueError(f"decoder accept.below = {self.below} reads the draft one row below each cell, "
                             f"which needs the block to be the whole image in raster order: the lowres "
                             f"draft with draft.rows=null, scope.kind=local and scope.rounds=1 (got draft "
                             f"{draft.name!r} with {draft.length} drafts per verification, scope "
                             f"{scope.name!r}), or set accept.below=0")

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        """p [B, L, V]; q and u are ignored (the rule is a deterministic threshold)."""
        table = ctx.neighbours(self.k - 1) if self.k > 1 else None
        score = pooled_mass(p, drafts, table)  # accept = score >= tau (Verdict.score)
        if self.confident is not None:  # rejected at every tau: below any threshold in [0, 1]
            score = torch.where(confident_elsewhere(p, drafts, table, self.confident), -1.0, score)
        accept = score >= self.tau
        if self.below:  # no longer a threshold on one score: no one-pass tau curve
            score = None
            # the block is positions 1 .. N of the image (the whole-image draft after the prefill's
            # token, one verification; check_layout holds the decoder to it): N - 1 entries inside
            accept = continued_below(accept, drafts, table, ctx.grid[1], self.below, ctx.n_tokens - 1)
        if self.anchor:
            return Verdict(accept=accept, residual=anchored(p, drafts, anchor_table(ctx, self.anchor)),
                           score=score)
        return Verdict(accept=accept, residual=p, score=score)
