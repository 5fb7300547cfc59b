"""MuLo-SD's resamplers: refill the resample set R_X \\ {t0} of a `local` scope with target forwards
(paper.md §6-7), following a `serial` or `parallel` (rejection islands) schedule
(baselines/methods/islands.py).

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
`anchor` a >= 1 (an extension; baselines/methods/pooled.py) draws each position from the target's p
restricted to the a-neighbourhood of the token there before the redraw (the draft).
Every image draws L uniforms per call whatever its batch, so images do not depend on the batch.

Host reads (harness/runtime/hostsync.py): a `fill` reads the device once, before its forwards: how many
forwards the batch needs and, for each, its widths (the most inputs and the most drawn positions
of a row), one small tensor, since Python must know the loop's length and the shapes. Off the CPU
the widths are rounded up to powers of two (at most L), so a compiled model sees few shapes; the
padding inputs go to the scratch position N - 1 and padded draws into the canvas's last padding
column, beyond the image, so no token changes. With those widths the fill lays out all its
forwards' inputs and drawn positions side by side in index tables built once (`_tables`), so
that a forward only slices them. Off the CPU the island labelling (baselines/methods/islands.py) runs
LABEL_PASSES passes and its "settled" flag is read with the plan; a labelling that has not settled
(rare) is finished with checks, at the cost of more reads. No step builds a [B, L, L] tensor.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.framework.canvas import Canvas, Context, feed_positions, span
from baselines.methods.islands import block_islands, island_steps, rank_in_group, serial_steps
from baselines.methods.pooled import anchor_set, anchor_table, restricted
from baselines.framework.scope import Resolution
from harness.runtime import engine, hostsync
from harness.runtime.sampling import inverse_cdf, probs

SCHEDULES = ("serial", "parallel")
CONTEXTS = ("visible", "masked")
KV_MODES = ("refresh", "stale", "inline")


# Round forward widths up to powers of two (the same tokens either way); None: where reads are not
# free. On the CPU exact widths are faster (a 32 x 32 random model: about 15 %).
BUCKET: bool | None = None
LABEL_PASSES = 8  # island labelling passes off the CPU before its settled flag is read (islands.py)


def bucket(width: int, cap: int) -> int:
    """The smallest power of two >= width (1 for width <= 1), at most cap."""
    return min(1 << max(width - 1, 0).bit_length(), cap)


@functools.lru_cache(maxsize=64)
def buckets(length: int, device: torch.device) -> Tensor:
    """[L + 1] int64: bucket(w, L) for every width w <= L, on `device`, made once per block length."""
    return torch.tensor([bucket(w, length) for w in range(length + 1)], device=device)


@functools.lru_cache(maxsize=16)
def visibility(n_tokens: int, slots: int, device: torch.device) -> Tensor:
    """[N, S] int32 bounds of the masked context, made once per model shape: in the forward of
    step s, a query at image position i (cache slot q = S - N + i) sees key slot k when
    drawn_at[k] - s < bound[i, k], with drawn_at[k] the step that redraws k (-1: none). bound is
    0 before q (seen once drawn), N + 1 at q (its own slot: always) and -N - 1 after q (never),
    as steps are < L <= N."""
    query = torch.arange(n_tokens, device=device)[:, None] + slots - n_tokens
    key = torch.arange(slots, device=device)[None]
    bound = torch.where(key < query, 0, torch.where(key == query, n_tokens + 1, -n_tokens - 1))
    return bound.to(torch.int32)


def columns(step: Tensor, starts: Tensor, total: int) -> Tensor:
    """step [B, E] int64, the forward of each entry (-1: none; entries in offset order), starts
    [L + 1] the first column of each forward -> [B, E] each entry's column in a fill's table
    (_Tables), a forward's entries in offset order from its first column; `total` (the spare
    column) for none and for forwards past the fill's last."""
    some = step >= 0
    column = starts[step.clamp_min(0)] + rank_in_group(step, some)
    return torch.where(some, column, total).clamp_max(total)


@dataclass(frozen=True)
class _Plan:
    """A fill's schedule as its one host read gives it: `count` forwards; forward s feeds input
    columns feed_at[s] .. feed_at[s + 1] - 1 and draws into columns draw_at[s] .. draw_at[s + 1] - 1
    of the fill's tables (_Tables), as wide as the batch needs (rounded up to powers of two off the
    CPU, BUCKET); starts [2, L + 1]: those column bounds on the device (inputs, drawn). inputs
    [B, L, 4] (_inputs), forwards [B], ready [B, L] or None (_kept_ready)."""

    count: int
    feed_at: list[int]
    draw_at: list[int]
    starts: Tensor
    inputs: Tensor
    forwards: Tensor
    ready: Tensor | None


