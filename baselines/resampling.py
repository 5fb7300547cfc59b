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

Host reads (harness/hostsync.py): a `fill` reads the device once, before its forwards: how many
forwards the batch needs and, for each, its widths (the most inputs and the most drawn positions
of a row), one small tensor, since Python must know the loop's length and the shapes. Off the CPU
the widths are rounded up to powers of two (at most L), so a compiled model sees few shapes; the
padding inputs go to the scratch position N - 1 and padded draws write back the tokens already
there, so no token changes. Off the CPU the island labelling (baselines/islands.py) runs
LABEL_PASSES passes and its "settled" flag is read with the plan; a labelling that has not settled
(rare) is finished with checks, at the cost of more reads. No step builds a [B, L, L] tensor.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from baselines.canvas import Canvas, Context, feed_positions, span
from baselines.islands import block_islands, island_steps, serial_steps
from baselines.pooled import anchor_table, anchored
from baselines.scope import Resolution
from harness import engine, hostsync
from harness.models.masks import attention_mask
from harness.sampling import inverse_cdf, probs

SCHEDULES = ("serial", "parallel")
CONTEXTS = ("visible", "masked")
KV_MODES = ("refresh", "stale", "inline")


# Round forward widths up to powers of two (the same tokens either way); None: where reads are not
# free. On the CPU exact widths are faster (a 32 x 32 random model: about 15 %).
BUCKET: bool | None = None
LABEL_PASSES = 8  # island labelling passes off the CPU before its settled flag is read (islands.py)


