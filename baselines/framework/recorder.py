"""Per-image decode statistics accumulated on the device as [B] tensors (no host round trip per
step) and turned into `DecodeStats` once, at the end of a `generate` call.

A decode loop hands each step's raw tensors to `step(...)`, which only keeps them; at the end the
steps are stacked ([S, B, ...]: one op per field, not a dozen small ones per step) and the decoder
turns them into counts with `forward` and `drafts`, which take any leading step dimensions.

Conventions (the speed evaluator reads them from stats.csv):
- a forward counts once for every image of the batch that was still decoding;
- the target's prefill is a target forward (it yields position 0), as in raster decoding, and a
  drafter's prefill is a drafter forward;
- `accepted_per_step[s]` = tokens committed by step s (accepted drafts plus the resampled or
  bonus token; 1 for the prefill), so its sum is the image's token count and raster decoding
  records [1] * N; a step is one target forward unless a resampler adds forwards to it;
- `accepted` counts committed drafts, `resampled` tokens drawn after a rejection, `proposed` drafts
  that were verified; `rejection_map` [rows, cols] counts rejections per position.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api import DecodeStats
from harness.store.packed import pack_tokens


class StatsRecorder:
    """Counters for a batch of B images on a rows x cols grid."""

    def __init__(self, batch: int, grid: tuple[int, int], device: torch.device) -> None:
        self.grid = grid
        self.n_tokens = grid[0] * grid[1]
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        self.target = zeros.clone()
        self.drafter = zeros.clone()
        self.proposed = zeros.clone()
        self.accepted = zeros.clone()
        self.resampled = zeros.clone()
        # one extra column collects writes for positions past the end (rows that finished)
        self.rejections = torch.zeros(batch, self.n_tokens + 1, dtype=torch.long, device=device)
        self._committed: list[Tensor] = []  # per target forward: tokens committed [B], -1 = idle
        self._steps: list[dict[str, Tensor | int]] = []  # raw tensors of each step (`step`)
        self._columns: dict[str, tuple[Tensor, bool]] = {}  # per-image columns (`column`)

    def step(self, **values: Tensor | int) -> None:
        """Keep one step's raw values ([B, ...] tensors or ints); nothing is computed now."""
        self._steps.append(values)

    def stacked(self) -> dict[str, Tensor]:
        """The kept steps, each field stacked to [S, B, ...] (ints broadcast to [S, B]); {} if none."""
        if not self._steps:
            return {}
        return {k: self._stack([s[k] for s in self._steps]) for k in self._steps[0]}

    def _stack(self, values: list[Tensor | int]) -> Tensor:
        """One field of every step -> [S, B, ...]: a field that is an int at every step (e.g. the
        drafter forwards of a fixed-length draft) becomes one tensor, not one per step."""
        batch, device = self.target.shape[0], self.target.device
        if not any(isinstance(v, Tensor) for v in values):
            return torch.tensor(values, dtype=torch.long, device=device)[:, None].expand(-1, batch)
        return torch.stack([v if isinstance(v, Tensor) else torch.full((batch,), v, device=device)
                            for v in values])

    def forward(self, active: Tensor, committed: Tensor, target: int | Tensor = 1,
                drafter: int | Tensor = 0) -> None:
        """Record steps for rows active [..., B] bool (leading dims: steps, in order): tokens
        committed [..., B], target and drafter forwards they took (ints or [..., B])."""
        act = active.long()
        self.target += (act * target).reshape(-1, act.shape[-1]).sum(0)
        self.drafter += (act * drafter).reshape(-1, act.shape[-1]).sum(0)
        idle = torch.where(active, committed, torch.full_like(committed, -1))
        self._committed.extend(idle.reshape(-1, act.shape[-1]).unbind(0))

    def drafts(self, active: Tensor, start: Tensor, proposed: Tensor, accepted: Tensor,
               resampled: Tensor, rejected: Tensor) -> None:
        """Record verifications: per-row counts [..., B] and the rejected draft offsets [..., B, L]
        (bool) relative to the frontier `start` [..., B]."""
        act = active.long()
        b = act.shape[-1]
        self.proposed += (act * proposed).reshape(-1, b).sum(0)
        self.accepted += (act * accepted).reshape(-1, b).sum(0)
        self.resampled += (act * resampled).reshape(-1, b).sum(0)
        index = start[..., None] + torch.arange(rejected.shape[-1], device=start.device)
        index = index.clamp(max=self.n_tokens)
        hits = (rejected & active[..., None]).long()
        # [..., B, L] -> [B, steps * L]: every step's offsets of one row side by side
        self.rejections.scatter_add_(1, index.reshape(-1, b, index.shape[-1]).transpose(0, 1).reshape(b, -1),
                                     hits.reshape(-1, b, hits.shape[-1]).transpose(0, 1).reshape(b, -1))

    def column(self, name: str, values: Tensor, packed: bool = False) -> None:
        """A per-image column of DecodeStats.columns: values [B] integers (an int), [B, K] (a
        space-separated list: integers, or floats written by repr) or, `packed`, [B, K] token ids
        (harness/store/packed.py)."""
        self._columns[name] = (values.detach(), packed)

    def _column_cells(self) -> dict[str, list[str | int]]:
        """Every kept column as one CSV-safe cell per image."""
        cells: dict[str, list[str | int]] = {}
        for name, (values, packed) in self._columns.items():
            host = values.cpu()
            if packed:
                cells[name] = [pack_tokens(row.numpy()) for row in host]
            elif host.dim() == 1:
                cells[name] = [int(v) for v in host.tolist()]
            elif host.is_floating_point():
                cells[name] = [" ".join(map(repr, row)) for row in host.double().tolist()]
            else:
                cells[name] = [" ".join(map(str, row)) for row in host.tolist()]
        return cells

    def add_drafter(self, forwards: int) -> None:
        """Drafter forwards outside the steps (e.g. its prefill), for every image."""
        self.drafter += forwards

    def finish(self, with_drafts: bool, extra: dict[str, Tensor] | None = None) -> list[DecodeStats]:
        """One DecodeStats per image; `with_drafts` adds the rejection map (drafting decoders);
        `extra` maps names to per-image values [B] (DecodeStats.extra, e.g. resampling islands)."""
        extras = {k: v.tolist() for k, v in (extra or {}).items()}
        steps = torch.stack(self._committed, dim=1).cpu()  # [B, S]
        target, drafter, proposed = self.target.tolist(), self.drafter.tolist(), self.proposed.tolist()
        accepted, resampled = self.accepted.tolist(), self.resampled.tolist()
        maps = self.rejections[:, : self.n_tokens].reshape(-1, *self.grid).cpu()
        columns = self._column_cells()
        out = []
        for b in range(steps.shape[0]):
            row = steps[b]
            out.append(DecodeStats(
                target_forwards=target[b], drafter_forwards=drafter[b], tokens=self.n_tokens,
                proposed=proposed[b], accepted=accepted[b], resampled=resampled[b],
                accepted_per_step=row[row >= 0].tolist(),
                rejection_map=maps[b].clone() if with_drafts else None,
                extra={k: float(v[b]) for k, v in extras.items()},
                columns={k: v[b] for k, v in columns.items()},
            ))
        return out
