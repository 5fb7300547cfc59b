"""The speculative decoding loop, written once: propose -> verify in one target forward -> decide
-> resolve (-> resample) -> commit. Methods are compositions of pieces chosen in config:

    sjd           = jacobi draft + exact rule   + raster scope
    gsd           = jacobi draft + grouped rule + raster scope   (baselines/methods/grouped.py)
    sd            = model draft  + exact rule   + raster scope
    lantern_chain = model draft  + lantern rule + raster scope
    scd           = coupled jacobi draft (gumbel / maximal) + exact rule + raster scope
    sjd_pac       = coupled jacobi draft (maximal) + exact rule over a proactive tree + raster scope
                    (the step verifies a draft tree beside the window: baselines/methods/proactive.py)
    (MuLo-SD = lowres draft + pooled_threshold rule + local(l) scope + serial/parallel resampler)
The paper's EAGLE-2 and LANTERN (`eagle2`, `lantern`) and LANTERN++ (`lantern_pp`) verify draft
trees instead of chains: baselines/methods/tree_decoding.py.

One step, for every batch row b at its own frontier n_b (the loop never branches on a row):
1. the draft run proposes L tokens for positions n_b .. n_b+L-1 (and their q);
2. one target forward over the committed-but-unencoded tokens (fed_b .. n_b-1) and the drafts
   gives p [B, L+1, V] for positions n_b .. n_b+L (offset L: the bonus distribution);
3. the rule turns (p, q, drafts, uniforms) into accept [B, L] and residuals;
4. the scope turns accept into a Resolution (kept drafts, the offset `first` to sample, advance);
5. one token is sampled at every offset (residual at `first`, p elsewhere; the jacobi source
   keeps the others as its next guesses); the token at `first` is committed;
6. an optional resampler refills further positions (MuLo-SD), then the frontiers advance.
Finished rows ride along on the scratch slot (baselines/framework/canvas.py) and draw random numbers that
no longer matter, so every image sees the same draws whatever its batch. The loop ends when no row
is active (read one step late off the CPU: harness/runtime/hostsync.py) or when the scope's least
advance per step says that every row has finished, whichever comes first.
"""
from __future__ import annotations

from functools import partial
from typing import Sequence

import torch
from torch import Tensor

from baselines.framework.acceptance import AcceptanceRule, Verdict
from baselines.framework.canvas import Canvas, Context, span
from baselines.framework.drafts import Draft, DraftRun, DraftSource, Outcome, scheduled
from baselines.framework.recorder import StatsRecorder
from baselines.framework.redraw import record_redraw, record_tau_curve
from baselines.framework.scope import RasterScope, RejectionScope, Resampler, Resolution
from harness.api import Condition, Generation, ModelBundle, SamplingParams
from harness.models.chunked_logits import selected_outputs
from harness.runtime.hostsync import Running
from harness.runtime.randomness import ImageStreams
from harness.runtime.sampling import probs, sample, sample_from


