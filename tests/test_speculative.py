"""The speculative loop (SJD, draft-model SD, the chain LANTERN `lantern_chain`) on small random
models: greedy exactness, losslessness of `exact` acceptance by Monte Carlo against the enumerated
target distribution, LANTERN's rule at delta = 0, per-image seeds at batch 1 vs 4 (also for the tree
decoders eagle2 and lantern; tests/test_eagle.py has the rest of theirs), and the decode statistics."""
from __future__ import annotations

import itertools

import pytest
import torch

from baselines.framework.acceptance import ExactRule, LanternRule, Verdict, speculative_verdict
from baselines.framework.drafts import JacobiDraft, ModelDraft
from baselines.methods.raster import RasterDecoder
from baselines.framework.speculative import SpeculativeDecoder
from harness.api import ModelBundle, SamplingParams
from harness.datasets.prompts import shapes
from harness.models.random.bundle import build
from harness.run import _build, guided
from harness.store.samples import plan
from harness.runtime.sampling import probs
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

PROMPTS = ["a red circle", "a blue square", "two green triangles above a circle", "a yellow star"]
SAMPLED = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, cfg_scale=2.0)


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return build(grid=4, vocab=32, dim=32)


def _decoders(sampling: SamplingParams) -> dict[str, SpeculativeDecoder]:
    return {
        "sjd-random": SpeculativeDecoder(sampling, JacobiDraft(window=5, init="random"), ExactRule()),
        "sjd-left": SpeculativeDecoder(sampling, JacobiDraft(window=3, init="left"), ExactRule()),
        "sjd-above": SpeculativeDecoder(sampling, JacobiDraft(window=6, init="above"), ExactRule()),
        "sd": SpeculativeDecoder(sampling, ModelDraft(gamma=3), ExactRule()),
    }


def _perfect_drafter(bundle: ModelBundle) -> ModelBundle:
    """The bundle with a small drafter that is a copy of the target (same seed, its own cache)."""
    twin = build(grid=4, vocab=32, dim=32).target
    return ModelBundle(name="twin", target=bundle.target, conditioner=bundle.conditioner, small_drafter=twin)


@pytest.mark.parametrize("name", ["sjd-random", "sjd-left", "sjd-above", "sd", "sd-perfect"])
def test_greedy_exact_decoding_returns_the_raster_tokens(bundle: ModelBundle, name: str) -> None:
    params = SamplingParams(temperature=0.0, cfg_scale=2.0)
    models = guided(_perfect_drafter(bundle) if name == "sd-perfect" else bundle, params)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(params).generate(models, cond, [1, 2, 3, 4])
    out = _decoders(params)[name.removesuffix("-perfect")].generate(models, cond, [5, 6, 7, 8])
    assert torch.equal(out.tokens, raster.tokens)
    forwards = [s.target_forwards for s in out.stats]
    if name == "sd-perfect":  # all accepted: 15 tokens after the prefill in 4 verifications of 3 + 1
        assert forwards == [1 + 4] * 4 and all(s.accepted == 12 for s in out.stats)
    elif name != "sd":
        assert min(forwards) < 16, "some drafts were accepted"


def _enumerated_target(models: ModelBundle, prompt: str, params: SamplingParams) -> dict[tuple, float]:
    """The target's joint distribution over every token sequence of a tiny grid, by teacher forcing."""
    target = models.target
    n, v = target.grid[0] * target.grid[1], target.vocab_size
    seqs = torch.tensor(list(itertools.product(range(v), repeat=n)))
    target.setup_cache(len(seqs))
    first = probs(target.prefill(models.condition([prompt] * len(seqs))), params)  # [K, V]
    rest = probs(target.forward(seqs[:, :-1], torch.arange(n - 1)), params)  # [K, n-1, V]
    dists = torch.cat([first[:, None], rest], 1)
    joint = dists.gather(-1, seqs[..., None]).squeeze(-1).double().prod(-1)
    return {tuple(s): float(pr) for s, pr in zip(seqs.tolist(), joint)}


