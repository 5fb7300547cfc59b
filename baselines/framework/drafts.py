"""Draft sources: where the L draft tokens of each verification come from.

A source (`DraftSource`) is a config object (validated at construction) with `length` (L, drafts
per verification) and `start(ctx, canvas) -> DraftRun`, the per-call state; a source sized by the
models binds to them first (`bind(models)`, once per generate call). A run proposes drafts for
raster positions n_b .. n_b + L - 1 of every row (`propose`) and sees each verification's outcome
(`observe`, called once the canvas is committed and advanced). Randomness comes only from
`ctx.streams`, a fixed number of draws per image per step.

Sources: `jacobi` (SJD: the target's own guesses from its previous forward) and `model` (a
separate drafter at the target's resolution, gamma sequential drafter forwards). EAGLE-2's tree
source (`eagle`, the target's EAGLE head) is baselines/methods/eagle.py; its trees are verified by
baselines/methods/tree_decoding.py, not by this module's chain loop. MuLo-SD's `lowres` source fits the
same contract: draft whole low-res rows with the half-resolution `drafter`, up-sample them to a
block of L high-res tokens, and return q = None.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from baselines.framework.canvas import Canvas, Context, span
from baselines.framework.scope import Resolution
from harness.api import ModelBundle
from harness.runtime.sampling import probs, sample_from

JACOBI_INITS = ("random", "left", "above")
DRAFTER_ROLES = ("small_drafter", "drafter")


@dataclass(frozen=True)
class Draft:
    """tokens [B, L] int64; q [B, L, V] the distribution each was drawn from, or None when the
    drafts are deterministic given earlier randomness (q = one-hot); drafter forwards it took."""

    tokens: Tensor
    q: Tensor | None
    drafter_forwards: int = 0


@dataclass(frozen=True)
class Outcome:
    """One verification, as the loop saw it: start [B] (frontier before the step), p [B, L+1, V]
    (target distributions at offsets 0..L), samples [B, L+1] (one token drawn per offset: from the
    residual at `res.first`, from p elsewhere) and the scope's resolution."""

    start: Tensor
    p: Tensor
    samples: Tensor
    res: Resolution


class DraftRun(ABC):
    """One generate call's drafting state: `propose` drafts, `observe` (default: nothing to keep)
    sees each verification's outcome."""

    prefill_forwards: int = 0  # drafter forwards spent in `start` (counted once per image)

    @abstractmethod
    def propose(self, canvas: Canvas) -> Draft:
        """Drafts for raster positions frontier .. frontier + L - 1 of every row."""

    def observe(self, canvas: Canvas, outcome: Outcome) -> None:
        """Called once the canvas is committed and advanced."""


class DraftSource(ABC):
    """A draft source: `name`, `length` (L) and `start`, with what the loop asks of every source
    and its default: `bind(models)` (a source sized by the models returns a bound copy; default:
    itself) and `whole_image` (whether one proposal drafts the whole image; default False)."""

    name: str
    length: int
    whole_image: bool = False

    def bind(self, models: ModelBundle) -> "DraftSource":
        return self

    @abstractmethod
    def start(self, ctx: Context, canvas: Canvas) -> DraftRun:
        """The per-call drafting state for these models and this canvas."""


def _one_hot(tokens: Tensor, vocab: int) -> Tensor:
    """tokens [B, L] -> [B, L, V] float one-hot."""
    return torch.zeros(*tokens.shape, vocab, device=tokens.device).scatter_(-1, tokens[..., None], 1.0)


