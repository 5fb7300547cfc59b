"""`grouped`: GSD's acceptance rule (Grouped Speculative Decoding, So et al., ICCV 2025; github
junhyukso/GSD @4216c7c, scheduler/jacobi_iteration_lumina_mgpt.py `SpeculativeSampler.__call__`
against its SJD twin, scheduler/jacobi_iteration_lumina_mgpt_sjd.py). Lossy: it relaxes SJD's test
from one token to a group of tokens that look alike to the model.

For a draft d with target distribution p and draft distribution q (one position of the chain):

    order   = codes sorted by p, ascending (GSD sorts the processed logits: the same order)
    r       = d's place in `order`
    window  = order[r - w : r + w]            (GSD's slice with w = 7: 7 codes below d, 6 above)
    G       = {d} + {g in window : |p(g) - p(d)| < p_threshold and ||E[g] - E[d]||^2 < e_threshold}
    accept  with probability min(1, sum_G p / sum_G q)
    reject  -> resample from normalise(max(p - q, 0)), SJD's residual (GSD's
               `reject_sampling_single_token` is SJD's, unchanged)

E is the target's input token embedding (GSD: `model.embed_tokens.weight[:10000]`, the rows of
Chameleon's image codes; here the GPT's `tok_embeddings`, every code of the image vocabulary).

Departures, each forced by a corner GSD's code does not reach on Lumina-mGPT's 8192 image codes:
- d is always in G. GSD's window always holds d (and its own thresholds keep it: both distances
  are 0), except when r < w, where its Python slice start wraps round and the window is empty
  (0 / 0: the draft is rejected); here the window is cut at the first code instead. Small
  vocabularies (a few codes) meet this case on every draft.
- G needs no fallback: GSD falls back to SJD's ratio only on an exception; sum_G q >= q(d) > 0 for a
  drafted d.
With w = 0, or either threshold 0, G = {d} and the rule is SJD's `exact` rule, bit for bit.

The embedding threshold is on a squared L2 distance, so it depends on the embedding's scale: 0.5
is GSD's constant for Lumina-mGPT-7B's 4096-wide embedding. A model whose embedding rows are far
apart (e.g. a small GPT initialised with unit-variance rows: squared distances ~ 2 x width) keeps
no neighbour at 0.5 and decodes as SJD; one whose rows are close keeps every window code that
passes the probability test. docs/field.md lists the typical distances of the
project's models.
"""
from __future__ import annotations

import torch
from torch import Tensor

from baselines.framework.acceptance import Verdict, speculative_verdict
from baselines.framework.canvas import Context
from harness.api import ConfigValueError, checked_number


class GroupedRule:
    """`grouped` (GSD). See the module docstring.

    Args:
        rank_window: w, the half-width of the rank window around the draft (GSD: 7; the window is
            the w codes just below d in p's order and the w - 1 just above it; 0 = SJD).
        p_threshold: a window code joins the group if its target probability differs from the
            draft's by less than this (GSD: 0.15; 0 = SJD).
        embed_threshold: ... and if its squared L2 distance to the draft in the target's input
            token embedding is less than this (GSD: 0.5; 0 = SJD; scale-dependent, module docstring).
    """

    name = "grouped"

    def __init__(self, rank_window: int = 7, p_threshold: float = 0.15, embed_threshold: float = 0.5) -> None:
        self.rank_window = checked_number("decoder accept.rank_window", rank_window, integer=True, low=0)
        self.p_threshold = float(checked_number("decoder accept.p_threshold", p_threshold, low=0))
        self.embed_threshold = float(checked_number("decoder accept.embed_threshold", embed_threshold, low=0))

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        """p [B, L, V], q [B, L, V] or None (one-hot on the draft), drafts [B, L], u [B, L] ->
        Verdict: accept where u * sum_G q < sum_G p; SJD's residual."""
        exact = speculative_verdict(p, q, drafts, u)
        others = self.group(p, drafts, _embeddings(ctx))  # [B, L, 2w - 1] codes, -1 = not in G
        if others.shape[-1] == 0:
            return exact
        x = drafts[..., None]
        kept = others >= 0
        g = others.clamp_min(0)
        mass_p = p.gather(-1, x)[..., 0] + (p.gather(-1, g) * kept).sum(-1)  # sum_G p [B, L]
        if q is None:  # q = one-hot(d): sum_G q = 1
            mass_q = torch.ones_like(mass_p)
        else:
            mass_q = q.gather(-1, x)[..., 0] + (q.gather(-1, g) * kept).sum(-1)
        return Verdict(accept=u * mass_q < mass_p, residual=exact.residual)

    def group(self, p: Tensor, drafts: Tensor, embeddings: Tensor) -> Tensor:
        """The group of every draft but the draft itself: p [B, L, V], drafts [B, L], embeddings
        [V, dim] -> codes [B, L, 2w - 1], -1 where a window slot is outside the codebook or fails a
        threshold."""
        w, v = self.rank_window, p.shape[-1]
        offsets = torch.cat([torch.arange(-w, 0), torch.arange(1, max(w, 1))]).to(p.device)  # d excluded
        if offsets.numel() == 0:
            return drafts.new_empty(*drafts.shape, 0)
        order = torch.sort(p, dim=-1, stable=True).indices  # [B, L, V] ascending
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(v, device=p.device).expand_as(order))
        at = rank.gather(-1, drafts[..., None]) + offsets  # [B, L, 2w - 1] places in `order`
        inside = (at >= 0) & (at < v)
        codes = order.gather(-1, at.clamp(0, v - 1))
        px = p.gather(-1, drafts[..., None])
        close_p = (p.gather(-1, codes) - px).abs() < self.p_threshold
        e = embeddings.float()
        dist = (e[codes] - e[drafts][..., None, :]).square().sum(-1)  # squared L2 [B, L, 2w - 1]
        keep = inside & close_p & (dist < self.embed_threshold)
        return codes.masked_fill(~keep, -1)


def _embeddings(ctx: Context) -> Tensor:
    """The target's input token embedding [V, dim] on the decode device."""
    target = ctx.models.target
    table = getattr(target, "token_embeddings", None)
    if table is None:
        raise ConfigValueError(f"model {ctx.models.name!r}: its target ({type(target).__name__}) exposes no input "
                               "token embedding (`token_embeddings`), which GSD's groups are measured in; use a "
                               "GPT-based target (TokenImageModel) or decoder sjd")
    if table.shape[0] != ctx.vocab:
        raise ConfigValueError(f"model {ctx.models.name!r}: its token embedding has {table.shape[0]} rows for "
                               f"{ctx.vocab} codes; GSD needs one row per code")
    return table.detach().to(ctx.device)
