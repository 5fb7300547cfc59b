"""MuLo-SD (issue 5) on small random models: the lowres draft at tau = 0, exactness of serial
resampling when everything is rejected, the local scope's geometry, rejection islands, batch
invariance, statistics, and every MuLo-SD experiment composing and running on a tiny config."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from scipy import ndimage

from baselines.framework.acceptance import Verdict
from baselines.methods.islands import block_islands, island_steps
from baselines.methods.local import LocalScope
from baselines.methods.lowres import LowResDraft
from baselines.methods.pooled import PooledThresholdRule, pooled_mass
from baselines.methods.raster import RasterDecoder
from baselines.methods.resampling import IslandResampler
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.upsamplers import NearestUpsampler, PixelUpsampler, build_upsampler
from harness.api import ModelBundle, SamplingParams
from harness.datasets.prompts import shapes
from harness.models.random.bundle import build
from harness.run import _build, guided, run
from harness.store.samples import plan
from harness.runtime import hostsync
from harness.runtime.sampling import probs
from tests.conftest import CONF, compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

GREEDY = SamplingParams(temperature=0.0, cfg_scale=2.0)
SAMPLED = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, cfg_scale=2.0)
PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a star"]


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return build(grid=8, vocab=32, dim=32)  # target 8 x 8, drafter 4 x 4 (r = 2)


class RejectAll:
    """An acceptance rule that rejects every draft (resample from p)."""

    name = "reject_all"

    def decide(self, p, q, drafts, u, ctx) -> Verdict:  # type: ignore[no-untyped-def]
        return Verdict(accept=torch.zeros_like(drafts, dtype=torch.bool), residual=p)


class RejectAt:
    """Rejects the drafts at fixed raster positions of the target grid (frontier-relative)."""

    name = "reject_at"

    def __init__(self, positions: set[int]) -> None:
        self.positions = positions

    def decide(self, p, q, drafts, u, ctx) -> Verdict:  # type: ignore[no-untyped-def]
        start = ctx.n_tokens - self.remaining(ctx)
        index = start[:, None] + torch.arange(drafts.shape[1])
        hit = torch.zeros_like(index, dtype=torch.bool)
        for pos in self.positions:
            hit |= index == pos
        return Verdict(accept=~hit, residual=p)

    @staticmethod
    def remaining(ctx) -> torch.Tensor:  # type: ignore[no-untyped-def]
        return ctx.n_tokens - ctx.counters["_frontier"].long()


class _Frontier(LowResDraft):
    """A lowres source that exposes each proposal's frontier (to RejectAt) and its drafts."""

    def start(self, ctx, canvas):  # type: ignore[no-untyped-def]
        run = super().start(ctx, canvas)
        run.proposals = []
        propose = run.propose

        def spy(c):  # type: ignore[no-untyped-def]
            ctx.counters["_frontier"] = c.frontier.double()
            draft = propose(c)
            run.proposals.append(draft.tokens.clone())
            return draft

        run.propose = spy
        return run


def _mulo(params: SamplingParams, rule, upsampler=None, rows=None, radius=3, schedule="parallel",
          window=2, context="visible", kv="refresh", draft_schedule="zipar") -> SpeculativeDecoder:
    draft = _Frontier(upsampler or NearestUpsampler(), rows=rows, schedule=draft_schedule, window=2)
    return SpeculativeDecoder(params, draft, rule, LocalScope(radius),
                              IslandResampler(schedule, window=window, context=context, kv=kv))


def _clean(stats) -> list[dict]:  # type: ignore[no-untyped-def]
    return [{k: v for k, v in s.as_row().items() if not k.startswith("_")} for s in stats]


# ----------------------------------------------------------------------------- tau = 0
@pytest.mark.parametrize("up", ["nearest", "pixel"])
@pytest.mark.parametrize("rows", [None, 1])
def test_tau_zero_outputs_the_upsampled_draft(bundle: ModelBundle, up: str, rows: int | None) -> None:
    models = guided(bundle, SAMPLED)
    upsampler = NearestUpsampler() if up == "nearest" else PixelUpsampler()
    decoder = _mulo(SAMPLED, PooledThresholdRule(k=4, tau=0.0), upsampler, rows=rows)
    out = decoder.generate(models, models.condition(PROMPTS), [1, 2, 3])
    # every draft accepted: each block commits its proposal as is (position 0 comes from the prefill)
    run = _last_bound_run(decoder)
    n, frontier = 64, 1
    for proposal in run.proposals:
        width = min(proposal.shape[1], n - frontier)
        assert torch.equal(out.tokens[:, frontier:frontier + width], proposal[:, :width])
        frontier += width
    assert frontier == n
    assert all(s.accepted == n - 1 and s.extra["resample_forwards"] == 0 for s in out.stats)
    assert all(s.target_forwards == 1 + len(run.proposals) for s in out.stats)


