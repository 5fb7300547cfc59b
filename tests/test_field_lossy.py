"""The lossy field decoders `gsd` (GSD's grouped acceptance on SJD) and `lantern_pp` (LANTERN++: a
static EAGLE-head tree, relative lambda acceptance): their distance from raster's distribution by
Monte Carlo on a 2x2 grid of 3 codes (the enumerated target, as tests/test_speculative.py), the
settings that reduce them to exact decoders, per-image seeds at batch 1 vs 4, the timing path, and
bad options refused by name.

Recorded distances (3000 images, seeds 0..2999, temperature 1, cfg 1.5, the 2x2 / 3-code bundle
whose 3 codes' embeddings all lie within 0.5 of each other, so GSD's embedding test passes every
pair; sampling noise alone stays under 0.061): SJD 0.033, gsd 0.086 (window 3), lantern_pp
(lambda 5, k 10 -> 2) 0.155, lantern_pp at lambda 1 0.030. The bands below are those values
+- 0.02 (float differences between machines move a few draws)."""
from __future__ import annotations

import pytest
import torch

from baselines.framework.acceptance import ExactRule, LanternRule
from baselines.framework.drafts import JacobiDraft
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.grouped import GroupedRule
from baselines.methods.lantern_pp import RelativeLanternRule
from baselines.methods.raster import RasterDecoder
from baselines.methods.static_tree import TREES, StaticTree, StaticTreeDraft
from baselines.methods.tree_decoding import TreeDecoder
from harness.api import ConfigValueError, ModelBundle, SamplingParams
from harness.datasets.prompts import shapes
from harness.models.random.bundle import build
from harness.run import _build, guided
from harness.store.samples import plan
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)
from tests.test_speculative import _enumerated_target, _noise_bound, _tiny_bundle, _tvd

PROMPTS = ["a red circle", "a blue square", "two green triangles above a circle", "a yellow star"]
SAMPLED = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, cfg_scale=2.0)
MONTE_CARLO = SamplingParams(temperature=1.0, cfg_scale=1.5)
SAMPLES = 3000
SMALL_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]  # 3 levels: fits the 2x2 grid


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return build(grid=4, vocab=32, dim=32)


@pytest.fixture(scope="module")
def target() -> tuple[ModelBundle, dict[tuple, float], float]:
    """The tiny guided bundle, its enumerated target distribution and the sampling-noise bound."""
    models = guided(_tiny_bundle(), MONTE_CARLO)
    exact = _enumerated_target(models, PROMPTS[0], MONTE_CARLO)
    return models, exact, _noise_bound(exact, SAMPLES)


def _distance(decoder, target) -> tuple[float, float]:  # noqa: ANN001
    models, exact, bound = target
    return _tvd(decoder, models, exact, PROMPTS[0], SAMPLES), bound


# ----------------------------------------------------------------------------- gsd
def test_gsd_exact_distance_from_raster(target) -> None:  # noqa: ANN001
    """GSD at its defaults is measurably lossy, within its recorded band; SJD on the same draws is
    within sampling noise."""
    sjd, bound = _distance(SpeculativeDecoder(MONTE_CARLO, JacobiDraft(window=3), ExactRule()), target)
    gsd, _ = _distance(SpeculativeDecoder(MONTE_CARLO, JacobiDraft(window=3), GroupedRule()), target)
    assert sjd < bound, f"SJD: TVD {sjd:.4f} >= noise bound {bound:.4f}"
    assert gsd > bound, f"GSD's groups should show: TVD {gsd:.4f} <= noise bound {bound:.4f}"
    assert 0.066 <= gsd <= 0.106, f"GSD's TVD to raster {gsd:.4f} left its recorded band (0.086 +- 0.02)"