class SpeculativeDecoder:
    """Draft-verify decoding from a draft source, an acceptance rule and a rejection scope.

    Args:
        sampling: how logits become p, for the target and every drafter.
        draft: a DraftSource (baselines/framework/drafts.py).
        accept: an AcceptanceRule (baselines/framework/acceptance.py).
        scope: a RejectionScope (baselines/framework/scope.py); default `raster`.
        resampler: refills the positions a scope marks for resampling (scopes with
            `needs_resampler`); none of the baselines needs one.
        name: decoder label; default "<draft>+<rule>+<scope>".
        tau_curve: scopes that resample (MuLo-SD): also record the one-pass tau curve
            (baselines/framework/redraw.py; about 14 schedule computations per generate call, inside
            the timed decode); false leaves it out.
    """

    cache_scratch = 0  # scratch cache slots a verification writes beyond the sequence's (none)

    def __init__(self, sampling: SamplingParams, draft: DraftSource, accept: AcceptanceRule,
                 scope: RejectionScope | None = None, resampler: Resampler | None = None,
                 name: str | None = None, tau_curve: bool = True) -> None:
        self.sampling = sampling
        self.tau_curve = bool(tau_curve)
        self.draft = draft
        self.accept = accept
        self.scope = scope if scope is not None else RasterScope()
        self.resampler = resampler
        if self.scope.needs_resampler and resampler is None:
            raise ValueError(f"rejection scope {self.scope.name!r} marks positions for resampling: "
                             "set the decoder's `resampler`")
        self.name = name or f"{draft.name}+{accept.name}+{self.scope.name}"

    @torch.inference_mode()
    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """cond of batch B, seeds [B] -> tokens [B, rows*cols] and one DecodeStats per image."""
        target = models.target
        draft, scope = self._bound(models)
        if self.cache_scratch:  # draft-tree nodes beside the window (baselines/methods/proactive.py)
            target.setup_cache(len(seeds), scratch=self.cache_scratch)
        else:
            target.setup_cache(len(seeds))
        logits = target.prefill(cond)  # [B, V]: position 0
        streams = ImageStreams(seeds, logits.device)
        ctx = Context(models=models, cond=cond, sampling=self.sampling, streams=streams, device=logits.device,
                      refeed=scope.refeed)
        n = ctx.n_tokens
        canvas = Canvas.empty(ctx.batch, n, pad=draft.length + scope.refeed + 1, device=ctx.device)
        canvas.tokens[:, 0] = sample(logits, self.sampling, streams)
        canvas.frontier.fill_(1)
        rec = StatsRecorder(ctx.batch, ctx.grid, ctx.device)
        rec.forward(torch.ones_like(canvas.active), torch.ones_like(canvas.frontier))  # the prefill
        run = draft.start(ctx, canvas)
        rec.add_drafter(run.prefill_forwards)
        verified: Tensor | None = None  # the scope's per-row round counts (Resolution.verified)
        running = Running(ctx.device)  # the loop's one host read per step (harness/runtime/hostsync.py)
        # Positions left in any row, known without a host read: every step advances each row by
        # at least scope.least_advance(L) or to its end. Off the CPU `running` answers one step
        # late; this bound ends the loop when the steps taken must have finished every row
        # (MuLo-SD's single whole-image verification), with no step after the last row's end.
        left = n - 1
        while left > 0 and running(active := canvas.active):
            verified = self._step(ctx, canvas, active, run, rec, scope, verified)
            left -= scope.least_advance(draft.length)
        steps = rec.stacked()
        self._summarise(rec, steps)
        if scope.needs_resampler:  # MuLo-SD: where it redrew, and the one-pass tau curve
            record_redraw(rec, steps, canvas.tokens[:, :n])
            if self.tau_curve and "score" in steps and scope.rounds == 1 and getattr(draft, "whole_image", False):
                record_tau_curve(rec, ctx, scope, self.resampler, steps["score"][0], steps["start"][0])
        stats = rec.finish(with_drafts=True, extra=ctx.counters)
        return Generation(tokens=canvas.tokens[:, :n].clone(), stats=stats)

    def _bound(self, models: ModelBundle) -> tuple[DraftSource, RejectionScope]:
        """The draft source and scope sized for these models, once per call (MuLo-SD's lowres
        source: L = rows x r x target cols; the local scope: refeed = L; the others return
        themselves)."""
        draft = self.draft.bind(models)
        scope = self.scope.bind(draft.length)
        if scope.rounds > 1 and not draft.whole_image:
            raise ValueError(f"decoder scope.rounds = {scope.rounds} verifies a drafted image again after "
                             f"redrawing, which needs one whole-image draft: use the lowres draft with "
                             f"draft.rows=null (got draft {draft.name!r} with {draft.length} drafts per "
                             f"verification), or set scope.rounds=1")
        check_layout = getattr(self.accept, "check_layout", None)  # optional (AcceptanceRule)
        if check_layout is not None:
            check_layout(draft, scope)
        return draft, scope

    def _step(self, ctx: Context, canvas: Canvas, active: Tensor, run: DraftRun, rec: StatsRecorder,
              scope: RejectionScope, verified: Tensor | None) -> Tensor | None:
        """One verification step of the rows active [B] (canvas.active); verified [B] or None: the
        previous resolution's round counts (returned for the next step)."""
        start = canvas.frontier  # replaced, never written, by the step
        remaining = ctx.n_tokens - start
        draft = run.propose(canvas)
        length = draft.tokens.shape[1]
        base = start[:, None]  # [B, 1]
        canvas.write(base + span(length, start.device), draft.tokens)
        p = self._verify(ctx, canvas, draft, scope.refeed)  # [B, L+1, V]
        u = ctx.streams.draw((length,))
        verdict = self.accept.decide(p[:, :length], draft.q, draft.tokens, u, ctx)
        verdict = self._scheduled(ctx, start, p[:, :length], verdict)
        res = scope.resolve(verdict.accept, remaining, ctx.grid, verified)
        first = res.first[:, None]  # [B, 1]
        samples = self._sample(ctx, p, verdict.residual, first)
        canvas.write(base + first, samples.gather(1, first))
        extra: Tensor | int = 0  # the resampler's target forwards
        if self.resampler is not None:
            res, extra = self.resampler.fill(ctx, canvas, res)
        canvas.fed = torch.where(active, start + res.kv_valid, canvas.fed)
        canvas.frontier = torch.where(active, start + res.advance, start)
        run.observe(canvas, Outcome(start=start, p=p, samples=samples, res=res))
        self._record(rec, active, start, draft, res, extra, redraw=scope.needs_resampler, score=verdict.score)
        return res.verified

    def _scheduled(self, ctx: Context, start: Tensor, p: Tensor, verdict: Verdict) -> Verdict:
        """The verdict under the draft source's single-token head and tail (drafts.scheduled):
        offsets past a row's allowance [B] are not accepted and their residual is p, so the token
        at the first of them is drawn from p as in raster decoding. p [B, L, V]."""
        room = scheduled(self.draft, start, p.shape[1], ctx.n_tokens)
        if room is None:
            return verdict
        allowed = span(p.shape[1], p.device)[None] < room[:, None]  # [B, L]
        return Verdict(accept=verdict.accept & allowed,
                       residual=torch.where(allowed[..., None], verdict.residual, p))

    def _verify(self, ctx: Context, canvas: Canvas, draft: Draft, refeed: int) -> Tensor:
        """One target forward over canvas[fed .. frontier + L - 1] (width min(refeed + L, N), fixed)
        -> p [B, L+1, V] for positions frontier .. frontier + L.

        Inputs at or past the last position N - 1 predict nothing that exists, and a window starts
        at fed >= 0, so N inputs always reach the end: a whole-image block (MuLo-SD, L = N,
        refeed = N) feeds N tokens, not 2N, and the width stays known without a host sync.

        Every scope leaves an active row with frontier - refeed <= fed <= frontier - 1 (kv_valid <
        advance), so the input predicting the frontier is at offset frontier - 1 - fed < refeed: with
        refeed = 1 and a window not cut at N, the outputs are p's offsets 0..L as they stand."""
        length = draft.tokens.shape[1]
        width = min(refeed + length, ctx.n_tokens)
        tokens, positions = canvas.read(canvas.fed, width)
        if refeed == 1 and width == length + 1:
            logits = ctx.models.target.forward(tokens, positions)  # [B, W, V]: predicts position + 1
            return probs(logits, ctx.sampling)
        offset = (canvas.frontier - 1 - canvas.fed).clamp_min(0)  # input index predicting n_b
        index = (offset[:, None] + span(length + 1, offset.device)).clamp(max=width - 1)
        # p at the inputs `index` only, a chunk of positions at a time where the model can
        # (harness/models/chunked_logits.py: no [B, W, V] logits beside p at 1024 px)
        return selected_outputs(ctx.models.target, tokens, positions, index, partial(probs, params=ctx.sampling))

    @staticmethod
    def _sample(ctx: Context, p: Tensor, residual: Tensor, first: Tensor) -> Tensor:
        """One token per offset 0..L [B, L+1]: from the residual at offset first [B, 1] (the bonus
        p when first = L), from p elsewhere; L + 1 uniforms per image."""
        length = residual.shape[1]
        at_first = span(length + 1, first.device) == first  # [B, L+1]
        dist = torch.where(at_first[..., None], torch.cat([residual, p[:, length:]], 1), p)
        return sample_from(dist, ctx.streams)

    @staticmethod
    def _record(rec: StatsRecorder, active: Tensor, start: Tensor, draft: Draft, res: Resolution,
                extra: Tensor | int, redraw: bool = False, score: Tensor | None = None) -> None:
        """Keep one step's raw tensors; `_summarise` counts all steps at once. `redraw` (scopes that
        resample): also keep the drafts [B, L] and the rule's score [B, L] where it has one
        (baselines/framework/redraw.py)."""
        more: dict[str, Tensor] = {}
        if redraw:
            more["draft"] = draft.tokens
            if score is not None:
                more["score"] = score
        rec.step(active=active, start=start, advance=res.advance, extra=extra, first=res.first,
                 drafter=draft.drafter_forwards, keep=res.keep, resample=res.resample, rejected=res.rejected,
                 **more)

    @staticmethod
    def _summarise(rec: StatsRecorder, s: dict[str, Tensor]) -> None:
        """Every step's counts from the stacked steps s[name] [S, B, ...]: target forwards (1 + the
        resampler's), drafter forwards, drafts inside the image (proposed), kept drafts, tokens
        resampled (t0 when its draft was rejected, plus the resample set) and the rejection map."""
        if not s:
            return
        length = s["keep"].shape[-1]
        valid = torch.arange(length, device=s["start"].device) < (rec.n_tokens - s["start"])[..., None]
        at_first = s["rejected"].gather(-1, s["first"].clamp(max=length - 1)[..., None])[..., 0]
        first_rejected = at_first & (s["first"] < length)
        rec.forward(s["active"], s["advance"], target=1 + s["extra"], drafter=s["drafter"])
        rec.drafts(s["active"], s["start"], proposed=valid.sum(-1), accepted=s["keep"].sum(-1),
                   resampled=first_rejected.long() + s["resample"].sum(-1), rejected=s["rejected"])
