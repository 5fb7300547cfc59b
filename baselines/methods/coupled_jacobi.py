"""Jacobi drafts whose guesses are coupled across iterations: Speculative Coupled Decoding (SCD,
`scd`) and SJD-PAC's Adaptive Continuation (`sjd_pac`).

SJD (baselines/framework/drafts.py, `jacobi`) redraws every guess of the window from the target's
new p after each verification, independently of the guess it replaces. Here the new guess at a
window slot is coupled with the old one, so that a guess whose context barely changed tends to stay
the same (and the next verification tends to accept it). Every coupling below draws the new guess
exactly from p (given the window's drafts before it), so the next verification's q is p, as in SJD,
and the exact rule stays lossless:

- `none`: the loop's independent samples (plain SJD);
- `gumbel` (SCD's Gumbel-max coupling, lumina1/scheduler/jacobi_iteration_lumina_mgpt_GS.py): the
  guess at raster position i is argmax_v(log p(v) + g(i, v)) with Gumbel noise g fixed per (image,
  position, token): the same noise every time position i is drafted, fresh noise per position. The
  noise is a counter-based hash, Philox-4x32 keyed by the image's seed (its ImageStreams key) over
  the counter (token // 4, position, GUMBEL_TAG, 0): recomputed for the window's positions at each
  step, so no [N, V] table is stored per image (O(B x (L+1) x V) work and memory per step, the size
  of p itself) and the noise never depends on the batch. The tag keeps the counters apart from the
  image's uniform stream (which uses counter word 2 = 0);
- `maximal` (SCD's maximal coupling, jacobi_iteration_lumina_mgpt_SCDMC.py `__call__max`; the same
  operation is SJD-PAC's Adaptive Continuation): the old guess x (drawn from q) is kept with
  probability min(1, p(x) / q(x)), else the new guess is drawn from norm(max(p - q, 0)): a maximal
  coupling of q and p whose output is distributed as p. 2L uniforms per image per step.

The token committed at the first rejection (the residual sample) and the bonus token are the loop's,
drawn from the image's stream as in SJD, in every mode: only the guesses for later positions are
coupled (in SCD's code too: its resample uses an independent multinomial).
"""
from __future__ import annotations

import torch
from torch import Tensor

from baselines.framework.acceptance import speculative_verdict
from baselines.framework.canvas import Canvas, Context, span
from baselines.framework.drafts import JacobiDraft, Outcome, _JacobiRun
from harness.runtime.randomness import WORD, philox4x32
from harness.runtime.sampling import sample_from

COUPLINGS = ("none", "gumbel", "maximal")
GUMBEL_TAG = 0x5CD  # counter word 2 of the Gumbel hash (ImageStreams' counters have 0 there)


def keyed_gumbel(keys: Tensor, positions: Tensor, vocab: int) -> Tensor:
    """Gumbel noise fixed per (image, position, token): keys [B, 2] int64 (an ImageStreams' seed
    words), positions [B, T] int64 -> g [B, T, V] float32, g = -log(-log(u)) with u in (0, 1) the
    top 24 bits of a Philox-4x32 word (offset by half a step so that neither end is reached)."""
    blocks = torch.arange((vocab + 3) // 4, device=keys.device)[None, None]  # [1, 1, V/4]
    pos = positions[..., None] & WORD  # [B, T, 1]
    words = philox4x32((blocks, pos, torch.full_like(pos, GUMBEL_TAG), torch.zeros_like(pos)),
                       (keys[:, 0, None, None], keys[:, 1, None, None]))
    flat = torch.stack(torch.broadcast_tensors(*words), -1).flatten(-2)[..., :vocab]  # [B, T, V]
    u = ((flat >> 8).float() + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


def gumbel_argmax(p: Tensor, noise: Tensor) -> Tensor:
    """p [..., V], noise [..., V] -> argmax(log p + noise) [...]: a sample of p (tokens with p = 0
    are never chosen)."""
    return torch.where(p > 0, p.log() + noise, float("-inf")).argmax(-1)


class CoupledJacobiDraft(JacobiDraft):
    """`coupled_jacobi`: SJD's Jacobi drafts whose new guesses are coupled with the old ones
    (module docstring).

    Args:
        window: L, drafts verified per target forward (as `jacobi`).
        init: guesses for positions never reached (as `jacobi`: random | left | above).
        coupling: how a slot's new guess relates to its old one: "none" (SJD), "gumbel" (SCD's
            Gumbel-max with per-image noise per (position, token)) or "maximal" (SCD's maximal
            coupling; SJD-PAC's Adaptive Continuation).
        head, tail: single-token head and tail positions (as `jacobi`).
    """

    name = "coupled_jacobi"

    def __init__(self, window: int = 16, init: str = "random", coupling: str = "gumbel", head: int = 0,
                 tail: int = 0) -> None:
        super().__init__(window=window, init=init, head=head, tail=tail)
        if coupling not in COUPLINGS:
            raise ValueError(f"decoder draft.coupling must be one of {COUPLINGS}, got {coupling!r}")
        self.coupling = coupling

    def start(self, ctx: Context, canvas: Canvas) -> "_CoupledRun":
        return _CoupledRun(self, ctx, canvas)


class _CoupledRun(_JacobiRun):
    """The Jacobi window (tokens [B, L], q [B, L, V]) with coupled redraws."""

    source: CoupledJacobiDraft

    def _samples(self, outcome: Outcome) -> Tensor:
        """The next guesses at offsets 0..L [B, L+1] (module docstring); offset L (past the drafts)
        keeps the loop's sample from p in the `maximal` mode, which has no old guess there."""
        coupling = self.source.coupling
        if coupling == "none":
            return outcome.samples
        length = self.source.length
        if coupling == "gumbel":
            positions = outcome.start[:, None] + span(length + 1, outcome.start.device)  # [B, L+1]
            return gumbel_argmax(outcome.p, keyed_gumbel(self.ctx.streams.keys, positions, self.ctx.vocab))
        # maximal: keep x with min(1, p(x) / q(x)), else draw from norm(max(p - q, 0))
        p = outcome.p[:, :length]
        u = self.ctx.streams.draw((length,))
        verdict = speculative_verdict(p, self.q, self.tokens, u)
        fresh = sample_from(verdict.residual, self.ctx.streams)  # [B, L]
        kept = torch.where(verdict.accept, self.tokens, fresh)
        return torch.cat([kept, outcome.samples[:, length:]], 1)