@pytest.mark.parametrize("change", [{"rank_window": 0}, {"p_threshold": 0.0}, {"embed_threshold": 0.0}])
def test_gsd_exact_when_the_group_is_the_draft_alone(bundle: ModelBundle, change: dict) -> None:
    """A group of {d} only is SJD, token for token and count for count; the defaults accept more."""
    models = guided(bundle, SAMPLED)
    cond, seeds = models.condition(PROMPTS), [11, 12, 13, 14]
    sjd = SpeculativeDecoder(SAMPLED, JacobiDraft(window=4), ExactRule()).generate(models, cond, seeds)
    single = SpeculativeDecoder(SAMPLED, JacobiDraft(window=4), GroupedRule(**change)).generate(models, cond, seeds)
    assert torch.equal(single.tokens, sjd.tokens)
    assert [s.as_row() for s in single.stats] == [s.as_row() for s in sjd.stats]
    grouped = SpeculativeDecoder(SAMPLED, JacobiDraft(window=4), GroupedRule()).generate(models, cond, seeds)
    assert sum(s.accepted for s in grouped.stats) > sum(s.accepted for s in sjd.stats), "groups relax"


def test_gsd_exact_group_is_the_rank_window_filtered_by_both_thresholds() -> None:
    """GSD's slice order[r - 7 : r + 7]: 7 codes below the draft in p's order, 6 above, each kept if
    close in p and in the embedding; the window is cut at the first code."""
    v = 20
    p = (torch.arange(v, dtype=torch.float32) + 1)[None, None]  # rank of code c is c
    p = p / p.sum()
    emb = torch.zeros(v, 4)
    emb[5, 0] = 1.0  # squared distance 1 from every other code
    rule = GroupedRule(rank_window=7, p_threshold=1.0, embed_threshold=0.5)
    group = rule.group(p, torch.tensor([[10]]), emb)[0, 0]
    assert sorted(group[group >= 0].tolist()) == [3, 4, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16]
    tight = GroupedRule(rank_window=7, p_threshold=float(p[0, 0, 1] - p[0, 0, 0]) * 2.5, embed_threshold=0.5)
    group = tight.group(p, torch.tensor([[10]]), emb)[0, 0]
    assert sorted(group[group >= 0].tolist()) == [8, 9, 11, 12]  # |p(g) - p(d)| < 2.5 steps
    low = rule.group(p, torch.tensor([[2]]), emb)[0, 0]
    assert sorted(low[low >= 0].tolist()) == [0, 1, 3, 4, 6, 7, 8]


# ----------------------------------------------------------------------------- lantern_pp
def test_lantern_pp_exact_distance_from_raster(target) -> None:  # noqa: ANN001
    """LANTERN++ at its defaults (lambda 5, k 10) is measurably lossy, within its recorded band; at
    lambda 1 the static tree's multi-draft verification is lossless."""
    tree = StaticTreeDraft(SMALL_TREE)
    relaxed, bound = _distance(TreeDecoder(MONTE_CARLO, tree, RelativeLanternRule()), target)
    exact, _ = _distance(TreeDecoder(MONTE_CARLO, tree, RelativeLanternRule(lam=1.0)), target)
    assert exact < bound, f"lambda 1: TVD {exact:.4f} >= noise bound {bound:.4f}"
    assert relaxed > bound, f"lambda 5 should show: TVD {relaxed:.4f} <= noise bound {bound:.4f}"
    assert 0.135 <= relaxed <= 0.175, f"LANTERN++'s TVD to raster {relaxed:.4f} left its recorded band (0.155 +- 0.02)"


class _SkipResidual(RelativeLanternRule):
    """A wrong multi-draft rule (a rejected sibling leaves p as it was): the negative control."""

    def drafted_siblings(self, dist, q, xs, valid, u, ctx):  # type: ignore[no-untyped-def,override]
        taken, _ = super().drafted_siblings(dist, q, xs, valid, u, ctx)
        return taken, dist