def _last_bound_run(decoder: SpeculativeDecoder):  # type: ignore[no-untyped-def]
    return _last_run.value


class _last_run:  # holder set by the bind patch below
    value = None


@pytest.fixture(autouse=True)
def _remember_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    original = _Frontier.start

    def start(self, ctx, canvas):  # type: ignore[no-untyped-def]
        _last_run.value = original(self, ctx, canvas)
        return _last_run.value

    monkeypatch.setattr(_Frontier, "start", start)


def test_tau_zero_greedy_nearest_is_the_drafters_raster_image_upsampled(bundle: ModelBundle) -> None:
    """Multi-cycle drafting with nearest up/down (down(up(y)) = y): the committed image is the
    drafter's own greedy raster image, replicated 2 x 2."""
    models = guided(bundle, GREEDY)
    cond = models.condition(PROMPTS)
    out = _mulo(GREEDY, PooledThresholdRule(k=1, tau=0.0), rows=1, draft_schedule="serial").generate(
        models, cond, [1, 2, 3])
    low = guided(ModelBundle(name="d", target=bundle.drafter, conditioner=bundle.conditioner), GREEDY)
    drafted = RasterDecoder(GREEDY).generate(low, cond, [1, 2, 3]).tokens.view(3, 4, 4)
    up = drafted.repeat_interleave(2, 1).repeat_interleave(2, 2).flatten(1)
    assert torch.equal(out.tokens[:, 1:], up[:, 1:])


# ----------------------------------------------------------------------------- reject everything
@pytest.mark.parametrize("rows", [None, 1])
@pytest.mark.parametrize("context,kv", [("visible", "refresh"), ("masked", "stale")])
def test_rejecting_everything_with_serial_resampling_is_raster_greedy(
        bundle: ModelBundle, rows: int | None, context: str, kv: str) -> None:
    models = guided(bundle, GREEDY)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(GREEDY).generate(models, cond, [1, 2, 3])
    decoder = _mulo(GREEDY, RejectAll(), PixelUpsampler(), rows=rows, schedule="serial", context=context, kv=kv)
    out = decoder.generate(models, cond, [4, 5, 6])
    assert torch.equal(out.tokens, raster.tokens)
    assert all(s.target_forwards == 64 and s.accepted == 0 for s in out.stats), "one forward per token"


def test_rejecting_everything_with_parallel_zipar_islands_is_not_raster(bundle: ModelBundle) -> None:
    """The negative control: ZipAR order inside the (single, whole-block) island changes the
    conditioning, so the test above can see a resampler that does not decode in raster order."""
    models = guided(bundle, GREEDY)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(GREEDY).generate(models, cond, [1, 2, 3])
    out = _mulo(GREEDY, RejectAll(), rows=None, schedule="parallel", window=1).generate(models, cond, [1, 2, 3])
    assert not torch.equal(out.tokens, raster.tokens)
    assert all(s.target_forwards < 64 for s in out.stats)


# ----------------------------------------------------------------------------- local scope
def _brute_force(accept: torch.Tensor, start: int, cols: int, radius: int) -> tuple[set, int]:
    """R_X and t0 by the paper's definition, for one row."""
    rejected = [o for o in range(accept.shape[0]) if not accept[o]]
    if not rejected:
        return set(), accept.shape[0]
    t0 = rejected[0]
    out = set()
    for t in rejected:
        rt, ct = divmod(start + t, cols)
        for u in range(t0, accept.shape[0]):
            ru, cu = divmod(start + u, cols)
            if abs(ru - rt) <= radius and abs(cu - ct) <= radius:
                out.add(u)
    return out, t0


@pytest.mark.parametrize("radius", [0, 1, 2, 3])
def test_local_scope_matches_its_definition(radius: int) -> None:
    g = torch.Generator().manual_seed(radius)
    grid, length = (8, 8), 20
    start = torch.tensor([1, 9, 20, 50])  # the last block runs past the end (14 valid)
    accept = torch.rand(4, length, generator=g) > 0.1
    accept[1] = True  # nothing rejected
    res = LocalScope(radius).bind(length).resolve(accept, 64 - start, grid)
    for b in range(4):
        valid = min(length, 64 - int(start[b]))
        expanded, t0 = _brute_force(accept[b, :valid], int(start[b]), 8, radius)
        assert int(res.first[b]) == (t0 if expanded else length)
        got = set(torch.nonzero(res.resample[b]).flatten().tolist()) | ({t0} if t0 < valid else set())
        assert got == expanded
        assert all(o >= t0 for o in got), "never before t0"
        kept = set(torch.nonzero(res.keep[b]).flatten().tolist())
        assert kept == set(range(valid)) - expanded, "every other draft is kept, also after t0"
        assert int(res.advance[b]) == valid
        if radius == 0:
            assert got == {o for o in range(valid) if not accept[b, o]}, "naive local = the rejected set"


