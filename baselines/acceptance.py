"""Acceptance rules: given the target's p and the drafts, decide which drafts are accepted and from
which distribution a rejected position is resampled. Vectorised over batch and draft positions;
randomness comes in as uniforms drawn from the per-image random streams by the loop.

A rule sees, for one verification of L drafts:
    p       [B, L, V]  target distribution at each draft position (CFG -> temperature -> top-k ->
                       top-p, harness/sampling.py), conditioned on the drafts before it;
    q       [B, L, V]  the distribution each draft was drawn from, or None for drafts that are a
                       deterministic function of earlier randomness (q = one-hot on the draft);
    drafts  [B, L]     int64;
    u       [B, L]     uniforms in [0, 1), one per position.
and returns a `Verdict`: accept [B, L] bool and residual [B, L, V] (normalised). Decisions after
the first rejection are computed too; the rejection scope decides which ones count.

Rules: `exact` (speculative sampling; lossless) and `lantern` (LANTERN's latent-proximity
relaxation). MuLo-SD's `pooled_threshold` plugs in the same way: accept = pooled p >= tau (no q,
no uniforms), residual = p.

Over a draft tree (EAGLE-2, LANTERN; baselines/tree_decoding.py) the same two rules decide one
candidate at a time (`candidate`): `accept_tree` walks the tree from the root, tries the children
of the current node in the drafter's rank order, accepts child x with the rule's probability (the
tree's drafts are a deterministic top-k, q = 1), otherwise replaces p by the rule's distribution
after rejecting x and tries the next sibling; when every child fails (or a leaf is reached) the
token is drawn from what remains. With `exact` this is sampling without replacement: lossless.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from baselines.canvas import NEIGHBOUR_METRICS, Context
from harness.hostsync import width


@dataclass(frozen=True)
class Verdict:
    """accept [B, L] bool; residual [B, L, V]: where a rejected position is resampled from."""

    accept: Tensor
    residual: Tensor


class AcceptanceRule(Protocol):
    name: str

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        """p [B, L, V], q [B, L, V] or None, drafts [B, L], u [B, L] -> Verdict."""
        ...


def _at(dist: Tensor, tokens: Tensor) -> Tensor:
    """dist [B, L, V], tokens [B, L] -> dist[b, l, tokens[b, l]] [B, L]."""
    return dist.gather(-1, tokens[..., None]).squeeze(-1)


def _normalise(mass: Tensor, fallback: Tensor) -> Tensor:
    """mass [..., V] >= 0 -> mass / sum; rows without mass take `fallback` (they only arise where
    the acceptance probability is 1, so they are never sampled)."""
    total = mass.sum(-1, keepdim=True)
    return (mass / total.clamp_min(1e-30)).where(total > 0, fallback)


def speculative_verdict(p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor) -> Verdict:
    """Speculative sampling (Leviathan et al.; Chen et al.): accept draft x with probability
    min(1, p(x) / q(x)); on rejection resample from normalise(max(p - q, 0)). The output token is
    then distributed exactly as p whenever x ~ q."""
    px = _at(p, drafts)
    if q is None:  # q = one-hot(x): accept with probability p(x), residual = p without x
        accept = u < px
        residual = p.scatter(-1, drafts[..., None], 0.0)
    else:
        accept = u * _at(q, drafts) < px  # u < p/q without dividing (q(x) > 0 for a drawn x)
        residual = (p - q).clamp_min(0.0)
    return Verdict(accept=accept, residual=_normalise(residual, p))


class ExactRule:
    """`exact`: lossless speculative sampling (SJD, draft-model SD; EAGLE-2's multi-candidate
    acceptance over a draft tree, `candidate`)."""

    name = "exact"

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        return speculative_verdict(p, q, drafts, u)

    def candidate(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """One tree candidate: dist [B, V] (p, or what is left of it after rejected siblings), x [B]
        -> (accept probability p(x) [B], the distribution after rejecting x: dist without x,
        renormalised [B, V])."""
        px = dist.gather(-1, x[:, None])[:, 0]
        return px, _normalise(dist.scatter(-1, x[:, None], 0.0), dist)

    def siblings(self, dist: Tensor, xs: Tensor, valid: Tensor, u: Tensor,
                 ctx: Context) -> tuple[Tensor, Tensor]:
        """All children of a node at once (`candidate` one after the other, in closed form): sibling
        j (distinct tokens) is accepted when the earlier ones were not and u_j < p(x_j) / (1 - the
        mass of the earlier ones). dist [B, V], xs / valid / u [B, K] -> (accepted sibling [B] or -1,
        dist without every valid child, renormalised [B, V])."""
        px = dist.gather(-1, xs) * valid
        before = px.cumsum(-1) - px
        ratio = torch.where(px > 0, px / (1.0 - before).clamp_min(1e-30), torch.zeros_like(px))
        hit = valid & (u < ratio)
        taken = torch.where(hit.any(-1), hit.long().argmax(-1), -1)
        removed = torch.zeros_like(dist).scatter_add(-1, xs, px)
        return taken, _normalise((dist - removed).clamp_min(0.0), dist)


def lantern_boost(p: Tensor, drafts: Tensor, neighbours: Tensor, delta: float) -> Tensor:
    """LANTERN's latent-proximity aware distribution, one per draft position.

    For draft x with neighbours n_1, n_2, ... (nearest first in the tokenizer's latent space), keep
    the longest prefix A = {n_1..n_m} whose cumulative target mass is <= delta and move that mass
    onto x: p~(x) = p(x) + p(A), p~(a) = 0 for a in A, p~ = p elsewhere. Moving mass m changes p by
    exactly m in total variation, so TVD(p, p~) <= delta.

    Args:
        p: [B, L, V] target distributions; drafts: [B, L]; neighbours: [V, k] int64 table.
    Returns:
        p~ [B, L, V]; equal to p, bit for bit, when delta = 0.
    """
    near = neighbours[drafts]  # [B, L, k]
    near_p = p.gather(-1, near)  # [B, L, k]
    cum = near_p.cumsum(-1)
    kept = cum <= delta  # a prefix, since cum is non-decreasing
    count = kept.sum(-1, keepdim=True)  # m
    moved = cum.gather(-1, (count - 1).clamp_min(0)).where(count > 0, 0.0)  # p(A) [B, L, 1]
    boosted = p.scatter(-1, near, near_p.masked_fill(kept, 0.0))
    return boosted.scatter(-1, drafts[..., None], _at(p, drafts)[..., None] + moved)


class LanternRule:
    """`lantern` (LANTERN, Jang et al., ICLR 2025, §3.5 of decoding_anchors.md): speculative
    sampling against LANTERN's p~ (see `lantern_boost`): accept with min(1, p~(x) / q(x)); on
    rejection resample from normalise(max(p~ - q, 0)), which leaves out x and the neighbours whose
    mass x absorbed (with LANTERN's one-hot tree drafts this is its "zero x and its neighbours,
    renormalise"). Not lossless: each position's distribution moves by at most delta in TVD.
    With sampled chain drafts q is the drafter's distribution, as in LANTERN++'s static trees
    (LANTERN's EAGLE-2 top-k tree uses q = 1); with q = None the ratio is p~(x).

    Over a draft tree (`candidate`, LANTERN's evaluate_posterior): accept x with probability
    p(x) + p(A) (A: x's pooled neighbours, computed on what is left of p after rejected siblings);
    on rejection zero x and, when x pooled any mass, its k + 1 nearest codes (`on_reject:
    neighbourhood`, LANTERN's code) or only the pooled ones (`pooled`), and renormalise; a
    distribution with no mass left becomes uniform over the codebook (LANTERN's fallback). Unlike
    LANTERN's code, a prefix of neighbours with zero mass pools nothing, so delta = 0 is `exact`.

    Args:
        k: latent neighbours considered per draft token (the paper's comparison: 1000; clamped
            to V - 1).
        delta: total-variation budget in [0, 1] (the paper's comparison: 0.4; 0 = `exact`).
        metric: how neighbours are found (NEIGHBOUR_METRICS): "raw" (L2 between the tokenizer's
            stored code vectors: LANTERN's generate_codebook.py) or "normalised" (L2 between the
            l2-normalised codes the VQ quantiser matches).
        on_reject: tree candidates only: "neighbourhood" or "pooled" (above).

    In greedy mode p is one-hot, so for delta < 1 the rule accepts exactly the argmax (LANTERN's
    own greedy variant instead relaxes the argmax over softmax probabilities).
    """

    name = "lantern"
    ON_REJECT = ("neighbourhood", "pooled")

    def __init__(self, k: int = 1000, delta: float = 0.4, metric: str = "raw",
                 on_reject: str = "neighbourhood") -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"decoder.lantern accept.k must be an integer >= 1, got {k!r}")
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"decoder.lantern accept.delta must be a TVD budget in [0, 1], got {delta!r} "
                             "(LANTERN++'s relative lambda form is not implemented)")
        if metric not in NEIGHBOUR_METRICS:
            raise ValueError(f"decoder.lantern accept.metric must be one of {NEIGHBOUR_METRICS}, "
                             f"got {metric!r}")
        if on_reject not in self.ON_REJECT:
            raise ValueError(f"decoder.lantern accept.on_reject must be one of {self.ON_REJECT}, "
                             f"got {on_reject!r}")
        self.k = int(k)
        self.delta = float(delta)
        self.metric = metric
        self.on_reject = on_reject

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        boosted = lantern_boost(p, drafts, ctx.neighbours(self.k, self.metric), self.delta)
        return speculative_verdict(boosted, q, drafts, u)

    def candidate(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor]:
        """One tree candidate (see the class docstring): dist [B, V], x [B] -> (accept probability
        p(x) + p(A) [B], the distribution after rejecting x [B, V])."""
        zone = ctx.neighbours(self.k + 1, self.metric)[x]  # [B, k + 1] nearest first (one table for both)
        near = zone[:, :self.k]  # [B, k]
        cum = dist.gather(-1, near).cumsum(-1)
        count = (cum <= self.delta).sum(-1)  # m: the pooled prefix
        moved = cum.gather(-1, (count - 1).clamp_min(0)[:, None])[:, 0].where(count > 0, 0.0)
        pooled = moved > 0
        prob = dist.gather(-1, x[:, None])[:, 0] + moved
        if self.on_reject == "neighbourhood":  # LANTERN zeroes nearest_latents[x, :k+1]
            drop = torch.ones_like(zone, dtype=torch.bool)
        else:
            zone = near
            drop = torch.arange(near.shape[1], device=near.device)[None] < count[:, None]
        drop = drop & pooled[:, None]
        after = dist.scatter(-1, x[:, None], 0.0)
        after = after.scatter(-1, zone, after.gather(-1, zone).masked_fill(drop, 0.0))
        uniform = torch.full_like(dist, 1.0 / dist.shape[-1])
        return prob, _normalise(after, uniform)


@dataclass(frozen=True)
class TreeVerdict:
    """The walk over one draft tree per row: path [B, L] (block indices of the accepted nodes level
    by level, 0 past `accepted`), accepted [B], dist [B, V] (where the token after the path is drawn
    from: what was left after rejections, or the target's p at the last accepted node) and
    rejected [B] bool (the walk stopped at a level whose candidates were all rejected)."""

    path: Tensor
    accepted: Tensor
    dist: Tensor
    rejected: Tensor


class TreeRule(Protocol):
    name: str

    def candidate(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor]: ...


def sequential_siblings(rule: TreeRule, dist: Tensor, xs: Tensor, valid: Tensor, u: Tensor,
                        ctx: Context) -> tuple[Tensor, Tensor]:
    """One node's children tried one after the other with `rule.candidate`: dist [B, V], xs [B, K]
    the children's tokens in rank order, valid [B, K], u [B, K] -> (the accepted sibling [B], -1
    for none; the distribution after the rejections [B, V], meaningful where none was accepted)."""
    taken = torch.full(xs.shape[:1], -1, dtype=torch.long, device=xs.device)
    for j in range(xs.shape[1]):
        prob, after = rule.candidate(dist, xs[:, j], ctx)
        live = valid[:, j] & (taken < 0)
        take = live & (u[:, j] < prob)
        dist = torch.where((live & ~take)[:, None], after, dist)
        taken = torch.where(take, j, taken)
    return taken, dist


def accept_tree(p: Tensor, children: Tensor, tokens: Tensor, u: Tensor, limit: Tensor, rule: TreeRule,
                ctx: Context) -> TreeVerdict:
    """Multi-candidate acceptance over a draft tree (module docstring), vectorised over rows; a rule
    with `siblings` decides all children of a node at once (ExactRule), others one by one
    (`sequential_siblings` over `candidate`).

    Args:
        p: [B, 1+m, V] the target's distribution after each block node (0 = the root).
        children: [B, 1+m, K] block indices of each node's children in rank order, -1 = none.
        tokens: [B, 1+m] the block's tokens.
        u: [B, L, K] uniforms: one per (level, sibling), drawn whether used or not.
        limit: [B] most tokens a row may accept (positions left in its image).
        rule: decides the candidates (`siblings` or `candidate`).
    """
    b, levels, k = u.shape
    rows = torch.arange(b, device=p.device)
    if children.numel():  # the widest sibling set: read on the CPU, all K columns elsewhere
        children = children[..., :max(width((children >= 0).sum(-1).max(), children.shape[-1]), 1)]
    siblings = getattr(rule, "siblings", None)
    cur = torch.zeros(b, dtype=torch.long, device=p.device)
    dist = p[:, 0]
    searching = limit > 0
    accepted = torch.zeros_like(cur)
    path = torch.zeros(b, levels, dtype=torch.long, device=p.device)
    rejected = torch.zeros_like(searching)
    for level in range(levels):
        kids = children[rows, cur]  # [B, K']
        valid = (searching & (level < limit))[:, None] & (kids >= 0)
        xs = tokens.gather(1, kids.clamp_min(0))
        uu = u[:, level, :kids.shape[1]]
        if siblings is not None:
            taken, after = siblings(dist, xs, valid, uu, ctx)
        else:
            taken, after = sequential_siblings(rule, dist, xs, valid, uu, ctx)
        moved = taken >= 0
        tried = valid.any(-1) & ~moved
        cur = torch.where(moved, kids.gather(1, taken.clamp_min(0)[:, None])[:, 0], cur)
        path[:, level] = torch.where(moved, cur, path[:, level])
        dist = torch.where(moved[:, None], p[rows, cur], torch.where(tried[:, None], after, dist))
        rejected = torch.where(searching & ~moved, tried, rejected)
        accepted += moved.long()
        searching = searching & moved
    return TreeVerdict(path=path, accepted=accepted, dist=dist, rejected=rejected)