# ----------------------------------------------------------------------------- jacobi (SJD)
class JacobiDraft(DraftSource):
    """`jacobi` (Speculative Jacobi Decoding, Teng et al., ICLR 2025): the drafts for positions
    n .. n+L-1 are the tokens the target itself sampled there in its previous forward (q = the p
    they were sampled from); positions it has not reached yet are initialised by `init`.

    Args:
        window: L, drafts verified per target forward (the forward takes L + 1 tokens; SJD's
            reference counts the committed token in its window of 16).
        init: guesses for positions never reached: "random" (uniform token, q = uniform; SJD on
            Lumina-mGPT), "left" (the token to the left in raster order, SJD's repeat_horizon) or
            "above" (the committed token one row up, else random; SJD's "vertical repeat").
        head: the first `head` positions are decoded one token per target forward, no draft
            verified (the released samplers' jacobi_loop_interval_l; 0 = none).
        tail: likewise the last `tail` positions (the released samplers' jacobi_loop_interval_r
            = N - tail; 0 = none). The loop applies both (`scheduled`): a draft at such a position
            is never accepted and the token there is drawn from p, so the rule stays exact.
    """

    name = "jacobi"

    def __init__(self, window: int = 16, init: str = "random", head: int = 0, tail: int = 0) -> None:
        if int(window) != window or window < 1:
            raise ValueError(f"decoder draft.window must be an integer >= 1, got {window!r}")
        if init not in JACOBI_INITS:
            raise ValueError(f"decoder draft.init must be one of {JACOBI_INITS}, got {init!r}")
        for key, value in (("head", head), ("tail", tail)):
            if int(value) != value or value < 0:
                raise ValueError(f"decoder draft.{key} must be an integer >= 0, got {value!r}")
        self.length = int(window)
        self.init = init
        self.head, self.tail = int(head), int(tail)

    def start(self, ctx: Context, canvas: Canvas) -> "_JacobiRun":
        return _JacobiRun(self, ctx, canvas)


class _JacobiRun(DraftRun):
    """The window of L guesses (tokens [B, L], q [B, L, V]) for positions frontier .. frontier +
    L - 1, and the uniform distribution [V] (made once) that random guesses come from."""

    def __init__(self, source: JacobiDraft, ctx: Context, canvas: Canvas) -> None:
        self.source, self.ctx = source, ctx
        b, length, v = ctx.batch, source.length, ctx.vocab
        self.uniform = torch.full((v,), 1.0 / v, device=ctx.device)
        tokens = torch.zeros(b, length, dtype=torch.long, device=ctx.device)
        q = torch.zeros(b, length, v, device=ctx.device)
        fresh = torch.ones(b, length, dtype=torch.bool, device=ctx.device)
        self.tokens, self.q = self._initialise(canvas, tokens, q, fresh)

    def propose(self, canvas: Canvas) -> Draft:
        return Draft(tokens=self.tokens, q=self.q)

    def observe(self, canvas: Canvas, outcome: Outcome) -> None:
        """Shift the window to the new frontier: slots that this forward sampled keep their sample
        (q = the p it came from, conditioned on the old drafts, as in SJD); the rest start fresh."""
        length, advance = self.source.length, outcome.res.advance  # advance [B]
        # slot s of the new window is offset advance + s of the old one: sampled up to offset L
        src = advance[:, None] + span(length, advance.device)  # [B, L]
        fresh = src > length
        src = src.clamp(max=length)  # a fresh slot reads any sample: `_initialise` replaces it
        tokens = self._samples(outcome).gather(1, src)
        q = outcome.p[canvas.rows, src]  # [B, L, V]: the p each sample was drawn from
        self.tokens, self.q = self._initialise(canvas, tokens, q, fresh)

    def _samples(self, outcome: Outcome) -> Tensor:
        """The next guesses at offsets 0..L of the verified window [B, L+1], each distributed as
        p there: SJD keeps the loop's samples (coupled sources, baselines/methods/coupled_jacobi.py,
        draw them otherwise)."""
        return outcome.samples

    def _initialise(self, canvas: Canvas, tokens: Tensor, q: Tensor,
                    fresh: Tensor) -> tuple[Tensor, Tensor]:
        """Replace the window slots marked fresh [B, L] (a suffix of each row; slot s is raster
        position frontier + s) by `init` guesses. One random token per slot is drawn on every call,
        used or not, so the number of draws per image never depends on the batch."""
        ctx, length, v = self.ctx, self.source.length, self.ctx.vocab
        rand = (ctx.streams.draw((length,)) * v).long().clamp_max(v - 1)  # uniform tokens [B, L]
        if self.source.init == "random":
            init, init_q = rand, self.uniform
        elif self.source.init == "left":
            # every fresh slot repeats the last known token: slot carried - 1, else committed n - 1
            carried = length - fresh.sum(-1)  # [B] slots that have a sample
            sampled = tokens.gather(1, (carried - 1).clamp_min(0)[:, None])[:, 0]
            committed = canvas.tokens.gather(1, (canvas.frontier - 1).clamp_min(0)[:, None])[:, 0]
            init = torch.where(carried > 0, sampled, committed)[:, None].expand(-1, length)
            init_q = _one_hot(init, v)
        else:  # "above": the committed token one row up, else a random one
            up = canvas.frontier[:, None] + span(length, ctx.device) - ctx.grid[1]  # [B, L]
            known = (up >= 0) & (up < canvas.frontier[:, None])
            copied = canvas.tokens.gather(1, up.clamp_min(0))
            init = torch.where(known, copied, rand)
            init_q = torch.where(known[..., None], _one_hot(copied, v), self.uniform)
        return torch.where(fresh, init, tokens), torch.where(fresh[..., None], init_q, q)


