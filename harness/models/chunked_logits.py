"""Wide forwards' logits a chunk of positions at a time, and only the positions a decoder reads.

A whole-image forward at 1024 px (MuLo-SD's verification: T = 4096 positions, V = 16384 codes, 2B
rows under guidance) would hold [2B, T, V] logits in the weights' dtype before guidance mixes them
(4.3 GB at batch 16 in bf16), the mixed float logits [B, T, V], the decoder's gather of the
positions it verifies [B, J, V] and their softmax [B, J, V]. A model that projects in chunks
(`GPT`, through `ImageModel.forward(..., mix=, select=, finish=)`) gathers the hidden states of the
selected positions first ([2B, J, dim]: 0.17 GB), then projects them through the output layer
`LOGITS_CHUNK` positions at a time, mixes each chunk (guidance) and finishes it (the decoder's
sampling filters and softmax) into one float output [B, J, V]: only that output is whole.

Mix and finish are row-wise, so they give the same values whether they see a chunk or the whole. The
projection is a matrix product over the same rows and features; only its M dimension (rows x
positions) changes with the chunk. CPU kernels give identical rows (tests/test_chunked_logits.py); a
GPU library may choose another kernel for the smaller product, which can change the last bits of a
logit (as a forward of another width or batch size can).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

LOGITS_CHUNK = 256  # positions per chunk of a wide forward's projection and guidance mix

Mix = Callable[[Tensor], Tensor]  # logits [R, c, V] in model rows -> float [B, c, V] in caller rows
Finish = Callable[[Tensor], Tensor]  # float [B, c, V] -> [B, c, V], row-wise (e.g. filters + softmax)


@dataclass(frozen=True)
class Outputs:
    """What a cached forward returns instead of its float logits: `finish(mix(logits))` at the
    positions `select` [R, J] of each model row (None: every position). `mix` maps model rows to
    caller rows (guidance; default: the logits as float)."""

    mix: Mix = Tensor.float
    select: Tensor | None = None
    finish: Finish | None = None

    def of(self, output: Callable[[Tensor], Tensor], logits: Tensor | None, hidden: Tensor) -> Tensor:
        """The forward's result from its logits [R, T, V] when the stack projected them whole
        (narrow, nothing selected), else from its hidden states [R, T, dim] through `output`."""
        if logits is not None:
            mixed = self.mix(logits)
            return mixed if self.finish is None else self.finish(mixed)
        picked = hidden if self.select is None else select_positions(hidden, self.select)
        return project_in_chunks(output, picked, self.mix, self.finish)


def project_in_chunks(output: Callable[[Tensor], Tensor], hidden: Tensor, mix: Mix,
                      finish: Finish | None = None, chunk: int | None = None) -> Tensor:
    """hidden [R, T, dim] after the final norm -> float [B, T, V] = finish(mix(output(hidden))),
    computed `chunk` positions (default `LOGITS_CHUNK`) at a time into one preallocated output."""
    chunk = chunk or LOGITS_CHUNK
    done = (lambda x: x) if finish is None else finish  # noqa: E731
    first = done(mix(output(hidden[:, :chunk])))
    out = torch.empty((first.shape[0], hidden.shape[1], first.shape[2]), dtype=first.dtype, device=first.device)
    out[:, :chunk] = first
    del first
    for start in range(chunk, hidden.shape[1], chunk):
        out[:, start:start + chunk] = done(mix(output(hidden[:, start:start + chunk])))
    return out


def select_positions(hidden: Tensor, select: Tensor) -> Tensor:
    """hidden [R, T, dim], select [R, J] position indices -> hidden[r, select[r, j]] [R, J, dim]."""
    return hidden.gather(1, select[..., None].expand(-1, -1, hidden.shape[-1]))


def selected_outputs(model: Any, tokens: Tensor, positions: Tensor, select: Tensor, finish: Finish) -> Tensor:
    """finish(model.forward(tokens, positions)[rows, select]) for select [B, J] -> [B, J, V]: the
    decoder's distributions at the positions it reads. A model that `selects_outputs` computes them
    chunk by chunk (no [B, T, V] logits); any other gives the same values the plain way."""
    if getattr(model, "selects_outputs", False):
        return model.forward(tokens, positions, select=select, finish=finish)
    logits = model.forward(tokens, positions)
    return finish(logits.gather(1, select[..., None].expand(-1, -1, logits.shape[-1])))
