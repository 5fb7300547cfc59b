"""MuLo-SD's acceptance rule `pooled_threshold(k, tau)` (paper.md §5): a deterministic threshold on
the target's probability pooled over the draft token's codebook neighbourhood.

    accept x~_i  iff  sum_{x in B_k(x~_i)} p_i(x) >= tau

B_k(x) = x itself and its k - 1 nearest other codes in the tokenizer's latent space (L2 between code
vectors, harness/neighbours.py); k = 1 is "draft-token probability only" (ablation b). There is no
drafter probability q in the rule (the up-sampler yields tokens, not a distribution) and no
uniform: the rule is deterministic given p. A rejected position is resampled from p itself.
"""
from __future__ import annotations

from torch import Tensor

from baselines.acceptance import Verdict
from baselines.canvas import Context


def pooled_mass(p: Tensor, drafts: Tensor, neighbours: Tensor | None) -> Tensor:
    """p [B, L, V], drafts [B, L], neighbours [V, k-1] int64 (or None for k = 1) -> [B, L]: the mass
    of p on the draft token plus its listed neighbours."""
    mass = p.gather(-1, drafts[..., None]).squeeze(-1)
    if neighbours is not None:
        mass = mass + p.gather(-1, neighbours[drafts]).sum(-1)  # neighbours never include x itself
    return mass


class PooledThresholdRule:
    """`pooled_threshold`: accept when the pooled target mass of the draft's k-neighbourhood is >= tau.

    Args:
        k: codebook neighbourhood size, the draft token included (>= 1; clamped to V).
        tau: threshold in [0, 1]; 0 accepts every draft, higher is closer to the target.

    With greedy sampling p is one-hot on the argmax, so for 0 < tau <= 1 the rule accepts exactly
    when the argmax lies in the draft's neighbourhood.
    """

    name = "pooled_threshold"

    def __init__(self, k: int = 16, tau: float = 0.1) -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"decoder accept.k (pooled_threshold) must be an integer >= 1, got {k!r}")
        if not 0.0 <= tau <= 1.0:
            raise ValueError(f"decoder accept.tau (pooled_threshold) must be in [0, 1], got {tau!r}")
        self.k = int(k)
        self.tau = float(tau)

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        """p [B, L, V]; q and u are ignored (the rule is a deterministic threshold)."""
        table = ctx.neighbours(self.k - 1) if self.k > 1 else None
        accept = pooled_mass(p, drafts, table) >= self.tau
        return Verdict(accept=accept, residual=p)
