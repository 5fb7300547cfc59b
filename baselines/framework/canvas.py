"""The state every speculative-decoding piece reads: the per-call `Context` and the token `Canvas`.

Positions are raster indices 0 <= i < N = rows * cols. Each batch row has its own committed
frontier `n_b` (tokens at positions < n_b are final) and its own target-KV frontier `fed_b` (the
target's cache holds the K/V of the committed tokens at positions < fed_b; fed_b <= n_b). Rows
advance independently, so every forward takes per-row positions [B, T].

Scratch slot: the cache slot of the last position N - 1 is never read by a query that matters (a
query at position i < N - 1 sees slots <= i, and the output at N - 1 would predict position N,
which does not exist). Inputs that fall outside a row's useful range (past the end of the image,
before its start, or rows that already finished) are written there, so that batch rows keep one
shape without corrupting each other.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness.api import Condition, ModelBundle, SamplingParams
from harness.runtime.randomness import ImageStreams
from baselines.framework.neighbours import neighbour_table

NEIGHBOUR_METRICS = ("raw", "normalised")


@functools.lru_cache(maxsize=256)
def span(n: int, device: torch.device) -> Tensor:
    """arange(n) int64 on `device`, made once per (n, device) and shared: read it, never write it
    (a decode step builds many index windows; each would otherwise be a new arange)."""
    return torch.arange(n, device=device)


@dataclass
class Context:
    """What the pieces of one `generate` call share: models (CFG-wrapped by the harness), the
    condition, the sampling parameters, the per-image random streams, the device and `refeed` (the
    most committed tokens a verification re-encodes ahead of its drafts; the scope's choice)."""

    models: ModelBundle
    cond: Condition
    sampling: SamplingParams
    streams: ImageStreams | None
    device: torch.device
    refeed: int = 1
    counters: dict[str, Tensor] = field(default_factory=dict)  # per-image extra statistics [B]
    _tables: dict[tuple[int, str], Tensor] = field(default_factory=dict, repr=False)

    @property
    def batch(self) -> int:
        if self.streams is None:
            raise RuntimeError("this Context has no random streams, so no batch size")
        return self.streams.batch

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.models.target.grid)  # type: ignore[return-value]

    @property
    def n_tokens(self) -> int:
        rows, cols = self.grid
        return rows * cols

    @property
    def vocab(self) -> int:
        return int(self.models.target.vocab_size)

    def count(self, name: str, values: Tensor, reduce: str = "sum") -> None:
        """Accumulate a per-image statistic values [B] into `counters[name]` ("sum" or "max");
        the loop reports them in DecodeStats.extra."""
        old = self.counters.get(name)
        values = values.detach().to(self.device, torch.float32)
        if old is None:
            self.counters[name] = values.clone()
        else:
            self.counters[name] = old + values if reduce == "sum" else torch.maximum(old, values)

    def neighbours(self, k: int, metric: str = "normalised") -> Tensor:
        """The target codebook's k-nearest-neighbour table [V, k'] int64 on `device` (k' =
        min(k, V-1)); hashed once per call, computed once per codebook (baselines/framework/neighbours.py).
        `metric`: NEIGHBOUR_METRICS — "normalised" (L2 between the codes the quantiser matches,
        `ARImageModel.codebook`) or "raw" (L2 between the stored code vectors, LANTERN's
        generate_codebook.py; the same codes when the tokenizer does not normalise)."""
        if metric not in NEIGHBOUR_METRICS:
            raise ValueError(f"neighbour metric must be one of {NEIGHBOUR_METRICS}, got {metric!r}")
        if (k, metric) not in self._tables:
            target = self.models.target
            raw = getattr(target, "raw_codebook", None) if metric == "raw" else None
            book = target.codebook if raw is None else raw
            self._tables[(k, metric)] = neighbour_table(book, k).to(self.device)
        return self._tables[(k, metric)]


def feed_positions(index: Tensor, n_tokens: int) -> Tensor:
    """Raster indices [...] -> cache positions: indices outside [0, N - 2] go to the scratch slot
    N - 1 (see the module docstring)."""
    outside = (index < 0) | (index > n_tokens - 2)
    return torch.where(outside, torch.full_like(index, n_tokens - 1), index)


@dataclass
class Canvas:
    """tokens [B, N + pad] int64: committed tokens at positions < frontier, the current drafts
    after it, padding beyond N (writes there are harmless); frontier [B], fed [B] int64. Made
    once per call by `empty`, with two constants that every window read shares: rows [B, 1]
    (0 .. B-1) and slots [N + pad] (the cache position of each raster index, `feed_positions`)."""

    tokens: Tensor
    frontier: Tensor
    fed: Tensor
    n_tokens: int
    rows: Tensor = field(repr=False)
    slots: Tensor = field(repr=False)

    @classmethod
    def empty(cls, batch: int, n_tokens: int, pad: int, device: torch.device) -> "Canvas":
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        tokens = torch.zeros(batch, n_tokens + pad, dtype=torch.long, device=device)
        slots = feed_positions(span(n_tokens + pad, device), n_tokens)
        return cls(tokens=tokens, frontier=zeros.clone(), fed=zeros.clone(), n_tokens=n_tokens,
                   rows=span(batch, device)[:, None], slots=slots)

    @property
    def active(self) -> Tensor:
        """[B] bool: rows that still have positions to decode."""
        return self.frontier < self.n_tokens

    def read(self, start: Tensor, width: int) -> tuple[Tensor, Tensor]:
        """Per-row windows: start [B] -> (tokens [B, width], cache positions [B, width]) of raster
        indices start .. start + width - 1, which must lie in [-pad, N + pad). An index before the
        image wraps around (Python indexing) to the padding, which feeds the scratch slot like
        every index >= N - 1 (the tokens read there are never used)."""
        index = start[:, None] + span(width, start.device)
        return self.tokens[self.rows, index], self.slots[index]

    def write(self, index: Tensor, values: Tensor) -> None:
        """Write values [B, W] at raster indices index [B, W] (< N + pad: a finished row, frontier
        N, writes into the padding)."""
        self.tokens.scatter_(1, index, values)