def test_local_scope_never_touches_positions_before_the_first_rejection() -> None:
    accept = torch.ones(1, 16, dtype=torch.bool)
    accept[0, 9] = False  # row 1, col 1 of an 8-wide grid with the block starting at 0
    res = LocalScope(3).bind(16).resolve(accept, torch.tensor([64]), (8, 8))
    assert int(res.first[0]) == 9
    assert not res.resample[0, :9].any() and res.keep[0, :9].all()
    assert res.resample[0, 10:13].all() and not res.resample[0, 13:].any()  # cols 2..4 of row 1


# ----------------------------------------------------------------------------- kv: inline
def _redrawn(rejected: set[int], radius: int, cols: int = 8) -> set[int]:
    t0 = min(rejected)
    return {u for t in rejected for u in range(t0, cols * cols)
            if abs(u // cols - t // cols) <= radius and abs(u % cols - t % cols) <= radius}


def _greedy_choices(models: ModelBundle, cond, tokens: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The guided greedy target's argmax at every position given the image's own tokens before it."""
    target = models.target
    target.setup_cache(tokens.shape[0])
    first = target.prefill(cond)[:, None]
    rest = target.forward(tokens[:, :-1], torch.arange(tokens.shape[1] - 1))
    return torch.cat([first, rest], 1).argmax(-1)


@pytest.mark.parametrize("radius", [0, 1])
def test_inline_kv_redraws_every_token_from_the_final_image_before_it(bundle: ModelBundle, radius: int) -> None:
    """kv=inline with serial resampling decodes like raster with the kept drafts forced: each
    redrawn token is the greedy target's choice given the finished image before it. With
    kv=refresh the resampler reads kept drafts' K/V computed next to the rejected drafts."""
    models = guided(bundle, GREEDY)
    cond = models.condition(PROMPTS)
    redrawn = sorted(_redrawn({9, 20, 35, 50}, radius))
    agree, forwards = {}, {}
    for kv in ("inline", "refresh"):
        decoder = _mulo(GREEDY, RejectAt({9, 20, 35, 50}), rows=None, radius=radius, schedule="serial", kv=kv)
        out = decoder.generate(models, cond, [1, 2, 3])
        choices = _greedy_choices(models, cond, out.tokens)
        agree[kv] = bool((choices[:, redrawn] == out.tokens[:, redrawn]).all())
        forwards[kv] = [s.target_forwards for s in out.stats]
    assert agree["inline"]
    # negative control: with single redrawn tokens (radius 0) the stale K/V flip no greedy choice of
    # this model; with radius 1 they do
    assert agree["refresh"] == (radius == 0)
    assert forwards["inline"] == forwards["refresh"], "re-feeding kept drafts widens forwards, adds none"


# ----------------------------------------------------------------------------- rounds
def _rounds_decoder(params: SamplingParams, rule, rounds: int, schedule: str, radius: int = 1) -> SpeculativeDecoder:
    return SpeculativeDecoder(params, LowResDraft(PixelUpsampler(), rows=None, schedule="zipar", window=2), rule,
                              LocalScope(radius, rounds=rounds), IslandResampler(schedule, window=2, context="masked"))


@pytest.mark.parametrize("schedule", ["serial", "parallel"])
def test_verifying_until_nothing_is_rejected_gives_raster_greedy(bundle: ModelBundle, schedule: str) -> None:
    """With a rule that accepts exactly the greedy target's choices (k = 1, tau = 1 on one-hot p)
    and rounds that never run out, every committed token is the target's choice given the final
    image before it, whatever the resampling order: the output is raster greedy. One round (the
    paper) keeps drafts judged next to tokens that were redrawn, and island-parallel redrawing
    decodes out of raster order, so it is not."""
    models = guided(bundle, GREEDY)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(GREEDY).generate(models, cond, [1, 2, 3])
    out = _rounds_decoder(GREEDY, PooledThresholdRule(k=1, tau=1.0), 64, schedule).generate(models, cond, [4, 5, 6])
    assert torch.equal(out.tokens, raster.tokens)
    assert all(s.extra["verify_forwards"] > 1 for s in out.stats), "the test needs a second verification"
    if schedule == "parallel":
        once = _rounds_decoder(GREEDY, PooledThresholdRule(k=1, tau=1.0), 1, schedule).generate(models, cond, [4, 5, 6])
        assert not torch.equal(once.tokens, raster.tokens)
        assert all(s.extra["verify_forwards"] == 1 for s in once.stats)


@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_rounds_bound_the_verifications_of_a_drafted_image(bundle: ModelBundle, rounds: int) -> None:
    models = guided(bundle, SAMPLED)
    cond = models.condition(PROMPTS)
    out = _rounds_decoder(SAMPLED, RejectAll(), rounds, "parallel").generate(models, cond, [1, 2, 3])
    once = _rounds_decoder(SAMPLED, RejectAll(), 1, "parallel").generate(models, cond, [1, 2, 3])
    # rejecting everything: every round but the last commits only t0 and redraws the rest
    assert all(s.extra["verify_forwards"] == rounds for s in out.stats)
    assert [s.drafter_forwards for s in out.stats] == [s.drafter_forwards for s in once.stats], "one draft per image"
    assert out.tokens.shape == (3, 64)


def test_rounds_refuse_a_draft_that_does_not_cover_the_image(bundle: ModelBundle) -> None:
    models = guided(bundle, SAMPLED)
    decoder = SpeculativeDecoder(SAMPLED, LowResDraft(NearestUpsampler(), rows=1), PooledThresholdRule(k=4, tau=0.1),
                                 LocalScope(3, rounds=2), IslandResampler())
    with pytest.raises(ValueError, match="draft.rows=null"):
        decoder.generate(models, models.condition(PROMPTS), [1, 2, 3])
    with pytest.raises(ValueError, match="scope.rounds"):
        LocalScope(3, rounds=0)


# ----------------------------------------------------------------------------- anchor
def test_anchored_keeps_the_mass_of_the_neighbourhood_or_falls_back_to_p() -> None:
    from baselines.methods.pooled import anchored

    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.0, 0.0]])
    table = torch.tensor([[1], [0], [3], [2]])  # each code's one nearest neighbour
    got = anchored(p, torch.tensor([0, 2]), table)
    assert torch.equal(got[0], torch.tensor([0.1, 0.2, 0.0, 0.0]))
    assert torch.equal(got[1], p[1]), "no mass on {2, 3}: p itself"
    assert torch.equal(anchored(p, torch.tensor([3, 1]), None), torch.tensor([[0, 0, 0, 0.4], [0, 0.5, 0, 0]]))


