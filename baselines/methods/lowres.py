"""MuLo-SD's draft source `lowres` (paper.md §3): the same-family drafter at a lower resolution
(grid / r) samples whole low-res rows, an up-sampler turns them into r x r blocks of high-res
tokens, and a down-sampler maps committed high-res rows back into the drafter's prefix.

One proposal, for every batch row b at its high-res frontier n_b:
1. F_b = low-res rows whose r high-res rows are all committed; rows newly final since the last
   proposal take y = D_r(x) (the committed tokens' low-res view);
2. one drafter forward re-encodes the last (rows + 1) * cols_lo final low-res tokens (this covers
   every final row whose K/V is missing or held a draft) and predicts the first drafted token;
   the first proposal (frontier 1: no row is final) does neither step 1 nor this forward, on every
   device (elsewhere they run under a mask when the device cannot be read for free);
3. the drafter samples `rows + 1` low-res rows F_b .. F_b + rows (the extra row covers the last
   positions of a block that starts one past a row boundary, as the loop's first block does), by
   `serial` raster order or `zipar(window)`; every proposal redraws all non-final rows from the
   current prefix, so every image draws the same number of random numbers per proposal;
4. x~ = U_r(y) over the whole low-res grid; the proposal is x~[n_b .. n_b + L - 1] with
   L = rows * r * cols_hi, and q = None (no distribution: the rule is a threshold).

With whole-image drafting (rows: null) the image is drafted once; a scope that verifies it again
(`local` with rounds > 1) gets, as each further proposal, the canvas after the frontier as it
stands (kept drafts and redrawn tokens), with no drafter work.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from baselines.framework.canvas import Canvas, Context, feed_positions, span
from baselines.framework.drafts import Draft, DraftRun, DraftSource
from baselines.methods.upsamplers import UpSampler, ratio
from baselines.methods.zipar import zipar_layout
from harness.api import ModelBundle
from harness.runtime.hostsync import anything
from harness.models.masks import attention_mask
from harness.runtime.sampling import probs, sample_from

DRAFT_SCHEDULES = ("serial", "zipar")


@dataclass(frozen=True)
class Geometry:
    """Grids of one bundle: r, high-res (rows, cols), low-res (rows, cols), low rows per block."""

    r: int
    high: tuple[int, int]
    low: tuple[int, int]
    rows: int

    @property
    def n_low(self) -> int:
        return self.low[0] * self.low[1]

    @property
    def length(self) -> int:
        return self.rows * self.r * self.high[1]


class LowResDraft(DraftSource):
    """`lowres`: low-resolution drafting + up-sampling.

    Args:
        upsampler: an up-/down-sampler pair (baselines/methods/upsamplers.py).
        rows: low-res rows per verification (null: the whole image, one cycle).
        schedule: drafting order in the drafter: "serial" (raster, one token per forward) or
            "zipar" (row j + 1 starts once row j has `window` tokens).
        window: zipar only: tokens per row before the next row starts (>= cols_lo is serial).
    """

    name = "lowres"

    def __init__(self, upsampler: UpSampler, rows: int | None = None, schedule: str = "zipar",
                 window: int = 2) -> None:
        if rows is not None and (int(rows) != rows or rows < 1):
            raise ValueError(f"decoder draft.rows (lowres) must be an integer >= 1 or null (whole image), "
                             f"got {rows!r}")
        if schedule not in DRAFT_SCHEDULES:
            raise ValueError(f"decoder draft.schedule (lowres) must be one of {DRAFT_SCHEDULES}, "
                             f"got {schedule!r}")
        if int(window) != window or window < 1:
            raise ValueError(f"decoder draft.window (lowres) must be an integer >= 1, got {window!r}")
        self.upsampler = upsampler
        self.rows = None if rows is None else int(rows)
        self.schedule = schedule
        self.window = int(window)
        self.geometry: Geometry | None = None

    @property
    def length(self) -> int:
        if self.geometry is None:
            raise RuntimeError("the lowres draft's block length depends on the models: "
                               "call bind(models) first")
        return self.geometry.length

    def bind(self, models: ModelBundle) -> "LowResDraft":
        """A copy sized for `models` (the drafter must exist and share the target's vocabulary)."""
        if models.drafter is None:
            raise ValueError(f"model bundle {models.name!r} has no `drafter` (the low-resolution model); "
                             "the lowres draft source needs one")
        if models.drafter.vocab_size != models.target.vocab_size:
            raise ValueError(f"drafter vocabulary {models.drafter.vocab_size} != target vocabulary "
                             f"{models.target.vocab_size}: lowres needs one shared tokenizer")
        r = ratio(models)
        low = tuple(models.drafter.grid)
        rows = low[0] if self.rows is None else min(self.rows, low[0])
        bound = copy.copy(self)
        high = tuple(models.target.grid)
        bound.geometry = Geometry(r=r, high=high, low=low, rows=rows)  # type: ignore[arg-type]
        return bound

    @property
    def whole_image(self) -> bool:
        """Whether one proposal drafts the whole image (rows: null, or rows >= the low-res rows)."""
        geo = self.geometry
        if geo is None:
            raise RuntimeError("call bind(models) first")
        return geo.rows == geo.low[0]

    def start(self, ctx: Context, canvas: Canvas) -> "_LowResRun":
        if self.geometry is None:
            raise RuntimeError("bind(models) before start")
        return _LowResRun(self, self.geometry, ctx)


class _LowResRun(DraftRun):
    """observe: nothing to keep; the next proposal re-derives the prefix from the committed canvas."""

    prefill_forwards = 1

    def __init__(self, source: LowResDraft, geo: Geometry, ctx: Context) -> None:
        self.source, self.geo, self.ctx = source, geo, ctx
        self.drafter = ctx.models.drafter
        self.drafter.setup_cache(ctx.batch)
        self.first_logits = self.drafter.prefill(ctx.cond)  # [B, V]: low-res position 0
        self.span = min(geo.rows + 1, geo.low[0])  # low-res rows drafted per proposal
        pad = self.span * geo.low[1] + 1
        self.low = torch.zeros(ctx.batch, geo.n_low + pad, dtype=torch.long, device=ctx.device)
        self.final = torch.zeros(ctx.batch, dtype=torch.long, device=ctx.device)  # final low rows
        window = geo.low[1] if source.schedule == "serial" else source.window
        self.layout = zipar_layout(self.span, geo.low[1], window, "reference", ctx.device)
        self.masked = window < geo.low[1]
        self.drafted = False
        # The loop's first proposal comes at frontier 1 (the prefill sampled position 0), inside
        # low-res row 0 when a row spans r * cols >= 2 high-res positions: no row is final, so
        # there is nothing to down-sample or re-feed. Skipped here, not asked of the device
        # (hostsync.anything answers True off the CPU, which would do both under a mask).
        self.nothing_final = geo.r * geo.high[1] > 1

    def propose(self, canvas: Canvas) -> Draft:
        """Low-res rows -> up-sampled block [B, L] for positions frontier .. frontier + L - 1
        (a whole-image draft already made: the canvas there as it stands)."""
        geo, ctx = self.geo, self.ctx
        index = canvas.frontier[:, None] + torch.arange(geo.length, device=ctx.device)
        if self.drafted and self.source.whole_image:
            tokens = canvas.tokens.gather(1, index.clamp(max=canvas.tokens.shape[1] - 1))
            return Draft(tokens=tokens, q=None, drafter_forwards=0)
        self.drafted = True
        final = (canvas.frontier // (geo.r * geo.high[1])).clamp(max=geo.low[0])  # F [B]
        first, self.nothing_final = self.nothing_final, False
        if not first:
            self._absorb(canvas, final)
        forwards = self._draft(final, refeed=not first)
        high = self.source.upsampler.up(self.low[:, :geo.n_low].view(-1, *geo.low), ctx).flatten(1)
        tokens = high.gather(1, index.clamp(max=high.shape[1] - 1))
        return Draft(tokens=tokens, q=None, drafter_forwards=forwards)  # type: ignore[arg-type]

    def _absorb(self, canvas: Canvas, final: Tensor) -> None:
        """Rows that became final since the last proposal take D_r(committed high-res tokens)."""
        geo = self.geo
        if anything(final > self.final):  # read on the CPU; elsewhere always done (masked)
            high = canvas.tokens[:, : geo.high[0] * geo.high[1]].view(-1, *geo.high)
            down = self.source.upsampler.down(high, self.ctx).flatten(1)  # [B, n_low]
            pos = torch.arange(geo.n_low, device=down.device)
            new = (pos >= self.final[:, None] * geo.low[1]) & (pos < final[:, None] * geo.low[1])
            self.low[:, : geo.n_low] = torch.where(new, down, self.low[:, : geo.n_low])
        self.final = torch.maximum(self.final, final)

    def _draft(self, final: Tensor, refeed: bool = True) -> Tensor:
        """Sample low-res rows F .. F + span - 1 into self.low; return drafter forwards [B].
        refeed False: no row is final (F = 0 everywhere), so no re-encoding forward is made."""
        geo, ctx, cols = self.geo, self.ctx, self.geo.low[1]
        base = final * cols  # first drafted low-res position [B]
        logits = self.first_logits
        refed = final > 0
        if refeed and anything(refed):  # read on the CPU; elsewhere always done (masked)
            width = min(self.span * cols, geo.n_low)
            index = base[:, None] - width + torch.arange(width, device=ctx.device)
            tokens = self.low.gather(1, index.clamp_min(0))
            out = self.drafter.forward(tokens, feed_positions(index, geo.n_low))[:, -1]  # predicts F*cols
            logits = torch.where(refed[:, None], out, logits)
        self._write(base[:, None], sample_from(probs(logits, ctx.sampling)[:, None], ctx.streams))
        layout = self.layout
        positions, sources, decoded, masks = self._tables(base)
        for i, from_input in enumerate(layout.from_input):
            inputs = slice(layout.inputs_at[i], layout.inputs_at[i + 1])
            mask = None if masks is None else masks[:, inputs]
            out = self.drafter.forward(self.low.gather(1, sources[:, inputs]), positions[:, inputs], mask)
            drawn = sample_from(probs(out[:, from_input], ctx.sampling), ctx.streams)
            self.low.scatter_(1, decoded[:, layout.decoded_at[i]:layout.decoded_at[i + 1]], drawn)
        return refed.long() + len(layout.from_input)

    def _write(self, index: Tensor, values: Tensor) -> None:
        """Write values [B, D] at low-res positions index [B, D] (past the grid: into padding)."""
        self.low.scatter_(1, index.clamp(max=self.low.shape[1] - 1), values)

    def _tables(self, base: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The proposal's forwards side by side (zipar.ZipLayout) for rows drafted from low-res
        position base [B]: (cache positions [B, T] and low-res positions read [B, T] of their
        inputs, low-res positions decoded [B, D] (past the grid: padding), masks [B, T, S] or None
        where the schedule is serial)."""
        layout, n_low = self.layout, self.geo.n_low
        at = base[:, None]
        positions = feed_positions(at + layout.slots, n_low)
        decoded = (at + layout.decoded).clamp(max=self.low.shape[1] - 1)
        masks = self._masks(base, positions) if self.masked else None
        return positions, at + layout.sources, decoded, masks

    def _masks(self, base: Tensor, positions: Tensor) -> Tensor:
        """ZipAR's "written" mask [B, T, S] of every input of the proposal (positions [B, T]): the
        prefix, the final rows, and the slots of this proposal that its forward or an earlier one
        feeds, at or before the query's slot."""
        slots, layout = self.drafter.cache_len, self.layout
        prefix = slots - self.geo.n_low
        rel = span(slots, base.device) - (prefix + base)[:, None]  # [B, S] offset into the drafted rows
        # the forward that first feeds each key slot (-1: the prefix and the final rows)
        written = torch.where(rel < 0, -1, layout.written[rel.clamp(0, layout.written.shape[0] - 1)])
        return attention_mask(positions + prefix, slots, written[:, None] > layout.forward, own=False)