def pack(selected: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """selected [B, L] bool, width W (the largest count in the batch <= W <= L) -> (offsets [B, W]:
    each row's selected entries first, ascending, then unselected ones as padding; valid [B, W])."""
    length = selected.shape[1]
    offsets = torch.arange(length, device=selected.device)
    key = torch.where(selected, offsets, offsets + length)  # selected first, each group in order
    order = key.argsort(-1)[:, :width]
    return order, selected.gather(1, order)


def bucket(width: int, cap: int) -> int:
    """The smallest power of two >= width (1 for width <= 1), at most cap."""
    return min(1 << max(width - 1, 0).bit_length(), cap)


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
        # off the CPU the labelling runs a fixed number of passes and its "settled" flag is read
        # with the plan; the rare unsettled labelling is finished with checks (more reads)
        passes = None if hostsync.reads_are_free(start.device) else LABEL_PASSES
        unsettled: list[Tensor] = []
        steps, labels = self._schedule(ctx, res, start, passes, unsettled)
        u = ctx.streams.draw((length,))  # L draws per image, used or not
        count, widths, forwards, ready = self._plan(steps, res, unsettled)  # the fill's one host read
        if count < 0:
            steps, labels = self._schedule(ctx, res, start, None, [])
            count, widths, forwards, ready = self._plan(steps, res, [])
        rounded = BUCKET
        if rounded is None:  # few shapes where reads are not free or forwards are compiled per shape
            rounded = not hostsync.reads_are_free(start.device) or engine.compiled_anywhere()
        for s in range(count):
            feed, drawn = widths[s], widths[length + s]
            if rounded:
                feed, drawn = bucket(feed, length), bucket(drawn, length)
            self._forward(ctx, canvas, steps, res.first, s, u, (feed, drawn), ready)
        self._count(ctx, res, labels, forwards, start)
        return replace(res, kv_valid=self._kv_valid(res, steps, forwards, ready)), forwards

    def _schedule(self, ctx: Context, res: Resolution, start: Tensor, passes: int | None,
                  unsettled: list[Tensor]) -> tuple[Tensor, Tensor]:
        """(steps [B, L], island labels [B, L]) of this fill's schedule (islands.py)."""
        if self.schedule == "serial":
            offsets = span(res.resample.shape[1], start.device)
            members = res.resample | (offsets[None] == res.first[:, None])
            return serial_steps(res.resample), block_islands(members, start, ctx.grid, passes, unsettled)
        return island_steps(res.resample, res.first, start, ctx.grid, self.window, passes, unsettled)

    def _plan(self, steps: Tensor, res: Resolution, unsettled: list[Tensor]
              ) -> tuple[int, list[int], Tensor, Tensor | None]:
        """One host read: (forwards of the fill, or -1 when the labelling had not settled; each
        step's widths, inputs then drawn positions; forwards [B]; the kept drafts' re-feed steps
        (kv "inline") or None)."""
        forwards = steps.max(-1).values + 1  # [B]
        ready = self._kept_ready(steps, res) if self.kv == "inline" else None
        count = forwards.max().view(1)
        if unsettled:
            count = torch.where(torch.stack(unsettled).any(), -1, count)
        first, *widths = torch.cat([count, self._widths(steps, res.first, ready).flatten()]).tolist()
        return first, widths, forwards, ready

    @staticmethod
    def _kept_ready(steps: Tensor, res: Resolution) -> Tensor:
        """steps [B, L] -> [B, L]: the step at which each kept draft after t0 (res.keep) is re-fed
        (one past the last step drawing a position before it; every redrawn position before it is
        then final), -1 for every other offset."""
        offsets = torch.arange(steps.shape[1], device=steps.device)
        before = torch.cat([torch.full_like(steps[:, :1], -1), steps[:, :-1]], 1).cummax(1).values
        kept = res.keep & (offsets[None] > res.first[:, None])
        return torch.where(kept, before + 1, -1)

    @staticmethod
    def _widths(steps: Tensor, first: Tensor, ready: Tensor | None) -> Tensor:
        """steps [B, L], first [B], ready [B, L] or None -> [2, L] int64: for each step s < L, the
        most inputs and the most drawn positions of a row in its forward (_forward), at least 1."""
        b, length = steps.shape
        offsets = torch.arange(length, device=steps.device)
        none = torch.full_like(steps, -1)
        # the steps in which offset o is an input: the one after it is drawn, step 0 for t0, its
        # turn as a kept draft (kv "inline"), and the one drawing o + 1 (o's output predicts it)
        fed = torch.stack([torch.where(steps >= 0, steps + 1, -1),
                           torch.where(offsets[None] == first[:, None], 0, -1),
                           none if ready is None else ready,
                           torch.cat([steps[:, 1:], none[:, :1]], 1)], -1).sort(-1).values  # [B, L, 4]
        repeat = torch.zeros_like(fed, dtype=torch.bool)
        repeat[..., 1:] = fed[..., 1:] == fed[..., :-1]  # fed twice in one step: one input
        fed = torch.where(repeat, -1, fed).view(b, -1) + 1  # column 0 collects "not fed"
        # steps reach L - 1, so a fed step reaches L: columns 1 .. L + 1
        inputs = torch.zeros(b, length + 2, dtype=torch.long, device=steps.device)
        inputs.scatter_add_(1, fed, torch.ones_like(fed))
        drawn = torch.zeros(b, length + 1, dtype=torch.long, device=steps.device)
        drawn.scatter_add_(1, steps + 1, torch.ones_like(steps))
        return torch.stack([inputs[:, 1:length + 1], drawn[:, 1:]]).max(1).values.clamp_min(1)

    def _forward(self, ctx: Context, canvas: Canvas, steps: Tensor, first: Tensor, s: int, u: Tensor,
                 widths: tuple[int, int], ready: Tensor | None = None) -> None:
        """One target forward: draw every offset of step s (steps [B, L]) into the canvas, with
        widths (inputs, drawn positions) no smaller than the batch needs (padding is harmless);
        with `ready` [B, L] (kv "inline") also re-feed the kept drafts whose turn is step s."""
        start, (b, length) = canvas.frontier, steps.shape
        offsets = torch.arange(length, device=start.device)
        fresh = (steps == s - 1) if s else (offsets[None] == first[:, None])
        if ready is not None:
            fresh = fresh | (ready == s)
        drawn = steps == s
        queries = torch.cat([drawn[:, 1:], torch.zeros_like(drawn[:, :1])], 1)  # offset o predicts o + 1
        feed, feed_ok = pack(fresh | queries, widths[0])
        index = start[:, None] + feed
        tokens = canvas.tokens.gather(1, index)
        positions = torch.where(feed_ok, feed_positions(index, ctx.n_tokens), ctx.n_tokens - 1)
        mask = self._mask(ctx, start, positions, steps >= s) if self.context == "masked" else None
        logits = ctx.models.target.forward(tokens, positions, mask)  # [B, W, V]
        slot_of = torch.zeros(b, length + 1, dtype=torch.long, device=start.device)  # offset -> input
        inputs = torch.arange(feed.shape[1], device=start.device).expand(b, -1)
        slot_of.scatter_(1, torch.where(feed_ok, feed, length), inputs)
        out, out_ok = pack(drawn, widths[1])
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
    def _count(ctx: Context, res: Resolution, labels: Tensor, forwards: Tensor, start: Tensor) -> None:
        """Per-image statistics: verifications, resample forwards, islands and their sizes.
        labels [B, L] (block_islands), start [B]: an island's label is start + the offset of its
        first member, so islands are counted and sized by that offset (O(B * L))."""
        b, length = labels.shape
        members = labels >= 0  # R_X with t0
        offsets = torch.arange(length, device=labels.device)
        first = torch.where(members, labels - start[:, None], length)  # non-members: column L
        sizes = torch.zeros(b, length + 1, dtype=torch.long, device=labels.device)
        sizes.scatter_add_(1, first, torch.ones_like(first))
        ctx.count("verify_forwards", (res.advance > 0).long())
        ctx.count("resample_forwards", forwards)
        ctx.count("resample_set", members.sum(-1))
        ctx.count("islands", (members & (first == offsets[None])).sum(-1))
        ctx.count("island_size_max", sizes[:, :length].max(-1).values, reduce="max")