def test_anchor_one_redraws_every_draft_as_itself_when_p_covers_the_codebook(bundle: ModelBundle) -> None:
    """Rejecting everything, an anchor of 1 redraws each position from p on the token there alone:
    with full-support p (no top-k / top-p) the output is the up-sampled draft (the tau = 0 image)."""
    full = SamplingParams(temperature=1.0, cfg_scale=2.0)
    models = guided(bundle, full)
    cond = models.condition(PROMPTS)
    draft = _mulo(full, PooledThresholdRule(k=4, tau=0.0)).generate(models, cond, [1, 2, 3])
    redrawn = SpeculativeDecoder(full, LowResDraft(NearestUpsampler(), rows=None, schedule="zipar", window=2),
                                 PooledThresholdRule(k=4, tau=1.0, anchor=1), LocalScope(3),
                                 IslandResampler("parallel", window=2, context="visible", anchor=1))
    out = redrawn.generate(models, cond, [1, 2, 3])
    assert all(s.resampled > 32 for s in out.stats), "the test needs redrawn positions"
    assert torch.equal(out.tokens[:, 1:], draft.tokens[:, 1:])
    free = SpeculativeDecoder(full, LowResDraft(NearestUpsampler(), rows=None, schedule="zipar", window=2),
                              PooledThresholdRule(k=4, tau=1.0), LocalScope(3), IslandResampler("parallel", window=2))
    assert not torch.equal(free.generate(models, cond, [1, 2, 3]).tokens, draft.tokens), "negative control"
    with pytest.raises(ValueError, match="accept.anchor"):
        PooledThresholdRule(anchor=-1)
    with pytest.raises(ValueError, match="resampler.anchor"):
        IslandResampler(anchor=0.5)


# ----------------------------------------------------------------------------- islands
def test_island_labels_match_scipy() -> None:
    g = torch.Generator().manual_seed(0)
    members = torch.rand(3, 64, generator=g) > 0.6
    labels = block_islands(members, torch.zeros(3, dtype=torch.long), (8, 8))
    for b in range(3):
        ref, count = ndimage.label(members[b].view(8, 8).numpy(), structure=[[1, 1, 1]] * 3)
        ours = labels[b].view(8, 8)
        assert len(set(ours[members[b].view(8, 8)].tolist())) == count
        for i in range(64):
            for j in range(64):
                if members[b, i] and members[b, j]:
                    assert (ref.flat[i] == ref.flat[j]) == bool(labels[b, i] == labels[b, j])