def test_lantern_pp_exact_check_sees_a_wrong_residual() -> None:
    """With top-k 2 (a filtered code) the Monte Carlo sees a rule that forgets the residual (at the
    plain setting it does not: 0.038 against a bound of 0.061). Trying the children in the head's
    sampled order without q (EAGLE-2's rule) is no negative control: any order drawn independently
    of the acceptance uniforms keeps that rule exact."""
    params = SamplingParams(temperature=1.0, top_k=2, cfg_scale=1.5)
    models = guided(_tiny_bundle(), params)
    exact = _enumerated_target(models, PROMPTS[0], params)
    bound = _noise_bound(exact, SAMPLES)
    tree = StaticTreeDraft(SMALL_TREE)
    right = _tvd(TreeDecoder(params, tree, RelativeLanternRule(lam=1.0)), models, exact, PROMPTS[0], SAMPLES)
    wrong = _tvd(TreeDecoder(params, tree, _SkipResidual(lam=1.0)), models, exact, PROMPTS[0], SAMPLES)
    assert right < bound, f"lambda 1 with top-k 2: TVD {right:.4f} >= noise bound {bound:.4f}"
    assert wrong > 1.5 * bound, f"the test cannot see a biased rule (TVD {wrong:.4f}, bound {bound:.4f})"


@pytest.mark.parametrize("cfg_scale", [1.0, 2.0])
def test_lantern_pp_exact_greedy_at_lambda_one_is_raster(bundle: ModelBundle, cfg_scale: float) -> None:
    """Greedy, lambda 1, LANTERN++'s naive_extend_57 tree: the raster tokens; lambda 5 relaxes the
    argmax and accepts more."""
    params = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    models = guided(bundle, params)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(params).generate(models, cond, [1, 2, 3, 4])
    exact = TreeDecoder(params, StaticTreeDraft(), RelativeLanternRule(k=8, lam=1.0)).generate(models, cond, [5, 6, 7, 8])
    assert torch.equal(exact.tokens, raster.tokens)
    for stats in exact.stats:
        assert sum(stats.accepted_per_step) == stats.tokens == 16
        assert stats.drafter_forwards == 5 * (stats.target_forwards - 1)  # catch-up + 4 fed levels per round
    relaxed = TreeDecoder(params, StaticTreeDraft(), RelativeLanternRule(k=8, lam=5.0)).generate(models, cond, [5, 6, 7, 8])
    assert sum(s.accepted for s in relaxed.stats) > sum(s.accepted for s in exact.stats)


def test_lantern_pp_exact_static_topology_of_naive_extend_57() -> None:
    tree = StaticTree.of("naive_extend_57")
    assert (tree.nodes, tree.levels, tree.top_k) == (57, 5, 5)
    assert [len(tree.level_nodes(d)) for d in range(1, 6)] == [5, 13, 16, 14, 9]
    assert [len(level) for level in tree.parents] == [1, 5, 7, 7, 5] and len(tree.fed) == 24
    for i, path in enumerate(tree.paths):  # parents first, each node's parent is its path's prefix
        parent = tree.parent[i]
        assert parent < i + 1 and (parent == 0 or tree.paths[parent - 1] == path[:-1])
    assert StaticTree.of("mc_sim_7b_63").nodes == len(TREES["mc_sim_7b_63"]) == 25


# ----------------------------------------------------------------------------- both
@pytest.mark.parametrize("name", ["gsd", "lantern_pp"])
def test_field_lossy_exact_batch_size_does_not_change_images(bundle: ModelBundle, name: str) -> None:
    overrides = [f"decoder=[{name}]", "model=random", "sampling.temperature=1.0", "sampling.top_k=20",
                 "sampling.top_p=0.9", "sampling.cfg_scale=2.0"]
    if name == "gsd":
        overrides.append("decoder.gsd.draft.window=4")  # a short window: more steps for rows to diverge
    decoder = _build(compose_cfg(overrides).decoder[name])
    models = guided(bundle, decoder.sampling)
    specs = plan(shapes(4), images_per_prompt=2, global_seed=5)
    results = {}
    for size in (1, 4):
        tokens, rows = {}, {}
        for i in range(0, len(specs), size):
            chunk = specs[i:i + size]
            gen = decoder.generate(models, models.condition([s.prompt.text for s in chunk]), [s.seed for s in chunk])
            for spec, row, stats in zip(chunk, gen.tokens, gen.stats):
                tokens[spec.sample_id], rows[spec.sample_id] = row, stats.as_row()
        results[size] = (tokens, rows)
    for sid in results[1][0]:
        assert torch.equal(results[1][0][sid], results[4][0][sid]), sid
        assert results[1][1][sid] == results[4][1][sid], sid
    steps = {row["target_forwards"] for row in results[1][1].values()}
    assert len(steps) > 1, "rows of a batch took different numbers of steps"


