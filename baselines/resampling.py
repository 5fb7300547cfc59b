"""MuLo-SD's resamplers: refill the resample set R_X \\ {t0} of a `local` scope with target forwards
(paper.md §6-7), following a `serial` or `parallel` (rejection islands) schedule
(baselines/islands.py).

Each forward of a step s feeds, per batch row, only what it needs at per-row positions:
    - the tokens drawn in step s - 1 (t0 for s = 0), so their K/V enter the cache;
    - for every position u drawn in step s, the token at u - 1, whose output predicts u.
Queries attend slot-causally; the two open points of the paper are options:
    context  "visible": positions of R_X not yet redrawn are seen with their rejected drafts;
             "masked": they are hidden (a query still sees its own slot, ZipAR's stand-in).
             (Serial resampling never has such a position before a query: both give the same.)
    kv       "refresh": the kept drafts after t0, whose K/V were computed next to rejected drafts,
             are re-encoded by the next verification forward (kv_valid = t0);
             "stale": they keep those K/V; the next verification re-feeds only from the first
             redrawn token whose K/V was never written (those of the last step);
             "inline": each kept draft after t0 is re-fed by the first resampling forward after
             every redrawn position before it is drawn, so the resampler never attends to a K/V
             computed next to a rejected draft (wider forwards, no extra ones; serial resampling
             then decodes like raster with the kept drafts forced).
             Under "refresh" and "stale" the resampler itself reads the kept drafts' old K/V.
`anchor` a >= 1 (an extension; baselines/pooled.py) draws each position from the target's p
restricted to the a-neighbourhood of the token there before the redraw (the draft).
Every image draws L uniforms per call whatever its batch, so images do not depend on the batch.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from baselines.canvas import Canvas, Context, feed_positions
from baselines.islands import block_islands, island_steps, serial_steps
from baselines.pooled import anchor_table, anchored
from baselines.scope import Resolution
from harness.models.masks import attention_mask
from harness.sampling import inverse_cdf, probs, uniforms

SCHEDULES = ("serial", "parallel")
CONTEXTS = ("visible", "masked")
KV_MODES = ("refresh", "stale", "inline")


def pack(selected: Tensor) -> tuple[Tensor, Tensor]:
    """selected [B, L] bool -> (offsets [B, W] of the selected entries first, ascending; valid
    [B, W]) with W = the largest count in the batch (>= 1)."""
    length = selected.shape[1]
    offsets = torch.arange(length, device=selected.device)
    width = max(int(selected.sum(-1).max()), 1)
    key = torch.where(selected, offsets, offsets + length)  # selected first, each group in order
    order = key.argsort(-1)[:, :width]
    return order, selected.gather(1, order)


class IslandResampler:
    """Refills R_X \\ {t0} (see the module docstring).

    Args:
        schedule: "serial" (raster order, one position per target forward) or "parallel"
            (8-connected rejection islands advanced together, ZipAR-style inside an island).
        window: parallel only: tokens an island row needs before the next row starts (>= 1;
            >= the grid's cols decodes each island in raster order).
        context: "visible" or "masked" (not-yet-resampled positions as context).
        kv: "refresh", "stale" or "inline" (K/V of kept drafts after t0).
        anchor: 0 (draw from p) or a >= 1 (from p on the a-neighbourhood of the token there).
    """

    def __init__(self, schedule: str = "parallel", window: int = 2, context: str = "masked",
                 kv: str = "refresh", anchor: int = 0) -> None:
        for key, value, options in (("schedule", schedule, SCHEDULES), ("context", context, CONTEXTS),
                                    ("kv", kv, KV_MODES)):
            if value not in options:
                raise ValueError(f"decoder resampler.{key} must be one of {options}, got {value!r}")
        if int(window) != window or window < 1:
            raise ValueError(f"decoder resampler.window must be an integer >= 1, got {window!r}")
        if int(anchor) != anchor or anchor < 0:
            raise ValueError(f"decoder resampler.anchor must be an integer >= 0 (0: draw from p), got {anchor!r}")
        self.schedule, self.window, self.context, self.kv = schedule, int(window), context, kv
        self.anchor = int(anchor)
        self.name = f"{schedule}({context},{kv})"

    def fill(self, ctx: Context, canvas: Canvas, res: Resolution) -> tuple[Resolution, Tensor]:
        """Redraw res.resample (offsets from canvas.frontier); return (resolution with kv_valid
        for the kv mode, target forwards [B])."""
        start, length = canvas.frontier, res.resample.shape[1]
        offsets = torch.arange(length, device=start.device)
        if self.schedule == "serial":
            steps = serial_steps(res.resample)
            members = res.resample | (offsets[None] == res.first[:, None])
            labels = block_islands(members, start, ctx.grid)
        else:
            steps, labels = island_steps(res.resample, res.first, start, ctx.grid, self.window)
        u = uniforms(ctx.gens, (length,), ctx.device)  # L draws per image, used or not
        forwards = steps.max(-1).values + 1  # [B]
        ready = self._kept_ready(steps, res) if self.kv == "inline" else None
        for s in range(int(forwards.max())):
            self._forward(ctx, canvas, steps, res.first, s, u, ready)
        self._count(ctx, res, labels, forwards)
        return replace(res, kv_valid=self._kv_valid(res, steps, forwards, ready)), forwards

    @staticmethod
    def _kept_ready(steps: Tensor, res: Resolution) -> Tensor:
        """steps [B, L] -> [B, L]: the step at which each kept draft after t0 (res.keep) is re-fed
        (one past the last step drawing a position before it; every redrawn position before it is
        then final), -1 for every other offset."""
        offsets = torch.arange(steps.shape[1], device=steps.device)
        before = torch.cat([torch.full_like(steps[:, :1], -1), steps[:, :-1]], 1).cummax(1).values
        kept = res.keep & (offsets[None] > res.first[:, None])
        return torch.where(kept, before + 1, -1)

    def _forward(self, ctx: Context, canvas: Canvas, steps: Tensor, first: Tensor, s: int, u: Tensor,
                 ready: Tensor | None = None) -> None:
        """One target forward: draw every offset of step s (steps [B, L]) into the canvas; with
        `ready` [B, L] (kv "inline") also re-feed the kept drafts whose turn is step s."""
        start, (b, length) = canvas.frontier, steps.shape
        offsets = torch.arange(length, device=start.device)
        fresh = (steps == s - 1) if s else (offsets[None] == first[:, None])
        if ready is not None:
            fresh = fresh | (ready == s)
        drawn = steps == s
        queries = torch.cat([drawn[:, 1:], torch.zeros_like(drawn[:, :1])], 1)  # offset o predicts o + 1
        feed, feed_ok = pack(fresh | queries)
        index = start[:, None] + feed
        tokens = canvas.tokens.gather(1, index)
        positions = torch.where(feed_ok, feed_positions(index, ctx.n_tokens), ctx.n_tokens - 1)
        mask = self._mask(ctx, start, positions, steps >= s) if self.context == "masked" else None
        logits = ctx.models.target.forward(tokens, positions, mask)  # [B, W, V]
        slot_of = torch.zeros(b, length + 1, dtype=torch.long, device=start.device)  # offset -> input
        inputs = torch.arange(feed.shape[1], device=start.device).expand(b, -1)
        slot_of.scatter_(1, torch.where(feed_ok, feed, length), inputs)
        out, out_ok = pack(drawn)
        source = slot_of.gather(1, (out - 1).clamp_min(0))
        picked = logits.gather(1, source[..., None].expand(-1, -1, logits.shape[-1]))
        where = start[:, None] + out
        there = canvas.tokens.gather(1, where)
        p = probs(picked, ctx.sampling)
        if self.anchor:
            p = anchored(p, there, anchor_table(ctx, self.anchor))
        new = inverse_cdf(p, u.gather(1, out))
        canvas.tokens.scatter_(1, where, torch.where(out_ok, new, there))

    @staticmethod
    def _mask(ctx: Context, start: Tensor, positions: Tensor, pending: Tensor) -> Tensor:
        """Slot-causal mask [B, W, S] without the slots of pending offsets [B, L] (except a
        query's own slot)."""
        slots = ctx.models.target.cache_len
        prefix = slots - ctx.n_tokens
        # pending slots [B, S + 1]; the last column takes offsets past the end of the cache
        hidden = torch.zeros(start.shape[0], slots + 1, dtype=torch.bool, device=start.device)
        offsets = torch.arange(pending.shape[1], device=start.device)
        index = (start[:, None] + prefix + offsets).clamp(max=slots)
        hidden.scatter_(1, index, pending)
        return attention_mask(positions + prefix, slots, hidden[:, :slots])

    def _kv_valid(self, res: Resolution, steps: Tensor, forwards: Tensor, ready: Tensor | None) -> Tensor:
        """Offsets whose K/V are final after the step (the next verification re-feeds from there);
        `ready` is _kept_ready's answer under kv "inline"."""
        if self.kv == "refresh":
            return res.kv_valid
        length = steps.shape[1]
        offsets = torch.arange(length, device=steps.device)
        unfed = (steps == (forwards - 1)[:, None]) & (steps >= 0)  # drawn in the last forward
        unfed |= (offsets[None] == res.first[:, None]) & (forwards == 0)[:, None]  # t0, never fed
        if ready is not None:  # inline: kept drafts after the last redrawn position were never re-fed
            unfed |= (ready >= 0) & (ready >= forwards[:, None])
        earliest = torch.where(unfed, offsets, length).min(-1).values
        return torch.minimum(earliest, (res.advance - 1).clamp_min(0))

    @staticmethod
    def _count(ctx: Context, res: Resolution, labels: Tensor, forwards: Tensor) -> None:
        """Per-image statistics: verifications, resample forwards, islands and their sizes."""
        members = labels >= 0  # R_X with t0
        offsets = torch.arange(labels.shape[1], device=labels.device)
        same = (labels[:, :, None] == labels[:, None, :]) & members[:, :, None] & members[:, None, :]
        roots = members & ~(same & (offsets[None, None, :] < offsets[None, :, None])).any(-1)
        ctx.count("verify_forwards", (res.advance > 0).long())
        ctx.count("resample_forwards", forwards)
        ctx.count("resample_set", members.sum(-1))
        ctx.count("islands", roots.sum(-1))
        ctx.count("island_size_max", same.sum(-1).max(-1).values, reduce="max")