def test_island_schedule_advances_islands_together_zipar_style() -> None:
    resample = torch.zeros(1, 32, dtype=torch.bool)
    for o in (0, 1, 2, 8, 9, 10, 16, 17, 18, 6, 7, 14, 15):  # a 3 x 3 island and a 2 x 2 island
        resample[0, o] = True
    first = torch.tensor([0])
    resample[0, 0] = False  # t0 is drawn by the verification
    steps, labels = island_steps(resample, first, torch.zeros(1, dtype=torch.long), (4, 8), window=1)
    assert len(set(labels[0][labels[0] >= 0].tolist())) == 2
    # island A: row 0: (1, 2) -> steps 0, 1; row 1 starts at 1: 8, 9, 10 -> 1, 2, 3; row 2: 2, 3, 4
    # island B: row 0: 6, 7 -> 0, 1; row 1: 14, 15 -> 1, 2
    expect = {1: 0, 2: 1, 8: 1, 9: 2, 10: 3, 16: 2, 17: 3, 18: 4, 6: 0, 7: 1, 14: 1, 15: 2}
    assert {o: int(steps[0, o]) for o in expect} == expect


def test_parallel_resampling_of_one_island_equals_serial(bundle: ModelBundle) -> None:
    """One island per block (a 2 x 2 rejection, radius 1), decoded inside the island in raster
    order (window >= cols): the parallel path (island schedule, per-row inputs) must give the
    serial result, token for token, with the same number of forwards."""
    models = guided(bundle, GREEDY)
    cond = models.condition(PROMPTS)
    rule = RejectAt({19, 20, 27, 28})  # rows 2-3, cols 3-4 of the 8 x 8 target
    outs = {}
    for schedule in ("serial", "parallel"):
        for context in ("visible", "masked"):
            dec = _mulo(GREEDY, rule, rows=None, radius=1, schedule=schedule, window=8, context=context)
            outs[schedule, context] = dec.generate(models, cond, [1, 2, 3])
    base = outs["serial", "visible"]
    assert all(s.extra["islands"] == 1 and s.extra["resample_set"] == 11 for s in base.stats), \
        "rows 2-4, cols 2-5, at or after t0 = 19"
    for key, out in outs.items():
        assert torch.equal(out.tokens, base.tokens), key
        assert [s.target_forwards for s in out.stats] == [s.target_forwards for s in base.stats], key
    two = _mulo(GREEDY, RejectAt({9, 14}), rows=None, radius=0, schedule="parallel", window=8)
    stats = two.generate(models, cond, [1, 2, 3]).stats
    assert all(s.extra["islands"] == 2 and s.extra["resample_forwards"] == 1 for s in stats), \
        "two islands advance in the same forward"


# ----------------------------------------------------------------------------- rule, batch, stats
def test_pooled_mass_sums_the_neighbourhood() -> None:
    p = torch.tensor([[[0.1, 0.2, 0.3, 0.4]]])
    table = torch.tensor([[1, 2], [0, 2], [3, 1], [2, 1]])  # 2 nearest other codes per code
    assert torch.allclose(pooled_mass(p, torch.tensor([[2]]), table[:, :1]), torch.tensor([[0.7]]))
    assert torch.allclose(pooled_mass(p, torch.tensor([[2]]), table), torch.tensor([[0.9]]))
    assert torch.allclose(pooled_mass(p, torch.tensor([[2]]), None), torch.tensor([[0.3]]))
    with pytest.raises(ValueError, match="tau"):
        PooledThresholdRule(k=4, tau=1.5)


class _Table:
    """The neighbour table a decode Context would hand the rule (code c's nearest others)."""

    table = torch.tensor([[1, 2], [0, 2], [3, 1], [2, 1]])

    def neighbours(self, k: int) -> torch.Tensor:
        return self.table[:, :k]


def test_confident_rejects_drafts_where_the_target_is_sure_of_a_code_outside_the_neighbourhood() -> None:
    # draft 2 (neighbourhood {2, 3} at k = 2); p sure of 0 (outside), of 3 (inside), and unsure
    p = torch.tensor([[[0.8, 0.1, 0.05, 0.05], [0.05, 0.05, 0.1, 0.8], [0.3, 0.3, 0.2, 0.2]]])
    drafts = torch.full((1, 3), 2)
    u = torch.zeros(1, 3)
    paper = PooledThresholdRule(k=2, tau=0.0).decide(p, None, drafts, u, _Table())
    strict = PooledThresholdRule(k=2, tau=0.0, confident=0.5).decide(p, None, drafts, u, _Table())
    assert paper.accept.tolist() == [[True, True, True]]
    assert strict.accept.tolist() == [[False, True, True]]
    looser = PooledThresholdRule(k=2, tau=0.0, confident=0.9).decide(p, None, drafts, u, _Table())
    assert looser.accept.all()
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="accept.confident"):
            PooledThresholdRule(confident=bad)


