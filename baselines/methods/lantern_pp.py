"""`lantern_pp`: LANTERN++'s relaxed acceptance (Park et al., ICLR 2025 workshop SCOPE; github
jadohu/LANTERN @3a56e45, models/ea_model_llamagen.py `evaluate_posterior_v1`, the `lantern_delta >
1` branch) over its static, sampled draft trees (baselines/methods/static_tree.py).

A node's children x_1, x_2, ... were drawn from the drafter's q without replacement, in rank order.
Child j is tried against the target's p (what remains of it after the earlier siblings failed):

    q_j     = q without x_1 .. x_{j-1}, renormalised     (LANTERN: the drafter's `sampled_probs`,
                                                          q(x_j) / (1 - sum_{i<j} q(x_i)))
    A       = the longest prefix of x_j's k nearest codes (tokenizer latent space) whose cumulative
              p is <= (lambda - 1) p(x_j)                (the relative, multiplicative budget)
    accept  with probability min(1, (p(x_j) + p(A)) / q_j(x_j))
    reject  p <- normalise(max(p - q_j', 0)), q_j' = q_j with x_j's k + 1 nearest codes zeroed when A
            was not empty (LANTERN's code: the neighbours keep their p in the residual); a residual
            without mass becomes uniform. A child with q_j(x_j) = 0 is skipped.

A is a prefix as soon as the first neighbour's cumulative p is within budget, also at p = 0 (LANTERN's
code, `pooled_if: prefix` of `lantern`). lambda = 1 turns the relaxation off (LANTERN's code takes the
relative form only for lambda > 1): then this is the recursive rejection sampling of sampled multi-
draft trees (EAGLE's static trees, SpecInfer), lossless. The greedy branch (temperature 0: top-c
drafts, q = None) is LANTERN's relaxed argmax (`lantern`'s `greedy_boost`) with the relative budget.
"""
from __future__ import annotations

import torch
from torch import Tensor

from baselines.framework.acceptance import LanternRule, Verdict, _normalise
from baselines.framework.canvas import Context
from harness.api import ConfigValueError, checked_number


class RelativeLanternRule(LanternRule):
    """`lantern_pp` (module docstring).

    Args:
        k: latent neighbours considered per candidate (LANTERN's run.sh: 10 with lambda 5; 5 with
            lambda 10 or 20; clamped to V - 1).
        lam: lambda >= 1, the relative budget: the pooled mass is at most (lambda - 1) p(x), so
            p~(x) <= lambda p(x) (run.sh: 5, 10, 20; 1 = exact).
        metric: how neighbours are found: "raw" (LANTERN's table) or "normalised" (NEIGHBOUR_METRICS).
    """

    name = "lantern_pp"

    def __init__(self, k: int = 10, lam: float = 5.0, metric: str = "raw") -> None:
        checked_number("decoder accept.k", k, integer=True, low=1)
        self.lam = float(checked_number("decoder accept.lam", lam, low=1))
        super().__init__(k=k, delta=0.0, metric=metric, on_reject="neighbourhood", pooled_if="prefix")

    def _budget(self, dist: Tensor, x: Tensor) -> Tensor:
        """(lambda - 1) p(x) [..., 1] for dist [..., V], x [...]."""
        return (self.lam - 1.0) * dist.gather(-1, x[..., None])

    def _prefix(self, dist: Tensor, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """LanternRule._prefix with the relative budget; lambda = 1 pools nothing."""
        zone, count, moved = super()._prefix(dist, x, ctx)
        if self.lam == 1.0:
            return zone, torch.zeros_like(count), torch.zeros_like(moved)
        return zone, count, moved

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        raise ConfigValueError("decoder accept lantern_pp (RelativeLanternRule) verifies static draft trees "
                               "(baselines.methods.tree_decoding.TreeDecoder with a StaticTreeDraft); a chain "
                               "decoder takes baselines.framework.acceptance.LanternRule")

    def drafted_siblings(self, dist: Tensor, q: Tensor, xs: Tensor, valid: Tensor, u: Tensor,
                         ctx: Context) -> tuple[Tensor, Tensor]:
        """The children of a node, one after the other (module docstring): dist, q [N, V] (the
        target's p and the drafter's q at the node), xs / valid / u [N, K] the children in draw
        order -> (the accepted child [N], -1 for none; p after the rejections [N, V])."""
        taken = torch.full(xs.shape[:1], -1, dtype=torch.long, device=xs.device)
        uniform = torch.full_like(dist, 1.0 / dist.shape[-1])
        rest = q  # the drafter's mass not drawn yet
        for j in range(xs.shape[1]):
            x = xs[:, j, None]  # [N, 1]
            total = rest.sum(-1, keepdim=True)
            qj = rest / total.clamp_min(1e-30)
            qx = qj.gather(-1, x)[:, 0]
            live = valid[:, j] & (taken < 0) & (qx > 0)
            zone, count, moved = self._prefix(dist, x[:, 0], ctx)
            prob = dist.gather(-1, x)[:, 0] + moved  # p~(x)
            take = live & (u[:, j] * qx < prob)  # u < p~ / q_j without dividing
            pooled = (count > 0)[:, None]
            subtract = qj.scatter(-1, zone, qj.gather(-1, zone).masked_fill(pooled, 0.0))
            after = _normalise((dist - subtract).clamp_min(0.0), uniform)
            dist = torch.where((live & ~take)[:, None], after, dist)
            taken = torch.where(take, j, taken)
            rest = torch.where(valid[:, j, None], rest.scatter(-1, x, 0.0), rest)
        return taken, dist
