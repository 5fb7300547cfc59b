"""MuLo-SD's redraw record: where a verification sent the target back to redraw, per image, and
what any other tau would have done, from the one verification pass (DecodeStats.columns).

Recorded for decoders whose scope marks positions for resampling (MuLo-SD's `local`):
    first_rejection  t0, the raster index of the first rejected draft (N = rows * cols: none);
    redraw_map       [rows * cols] 0/1: the positions the target redrew (t0 and the resample set
                     R_X: the radius-l windows of the rejections, at or after t0), raster order;
    changed_map      [rows * cols] 0/1: the positions whose final token differs from the draft
                     (a redrawn position may draw its draft token again);
    draft_tokens     [rows * cols] the image as drafted (position 0: the target's prefill token,
                     which is never drafted; then the up-sampled draft as first proposed),
                     packed (harness/store/packed.py);
    rejection_map    (DecodeStats, as for every drafting decoder) the rejected drafts.

One-pass tau curve. The pooled-threshold rule accepts a draft iff its score (the pooled target
mass, Verdict.score) is >= tau, and the verification's p does not depend on tau (the draft is made
before it, from the same random streams), so with one whole-image verification (draft.rows: null,
scope.rounds: 1) every tau in TAU_GRID gives, without decoding again, exactly what a run at that
tau would record before its redraw: columns (one entry per grid value, space-separated)
    tau_grid            the grid itself;
    tau_rejected        rejected drafts;
    tau_first           t0 (N: none);
    tau_redrawn         positions redrawn (t0 and R_X);
    tau_target_forwards target forwards of the whole image: the prefill, the verification and the
                        resampler's schedule (IslandResampler.forwards).
"""
from __future__ import annotations

import torch
from torch import Tensor

from baselines.framework.canvas import Context
from baselines.framework.recorder import StatsRecorder
from baselines.framework.scope import RejectionScope

# 0 keeps every draft; 1e-8 already rejects the codes an up-sampled edge becomes
# (docs/shapes_world.md, "Where MuLo-SD redraws"); the rest spans the usual operating points.
TAU_GRID: tuple[float, ...] = (0.0, 1e-8, 1e-6, 1e-4, 1e-3, 0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


def record_redraw(rec: StatsRecorder, s: dict[str, Tensor], tokens: Tensor) -> None:
    """Record first_rejection [B], redraw_map, changed_map and draft_tokens [B, N] from the stacked
    steps s (StatsRecorder.stacked: active, start [S, B], first [S, B], rejected, resample and
    draft [S, B, L]) and the final tokens [B, N] (position 0: the prefill's token)."""
    n = rec.n_tokens
    batch = tokens.shape[0]
    device = tokens.device
    if not s:  # nothing was verified (a one-token image)
        rec.column("first_rejection", torch.full((batch,), n, dtype=torch.long, device=device))
        rec.column("redraw_map", torch.zeros(batch, n, dtype=torch.long, device=device))
        rec.column("changed_map", torch.zeros(batch, n, dtype=torch.long, device=device))
        rec.column("draft_tokens", tokens, packed=True)
        return
    length = s["rejected"].shape[-1]
    offsets = torch.arange(length, device=device)
    index = s["start"][..., None] + offsets  # [S, B, L] raster positions
    valid = (index < n) & s["active"][..., None]
    at_t0 = (offsets == s["first"][..., None]) & s["rejected"] & valid  # t0 where it was a rejection
    redrawn = (s["resample"] | at_t0) & valid
    t0 = torch.where(at_t0, index, n).transpose(0, 1).reshape(batch, -1).amin(-1)  # [B]
    place = torch.where(valid, index, n).transpose(0, 1).reshape(batch, -1)  # [B, S * L], N: nowhere
    region = torch.zeros(batch, n + 1, dtype=torch.long, device=device)
    region.scatter_reduce_(1, place, redrawn.transpose(0, 1).reshape(batch, -1).long(), "amax")
    draft = torch.full((batch, n + 1), -1, dtype=torch.long, device=device)
    for step in reversed(range(index.shape[0])):  # the first proposal of a position is written last
        where = torch.where(valid[step], index[step], n)
        draft.scatter_(1, where, s["draft"][step])
    draft[:, 0] = tokens[:, 0]
    rec.column("first_rejection", t0)
    rec.column("redraw_map", region[:, :n])
    rec.column("changed_map", (draft[:, :n] != tokens).long())
    rec.column("draft_tokens", draft[:, :n], packed=True)


def record_tau_curve(rec: StatsRecorder, ctx: Context, scope: RejectionScope, resampler: object,
                     score: Tensor, start: Tensor, taus: tuple[float, ...] = TAU_GRID) -> None:
    """The one-pass tau curve (module docstring) of one whole-image verification: score [B, L]
    (Verdict.score), start [B] (its frontier); `resampler` has `forwards(ctx, res, start)`."""
    n = ctx.n_tokens
    length = score.shape[1]
    remaining = n - start
    columns: dict[str, list[Tensor]] = {"tau_rejected": [], "tau_first": [], "tau_redrawn": [],
                                        "tau_target_forwards": []}
    for tau in taus:
        res = scope.resolve(score >= tau, remaining, ctx.grid, None)
        found = res.first < length  # the local scope's t0 is always a rejection
        columns["tau_rejected"].append(res.rejected.sum(-1))
        columns["tau_first"].append(torch.where(found, start + res.first, n))
        columns["tau_redrawn"].append(res.resample.sum(-1) + found.long())
        columns["tau_target_forwards"].append(2 + resampler.forwards(ctx, res, start))  # type: ignore[attr-defined]
    for name, values in columns.items():
        rec.column(name, torch.stack(values, -1))
    grid = torch.tensor(taus, dtype=torch.float64, device=score.device)
    rec.column("tau_grid", grid[None].expand(score.shape[0], -1))
