"""Acceptance rules: given the target's p and the drafts, decide which drafts are accepted and from
which distribution a rejected position is resampled. Vectorised over batch and draft positions;
randomness comes in as uniforms drawn from the per-image generators by the loop.

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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from baselines.canvas import Context


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
    """`exact`: lossless speculative sampling (SJD, draft-model SD)."""

    name = "exact"

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        return speculative_verdict(p, q, drafts, u)


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

    Args:
        k: latent neighbours considered per draft token (the paper's comparison: 1000; clamped
            to V - 1).
        delta: total-variation budget in [0, 1] (the paper's comparison: 0.4; 0 = `exact`).

    In greedy mode p is one-hot, so for delta < 1 the rule accepts exactly the argmax (LANTERN's
    own greedy variant instead relaxes the argmax over softmax probabilities).
    """

    name = "lantern"

    def __init__(self, k: int = 1000, delta: float = 0.4) -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"decoder.lantern accept.k must be an integer >= 1, got {k!r}")
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"decoder.lantern accept.delta must be a TVD budget in [0, 1], got {delta!r} "
                             "(LANTERN++'s relative lambda form is not implemented)")
        self.k = int(k)
        self.delta = float(delta)

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        boosted = lantern_boost(p, drafts, ctx.neighbours(self.k), self.delta)
        return speculative_verdict(boosted, q, drafts, u)