def scheduled(source: DraftSource, start: Tensor, length: int, n_tokens: int) -> Tensor | None:
    """How many drafts each row may have accepted this step under the source's single-token head
    and tail (`JacobiDraft` head / tail): start [B] -> [B] in 0..length (0 inside the head, up to
    the tail's first position otherwise), or None when the source has neither."""
    head, tail = getattr(source, "head", 0), getattr(source, "tail", 0)
    if not head and not tail:
        return None
    room = (n_tokens - tail - start).clamp(0, length)
    return torch.where(start < head, torch.zeros_like(room), room)


# ----------------------------------------------------------------------------- model (SD, lantern_chain)
class ModelDraft(DraftSource):
    """`model` (draft-model speculative decoding, Leviathan et al. / gpt-fast; `lantern_chain`):
    a separate AR model at the target's resolution samples gamma tokens, one drafter forward each,
    with the target's sampling parameters (q = its p).

    Args:
        gamma: drafts per verification (the target forward takes gamma + 1 tokens).
        model: which model of the bundle drafts: "small_drafter" (the small same-resolution model)
            or "drafter" (only if it has the target's grid).
    """

    name = "model"

    def __init__(self, gamma: int = 4, model: str = "small_drafter") -> None:
        if int(gamma) != gamma or gamma < 1:
            raise ValueError(f"decoder draft.gamma must be an integer >= 1, got {gamma!r}")
        if model not in DRAFTER_ROLES:
            raise ValueError(f"decoder draft.model must be one of {DRAFTER_ROLES}, got {model!r}")
        self.length = int(gamma)
        self.model = model

    def start(self, ctx: Context, canvas: Canvas) -> "_ModelRun":
        drafter = getattr(ctx.models, self.model)
        if drafter is None:
            raise ValueError(f"model bundle {ctx.models.name!r} has no {self.model}; draft.model must name a "
                             f"model the bundle has (one of {DRAFTER_ROLES})")
        if tuple(drafter.grid) != ctx.grid or drafter.vocab_size != ctx.vocab:
            raise ValueError(f"draft.model={self.model} has grid {tuple(drafter.grid)} and vocabulary "
                             f"{drafter.vocab_size}; the `model` source needs the target's {ctx.grid} and "
                             f"{ctx.vocab} (a lower-resolution drafter is MuLo-SD's `lowres` source)")
        return _ModelRun(self.length, drafter, ctx)


class _ModelRun(DraftRun):
    """observe: nothing to keep; the next proposal re-feeds what the drafter's cache lacks."""

    prefill_forwards = 1

    def __init__(self, gamma: int, drafter, ctx: Context) -> None:  # drafter: ARImageModel
        self.gamma, self.drafter, self.ctx = gamma, drafter, ctx
        drafter.setup_cache(ctx.batch)
        drafter.prefill(ctx.cond)

    def propose(self, canvas: Canvas) -> Draft:
        """gamma drafter forwards. The first re-feeds the last refeed + 1 committed tokens, which
        covers every committed position whose drafter K/V is missing or stale (re-encoding a valid
        one rewrites the same values); draft j then goes in at position n + j, all in one window
        read [B, refeed + gamma] (raster n - refeed - 1 .. n + gamma - 2)."""
        ctx, n, width = self.ctx, canvas.frontier, self.ctx.refeed + 1
        tokens, positions = canvas.read(n - width, width + self.gamma - 1)
        logits = self.drafter.forward(tokens[:, :width], positions[:, :width])[:, -1:]  # [B, 1, V]: for n
        drafts, qs = [], []  # [B, 1] and [B, 1, V] each
        for j in range(self.gamma):
            if j:  # the previous draft, at position n + j - 1 (window input width + j - 1)
                logits = self.drafter.forward(drafts[-1], positions[:, width + j - 1:width + j])
            q = probs(logits, ctx.sampling)
            drafts.append(sample_from(q, ctx.streams))
            qs.append(q)
        return Draft(tokens=torch.cat(drafts, 1), q=torch.cat(qs, 1), drafter_forwards=self.gamma)