def _tiny_bundle() -> ModelBundle:
    """2x2 grid, 3 codes; output heads scaled up so p and the drafter's q are peaked and far apart
    (a biased rule then shows)."""
    tiny = build(grid=2, vocab=3, dim=16, n_layer=1, n_head=2, prefix_len=4, seed=1)
    with torch.no_grad():
        for model in (tiny.target, tiny.small_drafter):
            model.gpt.output.weight.mul_(8.0)
    return tiny


class _ResampleFromP(ExactRule):
    """A wrong rule (resamples rejections from p): the negative control of the Monte-Carlo test."""

    def decide(self, p, q, drafts, u, ctx) -> Verdict:  # type: ignore[override]
        return Verdict(accept=speculative_verdict(p, q, drafts, u).accept, residual=p)


def _tvd(decoder, models: ModelBundle, exact: dict[tuple, float], prompt: str, samples: int) -> float:
    """TVD between the decoder's empirical distribution over `samples` images and the exact one."""
    tokens = decoder.generate(models, models.condition([prompt] * samples), list(range(samples))).tokens
    counts: dict[tuple, int] = {}
    for row in map(tuple, tokens.tolist()):
        counts[row] = counts.get(row, 0) + 1
    return 0.5 * sum(abs(counts.get(s, 0) / samples - pr) for s, pr in exact.items())


def _noise_bound(exact: dict[tuple, float], samples: int) -> float:
    """The TVD that sampling noise alone stays under: mean + 6 standard deviations of the TVD of
    `samples` draws from the exact distribution (500 simulated sets, fixed seed)."""
    p = torch.tensor(list(exact.values()), dtype=torch.float64)
    p /= p.sum()
    draws = torch.multinomial(p, samples * 500, replacement=True, generator=torch.Generator().manual_seed(0))
    freq = torch.stack([d.bincount(minlength=len(p)) for d in draws.view(500, samples)]) / samples
    noise = 0.5 * (freq - p).abs().sum(-1)
    return float(noise.mean() + 6 * noise.std())


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=1.0, top_k=2, cfg_scale=1.5)],
                         ids=["plain", "topk-cfg"])
def test_exact_acceptance_preserves_the_target_distribution(params: SamplingParams) -> None:
    models = guided(_tiny_bundle(), params)
    prompt = "a red circle"
    exact = _enumerated_target(models, prompt, params)
    assert abs(sum(exact.values()) - 1) < 1e-5 and max(exact.values()) < 0.5, "a non-trivial target"
    samples = 3000
    bound = _noise_bound(exact, samples)
    drafts = [JacobiDraft(window=3, init=init) for init in ("random", "left", "above")] + [ModelDraft(gamma=2)]
    for draft in drafts:
        tvd = _tvd(SpeculativeDecoder(params, draft, ExactRule()), models, exact, prompt, samples)
        assert tvd < bound, f"{draft.name} ({vars(draft)}): TVD {tvd:.4f} to the target >= {bound:.4f}"
    tvd = _tvd(SpeculativeDecoder(params, ModelDraft(gamma=2), _ResampleFromP()), models, exact, prompt, samples)
    assert tvd > 1.5 * bound, f"the test cannot see a biased rule (TVD {tvd:.4f}, bound {bound:.4f})"


def test_lantern_with_zero_delta_is_exact(bundle: ModelBundle) -> None:
    models = guided(bundle, SAMPLED)
    cond = models.condition(PROMPTS)
    seeds = [11, 12, 13, 14]
    exact = SpeculativeDecoder(SAMPLED, ModelDraft(gamma=3), ExactRule()).generate(models, cond, seeds)

    def lantern(delta: float) -> SpeculativeDecoder:
        return SpeculativeDecoder(SAMPLED, ModelDraft(gamma=3), LanternRule(k=8, delta=delta))

    zero = lantern(0.0).generate(models, cond, seeds)
    assert torch.equal(zero.tokens, exact.tokens)
    assert [s.as_row() for s in zero.stats] == [s.as_row() for s in exact.stats]
    relaxed = lantern(0.5).generate(models, cond, seeds)
    assert sum(s.accepted for s in relaxed.stats) > sum(s.accepted for s in exact.stats), "delta > 0 relaxes"


@pytest.mark.parametrize("name", ["raster", "sjd", "sd", "lantern_chain", "eagle2", "lantern", "zipar",
                                  "zipar_w4"])
