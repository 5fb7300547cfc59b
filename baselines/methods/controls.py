"""Negative controls: decoders broken on purpose in the ways a lossless claim can fail, each of
which the exactness check (harness/exactness/stats.py) must reject on the Markov target.

- `scd_one_noise_row` (scd, gumbel): every position drafts with the same Gumbel noise row;
- `scd_tail_noise` (scd, gumbel): the last `TAIL` positions share one noise row (SCD's released
  sampler keeps one row for its single-token steps);
- `scd_released_maximal` (scd, maximal): a kept old guess keeps its old q for the next test (SCD's
  released bookkeeping, `__call__max`);
- `sjd_wrong_residual` (sjd): a rejected draft is replaced by a sample of p instead of
  norm(max(p - q, 0));
- `sjd_pac_longest_path` (sjd_pac): the released sampler's longest accepted root-to-leaf path instead
  of the first accepted sibling per level.

Each is built from the decoder of conf/decoder/<base>.yaml with one part swapped."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from baselines.framework.acceptance import ExactRule, TreeVerdict, Verdict, _normalise, speculative_verdict
from baselines.framework.canvas import Canvas, Context, span
from baselines.framework.drafts import Outcome, _JacobiRun
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.coupled_jacobi import CoupledJacobiDraft, _CoupledRun, gumbel_argmax, keyed_gumbel
from baselines.methods.proactive import ProactiveDecoder
from harness.runtime.sampling import sample_from


# ----------------------------------------------------------------------------- shared Gumbel noise
class SharedNoiseDraft(CoupledJacobiDraft):
    """SCD's Gumbel coupling whose noise row of every position >= `shared_from` is that of
    position `shared_from` (0: one row for the whole image)."""

    def __init__(self, window: int, init: str, shared_from: int, head: int = 0, tail: int = 0) -> None:
        super().__init__(window=window, init=init, coupling="gumbel", head=head, tail=tail)
        self.shared_from = int(shared_from)

    def start(self, ctx: Context, canvas: Canvas) -> "_SharedNoiseRun":
        return _SharedNoiseRun(self, ctx, canvas)


class _SharedNoiseRun(_CoupledRun):
    source: SharedNoiseDraft

    def _samples(self, outcome: Outcome) -> Tensor:
        positions = outcome.start[:, None] + span(self.source.length + 1, outcome.start.device)
        folded = positions.clamp(max=self.source.shared_from)  # [B, L+1]
        return gumbel_argmax(outcome.p, keyed_gumbel(self.ctx.streams.keys, folded, self.ctx.vocab))


# ----------------------------------------------------------------------------- SCD's released bookkeeping
class ReleasedMaximalDraft(CoupledJacobiDraft):
    """SCD's maximal coupling as its released code books it (jacobi_iteration_lumina_mgpt_SCDMC.py
    `__call__max`): the coupling applied once, then a kept old guess keeps its old q for the next
    test and a redrawn one gets p (`scd` books p for both, the law each guess has)."""

    def __init__(self, window: int, init: str, head: int = 0, tail: int = 0) -> None:
        super().__init__(window=window, init=init, coupling="maximal", head=head, tail=tail)

    def start(self, ctx: Context, canvas: Canvas) -> "_ReleasedMaximalRun":
        return _ReleasedMaximalRun(self, ctx, canvas)


class _ReleasedMaximalRun(_CoupledRun):
    def observe(self, canvas: Canvas, outcome: Outcome) -> None:
        length = self.source.length
        p = outcome.p[:, :length]
        verdict = speculative_verdict(p, self.q, self.tokens, self.ctx.streams.draw((length,)))
        fresh = sample_from(verdict.residual, self.ctx.streams)  # [B, L]
        samples = torch.cat([torch.where(verdict.accept, self.tokens, fresh), outcome.samples[:, length:]], 1)
        booked = torch.cat([torch.where(verdict.accept[..., None], self.q, p), outcome.p[:, length:]], 1)
        _JacobiRun.observe(self, canvas, Outcome(start=outcome.start, p=booked, samples=samples, res=outcome.res))

    def _samples(self, outcome: Outcome) -> Tensor:
        """observe has coupled the guesses already: the shift takes them as they are."""
        return outcome.samples


# ----------------------------------------------------------------------------- a wrong residual
class ResidualIsP(ExactRule):
    """The exact test with a wrong residual: a rejected draft is replaced by a sample of p."""

    def decide(self, p: Tensor, q: Tensor | None, drafts: Tensor, u: Tensor, ctx: Context) -> Verdict:
        return Verdict(accept=speculative_verdict(p, q, drafts, u).accept, residual=p)


# ----------------------------------------------------------------------------- SJD-PAC's released selection
class LongestPathDecoder(ProactiveDecoder):
    """SJD-PAC's released selection (SJDPACSpeculativeSampler.__call__): every sibling is tested as
    if its earlier siblings had been rejected, each node with uniforms of its own; the kept path is
    the root-to-leaf path with the longest passed prefix (ties: the chain, then the lower block
    index); the token after it is drawn from what all the stop node's children leave, or from its p
    at a leaf."""

    def _walk(self, p, children, block, depth, u, limit, ctx) -> TreeVerdict:
        b, n, k = children.shape
        levels = u.shape[1]
        q = self.rule.q
        uu = ctx.streams.draw((n, k))
        level = torch.cat([torch.zeros_like(depth[:, :1]), depth], 1)  # [B, n]
        real = children >= 0
        valid = real & (level < limit[:, None])[..., None]
        kids = children.clamp_min(0)
        xs = block.gather(1, kids.flatten(1)).view(b, n, k)
        passes = torch.zeros(b, n, k, dtype=torch.bool)
        pc, qc = p, q
        for j in range(k):
            x = xs[..., j:j + 1]
            passes[..., j] = valid[..., j] & (uu[..., j] * qc.gather(-1, x)[..., 0] < pc.gather(-1, x)[..., 0])
            tried = valid[..., j:j + 1]  # what is left after sibling j, where it exists
            pc = torch.where(tried, _normalise((pc - qc).clamp_min(0.0), pc), pc)
            qc = torch.where(tried, _normalise(qc.scatter(-1, x, 0.0), qc), qc)
        parent = torch.zeros(b, n, dtype=torch.long)
        passed = torch.zeros(b, n, dtype=torch.bool)
        owner = span(n, p.device)[None, :, None].expand_as(children)
        flat = (kids + span(b, p.device)[:, None, None] * n)[real]
        parent.view(-1).scatter_(0, flat, owner[real])
        passed.view(-1).scatter_(0, flat, passes[real])
        passed[:, 0] = True
        chain = passed.clone()
        for _ in range(levels):
            chain = passed & chain.gather(1, parent)
        index = span(n, p.device)[None]
        score = torch.where(chain, level * 4 * n + (index <= levels) * 2 * n + (n - index), -1)
        stop = score.argmax(1, keepdim=True)  # [B, 1]
        accepted = level.gather(1, stop)[:, 0]
        path = torch.zeros(b, levels + 1, dtype=torch.long)
        cur = stop
        for _ in range(levels):
            path.scatter_(1, level.gather(1, cur), cur)
            cur = parent.gather(1, cur)
        path = path[:, 1:].masked_fill(span(levels, p.device)[None] >= accepted[:, None], 0)
        rejected = valid.any(-1).gather(1, stop)  # [B, 1]
        at = stop[..., None].expand(-1, -1, p.shape[-1])
        dist = torch.where(rejected, pc.gather(1, at)[:, 0], p.gather(1, at)[:, 0])
        return TreeVerdict(path=path, accepted=accepted, dist=dist, rejected=rejected[:, 0])


# ----------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Control:
    """A control: the config it starts from (decoder name + overrides relative to it), its defect,
    and how the built decoder is broken (decoder, image length N -> decoder)."""

    base: str
    overrides: tuple[str, ...]
    defect: str
    breaks: Callable[[SpeculativeDecoder, int], SpeculativeDecoder]


TAIL = 10  # the released samplers' single-token tail (r = N - 10)


def _swap_draft(make: Callable[[CoupledJacobiDraft, int], CoupledJacobiDraft]):
    def breaks(decoder: SpeculativeDecoder, n: int) -> SpeculativeDecoder:
        decoder.draft = make(decoder.draft, n)
        return decoder
    return breaks


def _wrong_residual(decoder: SpeculativeDecoder, n: int) -> SpeculativeDecoder:
    decoder.accept = ResidualIsP()
    return decoder


def _longest_path(decoder: ProactiveDecoder, n: int) -> ProactiveDecoder:
    return LongestPathDecoder(decoder.sampling, decoder.draft, decoder.accept, tree_width=decoder.tree_width,
                              tree_depth=decoder.tree_depth)


CONTROLS: dict[str, Control] = {
    "scd_one_noise_row": Control("scd", (), "one Gumbel noise row for every position",
                                 _swap_draft(lambda d, n: SharedNoiseDraft(d.length, d.init, 0, d.head, d.tail))),
    "scd_tail_noise": Control("scd", (), f"one Gumbel noise row for the last {TAIL} positions",
                              _swap_draft(lambda d, n: SharedNoiseDraft(d.length, d.init, n - TAIL, d.head, d.tail))),
    "scd_released_maximal": Control("scd", ("draft.coupling=maximal",),
                                    "a kept guess keeps its old q (SCD's released maximal bookkeeping)",
                                    _swap_draft(lambda d, n: ReleasedMaximalDraft(d.length, d.init, d.head, d.tail))),
    "sjd_wrong_residual": Control("sjd", (), "a rejection resampled from p, not the residual", _wrong_residual),
    "sjd_pac_longest_path": Control("sjd_pac", (), "SJD-PAC's released longest-accepted-path selection",
                                    _longest_path),
}