class _Grid(_Table):
    """_Table on a 4x2 image: a decode block of 8 entries is positions 1 .. 8, entry 7 past the end."""

    grid = (4, 2)
    n_tokens = 8


def test_below_accepts_a_rejected_draft_again_where_the_accepted_draft_below_continues_it() -> None:
    # k = 2: B(2) = {2, 3}, B(0) = {0, 1}; rows of width 2 in the block: entry j is above entry j + 2
    drafts = torch.tensor([[2, 0, 2, 2, 2, 2, 2, 2]])
    no, off, yes = [0.9, 0.1, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.5, 0.5]
    p = torch.tensor([[no, off, no, yes, yes, no, yes, yes]])
    u = torch.zeros(1, 8)

    def accept(below: int) -> list[bool]:
        rule = PooledThresholdRule(k=2, tau=0.5, below=below)
        return rule.decide(p, None, drafts, u, _Grid()).accept[0].tolist()

    F, T = False, True
    assert accept(0) == [F, F, F, T, T, F, T, T]
    # entry 2: entry 4 below is accepted and the same code; entry 1: code 2 below is outside B(0);
    # entry 5: the only entry below it (7) lies past the image's end
    assert accept(1) == [F, F, T, T, T, F, T, T]
    assert accept(2) == [T, F, T, T, T, F, T, T], "entry 0 through entry 2, rescued in the first pass"
    for bad in (-1, 0.5):
        with pytest.raises(ValueError, match="accept.below"):
            PooledThresholdRule(below=bad)


def test_below_needs_the_whole_image_verified_once(bundle: ModelBundle) -> None:
    models = guided(bundle, SAMPLED)
    rule = PooledThresholdRule(k=4, tau=0.1, below=1)
    with pytest.raises(ValueError, match="accept.below = 1 .*draft.rows=null"):
        _mulo(SAMPLED, rule, rows=1).generate(models, models.condition(PROMPTS), [1, 2, 3])
    # same drafts, same verification p: each pass only turns rejections into acceptances, so every
    # image keeps at least as many drafts as with fewer passes (and these drafts have rescues)
    kept = {below: [s.accepted for s in _mulo(SAMPLED, PooledThresholdRule(k=4, tau=0.1, below=below))
                    .generate(models, models.condition(PROMPTS), [1, 2, 3]).stats] for below in (0, 1, 4)}
    assert all(a <= b <= c for a, b, c in zip(kept[0], kept[1], kept[4])), kept
    assert sum(kept[1]) > sum(kept[0]), kept


@pytest.mark.parametrize("variant", ["default", "visible-stale-serial-rows1"])
def test_batch_size_does_not_change_mulo_images(bundle: ModelBundle, variant: str) -> None:
    overrides = ["decoder=[mulo_sd]", "model=random", "sampling.temperature=1.0", "sampling.top_k=20",
                 "sampling.cfg_scale=2.0", "decoder.mulo_sd.accept.tau=0.05", "decoder.mulo_sd.accept.k=4"]
    if variant != "default":
        overrides += ["decoder.mulo_sd.resampler.context=visible", "decoder.mulo_sd.resampler.kv=stale",
                      "decoder.mulo_sd.draft.schedule=serial", "decoder.mulo_sd.draft.rows=1"]
    decoder = _build(compose_cfg(overrides).decoder.mulo_sd)
    models = guided(bundle, decoder.sampling)
    specs = plan(shapes(3), images_per_prompt=2, global_seed=5)
    results = {}
    for size in (1, 3):
        rows = {}
        for i in range(0, len(specs), size):
            chunk = specs[i : i + size]
            gen = decoder.generate(models, models.condition([s.prompt.text for s in chunk]), [s.seed for s in chunk])
            for spec, tokens, stats in zip(chunk, gen.tokens, gen.stats):
                rows[spec.sample_id] = (tokens, stats.as_row())
        results[size] = rows
    for sid, (tokens, stats) in results[1].items():
        assert torch.equal(tokens, results[3][sid][0]), sid
        assert stats == results[3][sid][1], sid
    counts = {row["target_forwards"] for _, row in results[1].values()}
    assert len(counts) > 1, "images took different numbers of forwards"