def test_batch_size_does_not_change_images(bundle: ModelBundle, name: str) -> None:
    overrides = [f"decoder=[{name}]", "model=random", "sampling.temperature=1.0", "sampling.top_k=20",
                 "sampling.top_p=0.9", "sampling.cfg_scale=2.0"]
    if name == "sjd":
        overrides.append("decoder.sjd.draft.window=4")  # a short window: more steps for rows to diverge
    decoder = _build(compose_cfg(overrides).decoder[name])
    models = guided(bundle, decoder.sampling)
    specs = plan(shapes(4), images_per_prompt=2, global_seed=5)
    results = {}
    for size in (1, 4):
        tokens, forwards = {}, {}
        for i in range(0, len(specs), size):
            chunk = specs[i : i + size]
            cond = models.condition([s.prompt.text for s in chunk])
            gen = decoder.generate(models, cond, [s.seed for s in chunk])
            for spec, row, stats in zip(chunk, gen.tokens, gen.stats):
                tokens[spec.sample_id], forwards[spec.sample_id] = row, stats.as_row()
        results[size] = (tokens, forwards)
    for sid in results[1][0]:
        assert torch.equal(results[1][0][sid], results[4][0][sid]), sid
        assert results[1][1][sid] == results[4][1][sid], sid
    if name in ("sjd", "sd"):
        steps = {row["target_forwards"] for row in results[1][1].values()}
        assert len(steps) > 1, "rows of a batch took different numbers of steps"


@pytest.mark.parametrize("name", ["sjd", "sd"])
def test_decode_stats_are_consistent(bundle: ModelBundle, name: str) -> None:
    decoder = _decoders(SAMPLED)["sjd-random" if name == "sjd" else "sd"]
    models = guided(bundle, SAMPLED)
    gen = decoder.generate(models, models.condition(PROMPTS), [1, 2, 3, 4])
    for s in gen.stats:
        assert sum(s.accepted_per_step) == s.tokens == 16
        assert len(s.accepted_per_step) == s.target_forwards
        assert s.accepted <= s.proposed and s.resampled == int(s.rejection_map.sum())
        assert s.rejection_map.shape == (4, 4) and s.rejection_map[0, 0] == 0, "position 0 is never drafted"
        assert s.accepted + s.resampled + 1 <= s.tokens
        if name == "sd":
            steps = s.target_forwards - 1
            assert s.drafter_forwards == 1 + 3 * steps, "prefill + gamma per verification"
        else:
            assert s.drafter_forwards == 0


def test_model_draft_needs_a_same_resolution_drafter(bundle: ModelBundle) -> None:
    decoder = SpeculativeDecoder(SAMPLED, ModelDraft(gamma=2, model="drafter"), ExactRule())
    with pytest.raises(ValueError, match="lowres"):
        decoder.generate(bundle, bundle.condition(PROMPTS[:1]), [0])
    with pytest.raises(ValueError, match="small_drafter"):
        ModelDraft(gamma=2, model="tiny")
    with pytest.raises(ValueError, match="random"):
        JacobiDraft(window=4, init="zeros")


def test_decode_stats_reach_the_speed_evaluator(bundle: ModelBundle, tmp_path) -> None:
    from evaluators.speed import SpeedEvaluator
    from harness.report.rejections import rejection_heatmap
    from harness.generate import generate
    from harness.store.samples import SampleSet

    decoder = _decoders(SAMPLED)["sd"]
    models = guided(bundle, SAMPLED)
    sample_set = SampleSet(tmp_path / "sd")
    specs = plan(shapes(4), images_per_prompt=1, global_seed=0)
    generate(decoder, models, sample_set, specs, batch_size=2, warmup_batches=0, device=torch.device("cpu"),
             name="sd")
    summary = SpeedEvaluator().evaluate(sample_set).summary.set_index("metric").value
    assert summary["drafter_forwards"] > summary["target_forwards"] > 0
    assert 1 < summary["step_compression"] == pytest.approx(16 / summary["target_forwards"])
    assert 0 < summary["acceptance_rate"] < 1 and summary["accepted_per_step_max"] <= 4
    heat = rejection_heatmap(sample_set)
    assert heat.shape == (4, 4) and heat.sum() == pytest.approx(summary["resampled"])