@dataclass(frozen=True)
class _Tables:
    """The index tables of a fill's forwards, side by side (_Plan's columns), built once per fill.

    index, positions [B, F]: each input's canvas index and cache position (padding: position
    N - 1, fed to the scratch slot); where [B, D]: each drawn position's canvas index (padding: the
    canvas's last column, beyond the image); source [B, D]: the input of its forward whose output
    predicts it; u [B, D]: its uniform; keep [B, D, a] or None: the anchor set of the token there
    before the redraw; drawn_at [B, 1, S] int32 or None: the step drawing each cache slot (-1 for
    the others; masked context only); rows [B, 1]: batch rows, to pick outputs."""

    index: Tensor
    positions: Tensor
    where: Tensor
    source: Tensor
    u: Tensor
    keep: Tensor | None
    drawn_at: Tensor | None
    rows: Tensor


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
            raise ValueError(f"decoder resampler.anchor must be an integer >= 0 (0: draw from p), "
                             f"got {anchor!r}")
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
        plan = self._plan(steps, res, unsettled)  # the fill's one host read
        while plan is None:  # the labelling had not settled: label again, with checks
            steps, labels = self._schedule(ctx, res, start, None, [])
            plan = self._plan(steps, res, [])
        tables = self._tables(ctx, canvas, steps, plan, u)
        for s in range(plan.count):
            self._forward(ctx, canvas, plan, tables, s)
        self._count(ctx, res, labels, plan.forwards, start)
        return replace(res, kv_valid=self._kv_valid(res, steps, plan.forwards, plan.ready)), plan.forwards

    def forwards(self, ctx: Context, res: Resolution, start: Tensor) -> Tensor:
        """The target forwards [B] a `fill` of `res` would take (its schedule's length), drawing
        and writing nothing (the one-pass tau curve, baselines/framework/redraw.py)."""
        steps, _ = self._schedule(ctx, res, start, None, [])
        return steps.max(-1).values + 1

    def _schedule(self, ctx: Context, res: Resolution, start: Tensor, passes: int | None,
                  unsettled: list[Tensor]) -> tuple[Tensor, Tensor]:
        """(steps [B, L], island labels [B, L]) of this fill's schedule (islands.py)."""
        if self.schedule == "serial":
            offsets = span(res.resample.shape[1], start.device)
            members = res.resample | (offsets[None] == res.first[:, None])
            return serial_steps(res.resample), block_islands(members, start, ctx.grid, passes, unsettled)
        return island_steps(res.resample, res.first, start, ctx.grid, self.window, passes, unsettled)

    def _plan(self, steps: Tensor, res: Resolution, unsettled: list[Tensor]) -> _Plan | None:
        """One host read: the fill's forwards and each one's column bounds (_Plan); None when the
        labelling had not settled."""
        device, length = steps.device, steps.shape[1]
        forwards = steps.max(-1).values + 1  # [B]
        ready = self._kept_ready(steps, res) if self.kv == "inline" else None
        inputs = self._inputs(steps, res.first, ready)
        widths = self._widths(steps, inputs)
        rounded = BUCKET
        if rounded is None:  # few shapes where reads are not free or forwards are compiled per shape
            rounded = not hostsync.reads_are_free(device) or engine.compiled_anywhere()
        if rounded:
            widths = buckets(length, device)[widths]
        starts = F.pad(widths.cumsum(1), (1, 0))  # [2, L + 1]
        count = forwards.max().view(1)
        if unsettled:
            count = torch.where(torch.stack(unsettled).any(), -1, count)
        first, *bounds = torch.cat([count, starts.flatten()]).tolist()
        if first < 0:
            return None
        return _Plan(count=first, feed_at=bounds[:first + 1], draw_at=bounds[length + 1:length + first + 2],
                     starts=starts, inputs=inputs, forwards=forwards, ready=ready)

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
    def _inputs(steps: Tensor, first: Tensor, ready: Tensor | None) -> Tensor:
        """steps [B, L], first [B], ready [B, L] or None -> [B, L, 4] int64: the steps in which
        each offset is an input, ascending, -1 for none (and for a repeat: fed once per step)."""
        offsets = torch.arange(steps.shape[1], device=steps.device)
        none = torch.full_like(steps, -1)
        # the one after it is drawn, step 0 for t0, its turn as a kept draft (kv "inline"), and the
        # one drawing o + 1 (o's output predicts it)
        fed = torch.stack([torch.where(steps >= 0, steps + 1, -1),
                           torch.where(offsets[None] == first[:, None], 0, -1),
                           none if ready is None else ready,
                           torch.cat([steps[:, 1:], none[:, :1]], 1)], -1).sort(-1).values
        repeat = torch.zeros_like(fed, dtype=torch.bool)
        repeat[..., 1:] = fed[..., 1:] == fed[..., :-1]
        return torch.where(repeat, -1, fed)

    @staticmethod
    def _widths(steps: Tensor, inputs: Tensor) -> Tensor:
        """steps [B, L], inputs [B, L, 4] (_inputs) -> [2, L] int64: for each step s < L, the most
        inputs and the most drawn positions of a row in its forward, at least 1."""
        b, length = steps.shape
        fed = inputs.view(b, -1) + 1  # column 0 collects "not fed"
        # steps reach L - 1, so a fed step reaches L: columns 1 .. L + 1
        counts = torch.zeros(b, length + 2, dtype=torch.long, device=steps.device)
        counts.scatter_add_(1, fed, torch.ones_like(fed))
        drawn = torch.zeros(b, length + 1, dtype=torch.long, device=steps.device)
        drawn.scatter_add_(1, steps + 1, torch.ones_like(steps))
        return torch.stack([counts[:, 1:length + 1], drawn[:, 1:]]).max(1).values.clamp_min(1)

    def _tables(self, ctx: Context, canvas: Canvas, steps: Tensor, plan: _Plan, u: Tensor) -> _Tables:
        """The fill's index tables (_Tables) from steps [B, L], the plan and the uniforms u [B, L]."""
        start, (b, length), n = canvas.frontier, steps.shape, ctx.n_tokens
        device = start.device
        feed, draw = plan.feed_at[-1], plan.draw_at[-1]  # table widths (then the spare column)
        at = start[:, None] + span(length, device)  # [B, L] canvas index of each offset
        fed = columns(plan.inputs.view(b, -1), plan.starts[0], feed).view(b, length, 4)  # per input
        index = torch.full((b, feed + 1), n - 1, dtype=torch.long, device=device)
        index.scatter_(1, fed.view(b, -1), at[..., None].expand(-1, -1, 4).reshape(b, -1))
        drawn = columns(steps, plan.starts[1], draw)  # [B, L]
        where = torch.full((b, draw + 1), canvas.tokens.shape[1] - 1, dtype=torch.long, device=device)
        where.scatter_(1, drawn, at)
        # offset o (never 0: t0 >= 0 comes first) is predicted by o - 1's input in the forward
        # drawing o: that input's column, less the forward's first
        step = steps[:, 1:]
        column = torch.where(plan.inputs[:, :-1] == step[..., None], fed[:, :-1], 0).sum(-1)
        source = torch.zeros(b, draw + 1, dtype=torch.long, device=device)
        source.scatter_(1, drawn[:, 1:], column - plan.starts[0][step.clamp_min(0)])
        uniforms = torch.zeros(b, draw + 1, device=device).scatter_(1, drawn, u)
        keep = None
        if self.anchor:  # the anchor sets of the tokens there before the redraw
            keep = anchor_set(canvas.tokens.gather(1, where[:, :draw]), anchor_table(ctx, self.anchor))
        return _Tables(index=index[:, :feed], positions=feed_positions(index[:, :feed], n),
                       where=where[:, :draw], source=source[:, :draw], u=uniforms[:, :draw], keep=keep,
                       drawn_at=self._drawn_at(ctx, start, steps) if self.context == "masked" else None,
                       rows=span(b, device)[:, None])

    @staticmethod
    def _drawn_at(ctx: Context, start: Tensor, steps: Tensor) -> Tensor:
        """start [B], steps [B, L] -> [B, 1, S] int32: the step drawing each cache slot, -1 for
        the slots of offsets not redrawn and of every other position."""
        slots = ctx.models.target.cache_len
        prefix = slots - ctx.n_tokens
        drawn_at = torch.full((start.shape[0], slots + 1), -1, dtype=torch.int32, device=start.device)
        # the last column takes offsets past the end of the cache
        index = (start[:, None] + prefix + span(steps.shape[1], start.device)).clamp(max=slots)
        drawn_at.scatter_(1, index, steps.to(torch.int32))
        return drawn_at[:, None, :slots]

    def _forward(self, ctx: Context, canvas: Canvas, plan: _Plan, tables: _Tables, s: int) -> None:
        """Forward s of the fill: feed its input columns, draw its positions into the canvas.
        Masked context: a query sees a key slot drawn in this fill once it is drawn (its own slot
        always), through the visibility bounds."""
        inputs = slice(plan.feed_at[s], plan.feed_at[s + 1])
        drawn = slice(plan.draw_at[s], plan.draw_at[s + 1])
        positions = tables.positions[:, inputs]
        mask = None
        if tables.drawn_at is not None:
            bound = visibility(ctx.n_tokens, ctx.models.target.cache_len, positions.device)
            mask = tables.drawn_at - s < bound[positions]  # [B, W, S]
        tokens = canvas.tokens.gather(1, tables.index[:, inputs])
        logits = ctx.models.target.forward(tokens, positions, mask)  # [B, W, V]
        p = probs(logits[tables.rows, tables.source[:, drawn]], ctx.sampling)  # [B, D, V]
        if tables.keep is not None:
            p = restricted(p, tables.keep[:, drawn])
        canvas.tokens.scatter_(1, tables.where[:, drawn], inverse_cdf(p, tables.u[:, drawn]))

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