def test_mulo_stats_split_forwards_by_role(bundle: ModelBundle) -> None:
    models = guided(bundle, SAMPLED)
    dec = _mulo(SAMPLED, PooledThresholdRule(k=4, tau=0.05), rows=1, radius=1)
    for s in dec.generate(models, models.condition(PROMPTS), [1, 2, 3]).stats:
        extra = s.extra
        assert s.target_forwards == 1 + extra["verify_forwards"] + extra["resample_forwards"]
        assert len(s.accepted_per_step) == 1 + extra["verify_forwards"]
        assert sum(s.accepted_per_step) == s.tokens == 64
        assert s.accepted + s.resampled + 1 == 64, "every drafted position is kept or resampled"
        assert s.resampled == extra["resample_set"] >= s.rejection_map.sum() > 0
        assert extra["islands"] >= 1 and extra["island_size_max"] >= 1
        assert s.drafter_forwards > 0


@pytest.mark.parametrize("rows", [None, 1])
def test_verification_feeds_no_input_past_the_image(bundle: ModelBundle, rows: int | None) -> None:
    """A whole-image block (L = N, refeed = L) is verified by one forward of at most N inputs, not
    refeed + L = 2N; the images are those of an uncut verification (checked against a decoder
    whose verification width is refeed + L)."""
    models = guided(bundle, SAMPLED)
    widths: list[int] = []
    forward = models.target.forward

    def spy(tokens, positions, mask=None, **out):  # type: ignore[no-untyped-def]
        widths.append(tokens.shape[1])
        return forward(tokens, positions, mask, **out)

    decoder = _mulo(SAMPLED, PooledThresholdRule(k=4, tau=0.05), rows=rows)
    models.target.forward = spy  # type: ignore[method-assign]
    try:
        out = decoder.generate(models, models.condition(PROMPTS), [1, 2, 3])
    finally:
        del models.target.forward
    assert max(widths) <= 64
    if rows is None:
        assert widths[0] == 64, "the first verification feeds positions 0 .. 63"
    uncut = _mulo(SAMPLED, PooledThresholdRule(k=4, tau=0.05), rows=rows)
    uncut._verify = _fixed_width_verify.__get__(uncut)  # type: ignore[method-assign]
    assert torch.equal(uncut.generate(models, models.condition(PROMPTS), [1, 2, 3]).tokens, out.tokens)


def _fixed_width_verify(self, ctx, canvas, draft, refeed):  # type: ignore[no-untyped-def]
    """The verification with the fixed width refeed + L (inputs past the image included)."""
    length = draft.tokens.shape[1]
    tokens, positions = canvas.read(canvas.fed, refeed + length)
    logits = ctx.models.target.forward(tokens, positions)
    offset = (canvas.frontier - 1 - canvas.fed).clamp_min(0)
    index = (offset[:, None] + torch.arange(length + 1)).clamp(max=logits.shape[1] - 1)
    return probs(logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1])), ctx.sampling)


def test_bad_options_name_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="nearest"):
        build_upsampler(kind="bilinear")
    with pytest.raises(ValueError, match="parallel"):
        IslandResampler(schedule="islands")
    with pytest.raises(ValueError, match="masked"):
        IslandResampler(context="hidden")
    with pytest.raises(ValueError, match="zipar"):
        LowResDraft(NearestUpsampler(), schedule="rows")
    with pytest.raises(ValueError, match="train_upsampler"):
        build_upsampler(kind="learned", weights="/nonexistent/up.safetensors")
    with pytest.raises(ValueError, match="drafter"):
        no_drafter = build(grid=4, vocab=16, dim=16)
        no_drafter.drafter = None
        _mulo(GREEDY, RejectAll()).generate(no_drafter, no_drafter.condition(["a"]), [0])


# ----------------------------------------------------------------------------- experiments
MULO_EXPERIMENTS = ["main", "ablation_upsampling", "ablation_pooling", "ablation_local", "ablation_parallel",
                    "ablation_open_questions", "tau_sweep"]
TINY = ["model=random", "model.grid=4", "model.dim=16", "model.vocab=16", "model.n_layer=1",
        "evaluator=[speed]", "dataset_limit=1", "batch_size=1", "warmup_batches=0", "threads=1"]


