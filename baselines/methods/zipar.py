"""ZipAR (He et al., ICML 2025): spatially-local parallel decoding of a raster AR model, training-
free and without verification (so not distribution-preserving).

Row 0 is decoded raster-style; row r+1 starts once row r holds `window` tokens; each target forward
then decodes one token in every active row, at its global raster position. Forward t (the prefill
is forward 0) decodes column t - r * window of every row r where that is in [0, cols), so an image
takes (rows - 1) * window + cols forwards instead of rows * cols; window = cols is raster decoding.

The output at slot i predicts position i + 1, so the first token of row r is predicted from slot
(r-1, cols-1), the end of the row above, which is not decoded yet when window < cols. As in
ZipAR's reference code, a stand-in token is fed there, and the real token overwrites that slot
once it exists (a "closing" input of the next forward). Which token stands in is `stand_in`:
    "reference": the newest token of row r-2 (row 0's for r = 1), as LlamaGen-ZipAR does (it
                 appends the newest token of the row above the row that reached the window);
    "above":     the newest token of row r-1.
(LlamaGen-ZipAR also decodes row 0 to its end before row 1 starts; here row 1 starts after
`window` tokens like every other row, so its stand-in is row 0's newest token under both.)
Measured on the shapes world (384 prompts, window 8, GenEval, the target before it was trained on
parallel-decoding gaps): "above" 0.674, "reference" 0.729.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from harness.api import Condition, DecodeStats, Generation, ModelBundle, SamplingParams
from harness.models.masks import attention_mask
from harness.runtime.sampling import sample
from harness.runtime.randomness import ImageStreams

MASKS = ("written", "causal")
STAND_INS = ("reference", "above")


@dataclass(frozen=True)
class ZipStep:
    """One forward: input slots [T] and the raster positions whose tokens they carry [T] (the
    slot's own token, or a stand-in); decoded positions [D] and the input predicting each [D]."""

    slots: Tensor
    sources: Tensor
    decoded: Tensor
    from_input: Tensor


@functools.lru_cache(maxsize=64)
def zipar_schedule(rows: int, cols: int, window: int, stand_in: str = "reference") -> tuple[ZipStep, ...]:
    """The forwards after the prefill (which decodes position 0) for a rows x cols grid; the
    stand-in row ends carry the newest token of row r-2 ("reference") or r-1 ("above")."""
    if stand_in not in STAND_INS:
        raise ValueError(f"zipar stand_in must be one of {STAND_INS}, got {stand_in!r}")
    window = min(window, cols)
    back = 2 if stand_in == "reference" else 1  # rows above the starting row
    done_at = {(r, c): r * window + c for r in range(rows) for c in range(cols)}  # forward decoding (r, c)
    steps = []
    for t in range(1, (rows - 1) * window + cols):
        inputs: dict[int, int] = {}  # slot -> source position
        decoded, from_slot = [], []
        for r in range(rows):
            c = t - r * window
            if not 0 <= c < cols:
                continue
            slot = r * cols + c - 1  # the slot whose output predicts (r, c)
            if c == 0 and done_at[(r - 1, cols - 1)] >= t:  # the row above is not finished
                src = max(r - back, 0)
                newest = min(t - 1 - src * window, cols - 1)  # that row's newest token
                inputs[slot] = src * cols + newest
            else:
                inputs[slot] = slot
            decoded.append(r * cols + c)
            from_slot.append(slot)
        for r in range(rows - 1):  # closing: a row's last token replaces the stand-in below it
            last = r * cols + cols - 1
            if done_at[(r, cols - 1)] == t - 1 and (r + 1) * window < t and last not in inputs:
                inputs[last] = last
        slots = sorted(inputs)
        steps.append(ZipStep(
            slots=torch.tensor(slots), sources=torch.tensor([inputs[s] for s in slots]),
            decoded=torch.tensor(decoded), from_input=torch.tensor([slots.index(s) for s in from_slot]),
        ))
    return tuple(steps)


@functools.lru_cache(maxsize=64)
def written_masks(rows: int, cols: int, window: int, stand_in: str, prefix: int, batch: int,
                  device: torch.device) -> tuple[Tensor, ...]:
    """The "written" mask [B, T, S] of every forward of the schedule (S = prefix + rows * cols cache
    slots): the prefix and the slots written so far (decoded or stand-in) at or before each query;
    the schedule is the same for every image, so these are made once per batch size (each a
    [T, S] mask expanded over the batch)."""
    written = torch.zeros(prefix + rows * cols, dtype=torch.bool, device=device)
    written[:prefix] = True
    masks = []
    for step in zipar_steps(rows, cols, window, stand_in, device):
        written[prefix + step.slots] = True
        mask = attention_mask(prefix + step.slots, written.shape[0], ~written, own=False)
        masks.append(mask.expand(batch, -1, -1))
    return tuple(masks)


@functools.lru_cache(maxsize=64)
def zipar_steps(rows: int, cols: int, window: int, stand_in: str,
                device: torch.device) -> tuple[ZipStep, ...]:
    """`zipar_schedule` with its index tensors on `device`, copied once (not one host-to-device copy
    per forward)."""
    return tuple(ZipStep(*(t.to(device) for t in (s.slots, s.sources, s.decoded, s.from_input)))
                 for s in zipar_schedule(rows, cols, window, stand_in))


@dataclass(frozen=True)
class ZipLayout:
    """A schedule's forwards side by side (the low-resolution drafter of baselines/methods/lowres.py builds
    each proposal's index tables and masks from it in one go): forward i feeds inputs
    inputs_at[i] .. inputs_at[i + 1] - 1 and decodes decoded_at[i] .. decoded_at[i + 1] - 1.

    slots, sources [T]: every forward's ZipStep.slots and .sources, forward after forward;
    forward [T, 1]: the forward of each input; decoded [D]: the ZipStep.decoded, forward after
    forward; from_input: each forward's ZipStep.from_input; written [rows * cols + 1]: the first
    forward that feeds each slot (the number of forwards for none; the last entry: past the grid)."""

    slots: Tensor
    sources: Tensor
    forward: Tensor
    decoded: Tensor
    from_input: tuple[Tensor, ...]
    inputs_at: tuple[int, ...]
    decoded_at: tuple[int, ...]
    written: Tensor


@functools.lru_cache(maxsize=64)
def zipar_layout(rows: int, cols: int, window: int, stand_in: str, device: torch.device) -> ZipLayout:
    """`zipar_schedule` laid out side by side on `device` (ZipLayout), made once per schedule."""
    steps = zipar_schedule(rows, cols, window, stand_in)
    written = torch.full((rows * cols + 1,), len(steps))
    for i, step in reversed(list(enumerate(steps))):  # the earliest forward writes last
        written[step.slots] = i
    sizes = [len(step.slots) for step in steps]
    forward = torch.repeat_interleave(torch.arange(len(steps)), torch.tensor(sizes, dtype=torch.long))

    def joined(name: str) -> Tensor:
        return torch.cat([getattr(step, name) for step in steps] or [torch.zeros(0, dtype=torch.long)])

    return ZipLayout(slots=joined("slots").to(device), sources=joined("sources").to(device),
                     forward=forward[:, None].to(device), decoded=joined("decoded").to(device),
                     from_input=tuple(step.from_input.to(device) for step in steps),
                     inputs_at=tuple(itertools.accumulate(sizes, initial=0)),
                     decoded_at=tuple(itertools.accumulate((len(step.decoded) for step in steps), initial=0)),
                     written=written.to(device))


class ZipARDecoder:
    """`zipar`: parallel decoding with a row-start `window`.

    Args:
        sampling: how logits become p (the same as every decoder).
        window: tokens row r must hold before row r+1 starts (>= 1; >= cols is raster decoding).
        mask: "written": each query attends to the prefix and to the slots at or before its own
            that hold a token (decoded, or a stand-in); "causal": the plain slot-causal mask, so
            queries also see the empty (zero) slots of unfinished rows, as LlamaGen-ZipAR does.
        stand_in: the token fed at a row end that is not decoded yet (module docstring):
            "reference" (row r-2's newest, as LlamaGen-ZipAR) or "above" (row r-1's newest).
    """

    def __init__(self, sampling: SamplingParams, window: int = 16, mask: str = "written",
                 stand_in: str = "reference", name: str | None = None) -> None:
        if int(window) != window or window < 1:
            raise ValueError(f"decoder zipar window must be an integer >= 1, got {window!r}")
        if mask not in MASKS:
            raise ValueError(f"decoder zipar mask must be one of {MASKS}, got {mask!r}")
        if stand_in not in STAND_INS:
            raise ValueError(f"decoder zipar stand_in must be one of {STAND_INS}, got {stand_in!r}")
        self.stand_in = stand_in
        self.sampling = sampling
        self.window = int(window)
        self.mask = mask
        self.name = name or f"zipar(window={self.window})"

    @torch.inference_mode()
    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """cond of batch B, seeds [B] -> tokens [B, rows*cols]; the schedule is the same for every
        image, so rows of the batch share positions and masks."""
        model = models.target
        rows, cols = model.grid
        n = rows * cols
        b = len(seeds)
        model.setup_cache(b)
        logits = model.prefill(cond)
        device = logits.device
        streams = ImageStreams(seeds, device)
        tokens = torch.zeros(b, n, dtype=torch.long, device=device)
        tokens[:, 0] = sample(logits, self.sampling, streams)
        steps = zipar_steps(rows, cols, self.window, self.stand_in, device)
        masks = written_masks(rows, cols, self.window, self.stand_in, model.cache_len - n, b, device)
        for step, written in zip(steps, masks):
            mask = None if self.mask == "causal" else written
            out = model.forward(tokens[:, step.sources], step.slots, mask)  # [B, T, V]
            picked = out[:, step.from_input]  # [B, D, V]
            tokens.index_copy_(1, step.decoded, sample(picked, self.sampling, streams))
        # the schedule is static: every image takes the same forwards and commits the same counts
        per_step = [1, *(len(step.decoded) for step in steps)]
        stats = [DecodeStats(target_forwards=len(per_step), tokens=n, accepted_per_step=list(per_step))
                 for _ in range(b)]
        return Generation(tokens=tokens, stats=stats)