@pytest.mark.parametrize("name", ["gsd", "lantern_pp"])
def test_field_lossy_exact_decoders_go_through_the_timing_path(bundle: ModelBundle, name: str, tmp_path) -> None:
    from evaluators.speed import SpeedEvaluator
    from harness.generate import generate
    from harness.store.samples import SampleSet

    decoder = _build(compose_cfg([f"decoder=[{name}]", "model=random", "sampling.temperature=1.0",
                                  "sampling.top_k=20"]).decoder[name])
    models = guided(bundle, decoder.sampling)
    sample_set = SampleSet(tmp_path / name)
    specs = plan(shapes(4), images_per_prompt=1, global_seed=0)
    generate(decoder, models, sample_set, specs, batch_size=2, warmup_batches=0, device=torch.device("cpu"),
             name=name)
    summary = SpeedEvaluator().evaluate(sample_set).summary.set_index("metric").value
    assert 1 < summary["step_compression"] == pytest.approx(16 / summary["target_forwards"])


# ----------------------------------------------------------------------------- bad options
def test_field_lossy_exact_bad_options_are_refused_by_name(bundle: ModelBundle) -> None:
    for kwargs, key in [({"rank_window": -1}, "accept.rank_window must be >= 0"),
                        ({"rank_window": 2.5}, "accept.rank_window must be an integer"),
                        ({"p_threshold": -0.1}, "accept.p_threshold must be >= 0"),
                        ({"embed_threshold": -1.0}, "accept.embed_threshold must be >= 0")]:
        with pytest.raises(ConfigValueError, match=key):
            GroupedRule(**kwargs)
    with pytest.raises(ConfigValueError, match="accept.lam must be >= 1"):
        RelativeLanternRule(lam=0.5)
    with pytest.raises(ConfigValueError, match="accept.k must be >= 1"):
        RelativeLanternRule(k=0)
    with pytest.raises(ConfigValueError, match=r"draft.tree 'naive_57' is not a known static tree"):
        StaticTreeDraft("naive_57")
    for tree, message in [([], "at least one path"), ([[0], []], "at least one path"), ([[0], [-1]], "ranks >= 0"),
                          ([[0], [2]], "skips rank 1"), ([[0], [0, 0, 0]], "has no parent"),
                          ([[0], [0]], "lists a path twice"), ([[0], ["a"]], "list of rank paths"), (3, "rank paths")]:
        with pytest.raises(ConfigValueError, match=f"draft.tree.*{message}"):
            StaticTreeDraft(tree)  # type: ignore[arg-type]
    params = SamplingParams(temperature=1.0)
    narrow = build(grid=4, vocab=4, dim=32)  # naive_extend_57 gives the root 5 children
    with pytest.raises(ConfigValueError, match=r"draft.tree 'naive_extend_57' gives a node 5 children, more than the 4"):
        TreeDecoder(params, StaticTreeDraft(), RelativeLanternRule()).generate(narrow, narrow.condition(["x"]), [0])
    tiny = build(grid=2, vocab=8, dim=32)  # 5 levels past a 4-token image
    with pytest.raises(ConfigValueError, match=r"draft.tree 'naive_extend_57' is 5 levels deep"):
        TreeDecoder(params, StaticTreeDraft(), RelativeLanternRule()).generate(tiny, tiny.condition(["x"]), [0])
    with pytest.raises(ConfigValueError, match="sampled from the drafter"):  # q = 1 rules would be biased
        TreeDecoder(params, StaticTreeDraft(), LanternRule()).generate(bundle, bundle.condition(["x"]), [0])
    with pytest.raises(ConfigValueError, match="verifies static draft trees"):
        SpeculativeDecoder(params, JacobiDraft(window=3), RelativeLanternRule()).generate(
            bundle, bundle.condition(["x"]), [0])