@pytest.mark.parametrize("name", MULO_EXPERIMENTS)
def test_mulo_experiments_compose_and_run_tiny(name: str, tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    overrides = [f"+experiment={name}", *TINY]
    cfg = compose_cfg(overrides)
    sweep = OmegaConf.select(cfg, "hydra.sweeper.params") if "hydra" in cfg else None
    swept = dict((OmegaConf.load(CONF / "experiment" / f"{name}.yaml").get("hydra") or {})
                 .get("sweeper", {}).get("params", {}))
    if swept:  # a sweep: MULTIRUN by itself, and its first point runs
        assert OmegaConf.load(CONF / "experiment" / f"{name}.yaml").hydra.mode == "MULTIRUN"
        assert sorted(cfg.swept_keys) == sorted(swept)
        point = [f"{k}={str(v).split(',')[0]}" for k, v in swept.items()]
        cfg = compose_cfg(overrides + point)
    del sweep
    for key in list(cfg.decoder):
        up = cfg.decoder[key].get("draft", {}).get("upsampler")
        if up is not None and up.kind == "learned":
            up.weights = None  # the shipped weights are trained for the shapes codebook
    summary = run(cfg, tmp_path)
    decoders = set(summary.decoder)
    assert decoders == set(cfg.decoder), decoders
    assert (summary.metric == "target_forwards").any()


# ----------------------------------------------------------------------------- no masked-out work
class _Calls:
    """Counts the calls of the target's and the drafter's prefill and forward and of their
    tokenizer's decode and encode (wrappers on the unguided models of a bundle)."""

    def __init__(self, bundle: ModelBundle, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        for role in ("target", "drafter"):
            model = getattr(bundle, role)
            for method in ("prefill", "forward", "decode", "encode"):
                monkeypatch.setattr(model, method, self._spy(f"{role}.{method}", getattr(model, method)))

    def _spy(self, key: str, method):  # type: ignore[no-untyped-def]
        def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls[key] = self.calls.get(key, 0) + 1
            return method(*args, **kwargs)
        return spy

    def take(self) -> dict[str, int]:
        calls, self.calls = self.calls, {}
        return calls


@pytest.mark.parametrize("rows", [None, 1])
@pytest.mark.parametrize("path", ["cpu", "accelerator"])
def test_mulo_runs_exactly_the_counted_forwards_and_tokenizer_calls(rows: int | None, path: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The paper's MuLo-SD (pixel up-sampler), one image per call, on both host paths (the
    accelerator path: hostsync.reads_are_free answers False, so the loop's check is read one step
    late and optional work is asked of `anything`): the target and drafter forwards made are the
    ones its statistics count, and the tokenizer is called once per up-sampling (drafter decode,
    target encode) and once per down-sampling (target decode, drafter encode) of a proposal after
    the first. Before this was so, the accelerator path of this test made, per image, with rows
    null: 1 more target forward (a second full-width verification after the loop's last step),
    1 more drafter forward (the first proposal's masked re-feed) and 1 more target decode and
    drafter encode (its masked down-sampling of the whole canvas); with rows 1: 1 more target
    forward, 7 more drafter forwards, 1 more up-sampling and 2 more down-samplings (the first
    proposal's masked re-feed and down-sampling, and a whole proposal and verification after the
    last row had finished)."""
    if path == "accelerator":
        monkeypatch.setattr(hostsync, "reads_are_free", lambda device: False)
    bundle = build(grid=8, vocab=32, dim=32)
    overrides = ["decoder=[mulo_sd]", "model=random", "sampling.temperature=1.0", "sampling.top_k=20",
                 "sampling.cfg_scale=2.0", "decoder.mulo_sd.accept.tau=0.1", "decoder.mulo_sd.accept.k=4",
                 f"decoder.mulo_sd.draft.rows={'null' if rows is None else rows}"]
    decoder = _build(compose_cfg(overrides).decoder.mulo_sd)
    assert decoder.draft.upsampler.name == "pixel"
    models = guided(bundle, decoder.sampling)
    counter = _Calls(bundle, monkeypatch)
    resampled = 0
    for seed, prompt in enumerate(PROMPTS):
        cond = models.condition([prompt])
        counter.take()
        (s,) = decoder.generate(models, cond, [seed]).stats
        verifications, resample = int(s.extra["verify_forwards"]), int(s.extra["resample_forwards"])
        resampled += resample
        assert verifications == (1 if rows is None else 4)  # one per drafted block: 8 / (2 * rows) rows
        assert counter.take() == {
            "target.prefill": 1, "target.forward": verifications + resample,  # = target_forwards - 1
            "drafter.prefill": 1, "drafter.forward": s.drafter_forwards - 1,
            "drafter.decode": verifications, "target.encode": verifications,  # up-sampling per proposal
            **({"target.decode": verifications - 1, "drafter.encode": verifications - 1} if rows else {}),
        }, (seed, s.as_row())
        assert s.target_forwards == 1 + verifications + resample
    assert resampled > 0, "the test needs resampling forwards"
