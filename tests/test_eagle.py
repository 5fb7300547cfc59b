"""EAGLE heads and draft trees (issue 29): the head's key names and loaders (LANTERN's released
layout on the meta device, this project's files), the tree's structures (rerank, ancestry mask,
children), verification on the static cache (committing a path equals recomputing it), greedy
eagle2 / lantern = raster, Monte-Carlo exactness of eagle2 (and a wrong rule caught), per-image
seeds, bad input, and the shipped shapes heads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from baselines.framework.acceptance import ExactRule, LanternRule
from baselines.framework.draft_tree import Pool, TreeOptions, ancestry, select, tree_attention
from baselines.methods.eagle import EagleDraft
from baselines.methods.raster import RasterDecoder
from baselines.methods.tree_decoding import TreeDecoder
from harness.api import ConfigValueError, ModelBundle, SamplingParams
from harness.models.eagle_head import (
    EagleHead,
    EagleHeadConfig,
    build_head,
    check_compatible,
    load_trained,
    random_head,
    save_head,
)
from harness.models.gpt import GPTConfig
from harness.models.hub import WeightsError, load_strict
from harness.models.llamagen.bundle import gpt_config
from harness.models.random.bundle import build
from harness.moved import MOVED
from harness.run import guided
from tests.official_keys import diff, keys_of, recorded
from tests.single_thread import single_thread  # noqa: F401  (autouse)
from tests.test_speculative import _enumerated_target, _noise_bound, _tiny_bundle, _tvd

PROMPTS = ["a red circle", "a blue square", "two green triangles above a circle"]
# LANTERN @3a56e45 data/configs/llamagen_t2i2_config.json (the released stage-2 head's config.json
# is this base config with num_hidden_layers 1), as the loader reads it
LANTERN_T2I2 = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 1280,
                "caption_dim": 2048, "intermediate_size": 3584, "max_position_embeddings": 2048,
                "model_type": "llama", "num_attention_heads": 20, "num_hidden_layers": 1,
                "num_key_value_heads": 20, "rms_norm_eps": 1e-06, "vocab_size": 16384, "input_type": "t2i2"}


def _tree_decoder(params: SamplingParams, rule=None, **tree) -> TreeDecoder:  # noqa: ANN001
    return TreeDecoder(params, EagleDraft(**{"depth": 3, "top_k": 4, "total_tokens": 14, **tree}),
                       rule or ExactRule())


# ----------------------------------------------------------------------------- the head's files
def test_released_lantern_head_keys_and_shapes_load_strictly() -> None:
    """LANTERN's key names and shapes (the fixture is enumerated from LANTERN's module by hand)
    load strictly into the head built from the released config, and the head fits LlamaGen's
    stage-2 target but not stage 1's grid."""
    official = recorded("lantern_llamagen_drafter.txt")
    with torch.device("meta"):
        head = EagleHead(EagleHeadConfig.from_lantern(LANTERN_T2I2, "config.json"))
        state = {k: torch.empty(shape) for k, shape in official.items()}
        stage2, stage1 = gpt_config(32, {}), gpt_config(16, {})
    assert diff(keys_of(head), official) == ""
    load_strict(head, state, "jadohu/llamagen2_drafter/pytorch_model.bin", "EAGLE head (LANTERN)")
    check_compatible(head.cfg, stage2, "llamagen2_drafter")
    with pytest.raises(WeightsError, match=r"token grid \(32, 32\) vs the target's \(16, 16\)"):
        check_compatible(head.cfg, stage1, "llamagen2_drafter")
    wrong = dict(state)
    wrong["layers.0.input_layernorm.weight"] = torch.empty(1280, device="meta")
    with pytest.raises(WeightsError, match="unexpected keys \\[layers.0.input_layernorm.weight\\]"):
        load_strict(head, wrong, "pytorch_model.bin", "EAGLE head (LANTERN)")


def _small_target(grid: int = 16, prefix: int = 120) -> GPTConfig:
    return GPTConfig(vocab_size=32, grid=(grid, grid), dim=64, n_layer=1, n_head=4, prefix_len=prefix,
                     caption_dim=8, prefix_rope="zero")


def test_lantern_format_files_load_through_the_loader(tmp_path: Path) -> None:
    """A head saved as LANTERN releases it (config.json + pytorch_model.bin) loads strictly."""
    cfg = _small_target()
    head = random_head(cfg, torch.randn(32, 64), seed=3, ffn_dim=96)
    config = {**LANTERN_T2I2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
              "intermediate_size": 96, "vocab_size": 32, "input_type": "t2i"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    torch.save({k: v.half() for k, v in head.state_dict().items()}, tmp_path / "pytorch_model.bin")
    loaded = build_head(cfg, torch.zeros(32, 64), file="pytorch_model.bin", config_file="config.json",
                        local_dir=str(tmp_path))
    for key, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[key], value.half().float())
    with pytest.raises(WeightsError, match=r"vocabulary 32 vs the target's 48"):
        build_head(GPTConfig(**{**vars(cfg), "vocab_size": 48}), torch.zeros(48, 64),
                   file="pytorch_model.bin", config_file="config.json", local_dir=str(tmp_path))


def test_trained_head_files_round_trip_and_refuse_another_target(tmp_path: Path) -> None:
    cfg = _small_target(grid=4, prefix=8)
    head = random_head(cfg, torch.randn(32, 64), seed=1)
    save_head(head, tmp_path / "head.safetensors", {"steps": 3}, dtype=torch.float32)
    loaded = load_trained(tmp_path / "head.safetensors")
    assert loaded.cfg == head.cfg
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in head.state_dict().items())
    cases = {"dim": (r"width 64 vs the target's 128", dict(dim=128, n_head=8)),
             "grid": (r"token grid \(4, 4\) vs the target's \(8, 8\)", dict(grid=(8, 8))),
             "prefix": (r"caption slots 8 vs the target's 9", dict(prefix_len=9)),
             "heads": (r"head width 16 \(4 heads\) vs the target's 32 \(2 heads\)", dict(n_head=2))}
    for _, (message, change) in cases.items():
        other = GPTConfig(**{**vars(cfg), **change})
        with pytest.raises(WeightsError, match=message):
            build_head(other, torch.zeros(32, other.dim), file=str(tmp_path / "head.safetensors"))


# ----------------------------------------------------------------------------- tree structures
def _grown_pool(b: int, depth: int, k: int, seed: int) -> Pool:
    """A pool grown like EAGLE-2's (baselines/methods/eagle.py) from random log-probabilities rounded to
    produce ties."""
    g = torch.Generator().manual_seed(seed)

    def logq(*shape: int) -> torch.Tensor:
        return -(torch.rand(*shape, generator=g) * 3).round(decimals=1)

    ranks = torch.arange(k).expand(b, -1)
    pool = Pool(TreeOptions(depth=depth, top_k=k, total_tokens=2), torch.device("cpu"))
    score = logq(b, k).sort(-1, descending=True).values
    pool.add(torch.randint(50, (b, k), generator=g), torch.full((b, k), -1), score)
    front_pool, front_score = ranks, score
    for i in range(depth):
        child = logq(b, k, k).sort(-1, descending=True).values
        cum = (front_score[:, :, None] + child).flatten(1)
        base = pool.size
        parents = front_pool[:, :, None].expand(-1, -1, k).flatten(1)
        pool.add(torch.randint(50, (b, k * k), generator=g), parents, cum)
        best = torch.topk(cum, k).indices
        front_pool, front_score = base + best, cum.gather(1, best)
    return pool


@pytest.mark.parametrize("seed", range(4))
def test_reranked_tree_is_a_tree_and_its_mask_is_the_ancestry_relation(seed: int) -> None:
    b, depth, k, nodes = 3, 3, 3, 17
    pool = _grown_pool(b, depth, k, seed)
    tree = select(pool, nodes, k)
    assert (tree.parent < torch.arange(1, nodes + 1)).all(), "parents come before their children"
    for row in range(b):
        parent = [0] + tree.parent[row].tolist()
        depth_of = [0] + tree.depth[row].tolist()
        for i in range(1, nodes + 1):
            assert depth_of[i] == depth_of[parent[i]] + 1
            chain, j = {i, 0}, i
            while j:
                j = parent[j]
                chain.add(j)
            explicit = torch.tensor([j in chain for j in range(nodes + 1)])
            assert torch.equal(tree.ancestry[row, i], explicit), (row, i)
            kids = [c for c in tree.children[row, i].tolist() if c >= 0]
            assert kids == sorted((c for c in range(1, nodes + 1) if parent[c] == i),
                                  key=lambda c: tree.rank[row, c - 1].item())
    root_slot, scratch, width = torch.tensor([7, 9, 11]), 20, 20 + nodes
    mask = tree_attention(tree.ancestry, root_slot, scratch, width)
    for row in range(b):
        for i in range(nodes + 1):
            seen = {s for s in range(width) if mask[row, i, s]}
            want = set(range(root_slot[row] + 1)) | {scratch + j - 1 for j in range(1, nodes + 1)
                                                      if tree.ancestry[row, i, j]}
            assert seen == want, (row, i)
    # the rerank keeps the best scores (ties to the earlier pool index)
    best = torch.sort(pool.get("score"), dim=1, descending=True, stable=True).values[:, :nodes]
    torch.testing.assert_close(tree.score.sort(1, descending=True).values, best)


def test_ancestry_of_a_chain_and_a_star() -> None:
    chain = ancestry(torch.tensor([[0, 1, 2]]))[0]
    assert torch.equal(chain, torch.tril(torch.ones(4, 4, dtype=torch.bool)))
    star = ancestry(torch.tensor([[0, 0, 0]]))[0]
    assert torch.equal(star, torch.eye(4, dtype=torch.bool) | (torch.arange(4)[None] == 0))


# ----------------------------------------------------------------------------- verification
def _caches(bundle: ModelBundle) -> list[torch.Tensor]:
    return [t.clone() for layer in bundle.target.gpt.layers
            for t in (layer.attention.kv_cache.k_cache, layer.attention.kv_cache.v_cache)]


@torch.inference_mode()
def test_committing_a_path_equals_recomputing_it() -> None:
    """A tree verified on scratch slots, its path moved to the position slots: the cache and the
    path's logits equal those of feeding the path in raster order."""
    bundle = build(grid=4, vocab=32, dim=32, seed=3)
    params = SamplingParams(temperature=1.0, cfg_scale=2.0)
    models, target = guided(bundle, params), guided(bundle, params).target
    cond = models.condition(PROMPTS[:2])
    b, seq = 2, target.cache_len
    prefix = seq - 16
    g = torch.Generator().manual_seed(0)
    committed = torch.randint(32, (b, 3), generator=g)  # positions 0, 1 fed; 2 is the root
    parent = torch.tensor([[0, 0, 1, 1, 3, 2], [0, 1, 0, 2, 4, 4]])
    anc = ancestry(parent)
    depth = anc[:, 1:, 1:].sum(-1)  # ancestors-or-self among the nodes = depth
    nodes = torch.randint(32, (b, 6), generator=g)
    paths = torch.tensor([[1, 3, 5], [1, 2, 4]])  # root -> depth 1 -> 2 -> 3 per row
    target.setup_cache(b, scratch=6)
    target.prefill(cond)
    target.forward(committed[:, :2], torch.arange(2))
    block = torch.cat([committed[:, 2:], nodes], 1)
    positions = torch.cat([torch.full((b, 1), 2), 2 + depth], 1)
    write = torch.cat([torch.full((b, 1), prefix + 2), seq + torch.arange(6).expand(b, -1)], 1)
    mask = tree_attention(anc, torch.full((b,), prefix + 2), seq, seq + 6)
    tree_logits = target.forward(block, positions, mask, slots=write)
    target.move_cache(seq - 1 + paths, prefix + 3 + torch.arange(3).expand(b, -1))
    moved = _caches(bundle)
    after_tree = target.forward(torch.full((b, 1), 5), torch.tensor([6]))
    # the same tokens in raster order on a fresh cache
    raster_tokens = torch.cat([committed, nodes.gather(1, paths - 1)], 1)  # positions 0..5
    target.setup_cache(b, scratch=6)
    target.prefill(cond)
    raster_logits = target.forward(raster_tokens, torch.arange(6))
    fresh = _caches(bundle)
    after_raster = target.forward(torch.full((b, 1), 5), torch.tensor([6]))
    used = slice(0, prefix + 6)  # prefix + positions 0..5
    for ours, ref in zip(moved, fresh):
        torch.testing.assert_close(ours[:, :, used], ref[:, :, used], atol=1e-5, rtol=1e-5)
    on_path = torch.cat([torch.zeros(b, 1, dtype=torch.long), paths], 1)
    torch.testing.assert_close(tree_logits.gather(1, on_path[..., None].expand(-1, -1, 32)),
                               raster_logits[:, 2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after_tree, after_raster, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("cfg_scale", [1.0, 2.0])
def test_greedy_eagle2_and_lantern_return_the_raster_tokens(cfg_scale: float) -> None:
    """Greedy eagle2, and greedy lantern at delta = 0, return the raster tokens. At delta = 0.4
    LANTERN's greedy branch relaxes the argmax (until issue 42 the harness used one-hot p there and
    this test pinned lantern = raster at every delta): its tokens differ, its bookkeeping holds."""
    params = SamplingParams(temperature=0.0, cfg_scale=cfg_scale)
    models = guided(build(grid=4, vocab=32, dim=32), params)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(params).generate(models, cond, [1, 2, 3])
    rules = (ExactRule(), LanternRule(k=8, delta=0.0), LanternRule(k=8, delta=0.4, metric="normalised"))
    for rule in rules:
        out = _tree_decoder(params, rule).generate(models, cond, [4, 5, 6])
        relaxed = isinstance(rule, LanternRule) and rule.delta > 0
        assert torch.equal(out.tokens, raster.tokens) != relaxed, rule.name
        for stats in out.stats:
            assert sum(stats.accepted_per_step) == 16 and stats.tokens == 16
            assert stats.target_forwards == len(stats.accepted_per_step)
            assert stats.drafter_forwards == 4 * (stats.target_forwards - 1)  # depth + 1 per round


@pytest.mark.parametrize("rule", ["exact", "exact-sequential", "lantern-0"])
def test_eagle2_preserves_the_target_distribution(rule: str) -> None:
    """Monte Carlo on a 2x2 grid of 3 codes: the empirical distribution of eagle2 (and of lantern
    at delta = 0 with `pooled_if: mass`) over 3000 images is within sampling noise of the enumerated
    target distribution, and a rule that forgets to take a rejected candidate out of p is caught.
    LANTERN's own `pooled_if: prefix` (the default since issue 42) is not exact at delta = 0 here:
    codes of zero mass make a rejected candidate take its neighbourhood out of p."""
    params = SamplingParams(temperature=1.0, cfg_scale=1.5)
    models = guided(_tiny_bundle(), params)
    prompt = "a red circle"
    exact = _enumerated_target(models, prompt, params)
    samples = 3000
    bound = _noise_bound(exact, samples)
    chosen = {"exact": ExactRule(), "exact-sequential": _SequentialExact(),
              "lantern-0": LanternRule(k=2, delta=0.0, pooled_if="mass")}[rule]
    decoder = _tree_decoder(params, chosen, depth=2, top_k=2, total_tokens=7)
    tvd = _tvd(decoder, models, exact, prompt, samples)
    assert tvd < bound, f"TVD {tvd:.4f} to the target >= {bound:.4f}"
    if rule == "exact":
        accepted = decoder.generate(models, models.condition([prompt] * 50), list(range(50))).stats
        assert sum(s.accepted for s in accepted) > 20, "the test must see accepted drafts"
        wrong = _tree_decoder(params, _KeepRejected(), depth=2, top_k=2, total_tokens=7)
        tvd = _tvd(wrong, models, exact, prompt, samples)
        assert tvd > 1.5 * bound, f"the test cannot see a biased rule (TVD {tvd:.4f}, bound {bound:.4f})"


class _KeepRejected:
    """A wrong tree rule: a rejected candidate stays in p (the negative control)."""

    name = "keep-rejected"

    def candidate(self, dist, x, ctx):  # type: ignore[no-untyped-def]
        return dist.gather(-1, x[:, None])[:, 0], dist


class _SequentialExact:
    """ExactRule's one-candidate-at-a-time form (what `siblings` computes in closed form)."""

    name = "exact-sequential"
    candidate = ExactRule.candidate


@pytest.mark.parametrize("seed", range(3))
def test_exact_siblings_in_closed_form_equal_one_at_a_time(seed: int) -> None:
    from baselines.framework.acceptance import sequential_siblings

    g = torch.Generator().manual_seed(seed)
    b, v, k = 64, 12, 5
    dist = torch.rand(b, v, generator=g) ** 3
    dist[:, -3:] = 0.0  # filtered codes
    dist /= dist.sum(-1, keepdim=True)
    xs = torch.stack([torch.randperm(v, generator=g)[:k] for _ in range(b)])
    valid = torch.rand(b, k, generator=g) < 0.8
    u = torch.rand(b, k, generator=g)
    taken, after = ExactRule().siblings(dist, xs, valid, u, None)  # type: ignore[arg-type]
    sequential = _SequentialExact()
    want_taken, want_after = sequential_siblings(sequential, dist, xs, valid, u, None)  # type: ignore[arg-type]
    assert torch.equal(taken, want_taken) and (taken >= 0).any() and (taken < 0).any()
    none = taken < 0
    torch.testing.assert_close(after[none], want_after[none], atol=1e-6, rtol=1e-5)


def _walk_level_by_level(p, children, tokens, u, limit, rule, ctx):  # type: ignore[no-untyped-def]
    """The tree walk as first written: decide the children of the node reached at each level, one
    level after the other (the reference `accept_tree` must equal)."""
    from baselines.framework.acceptance import sequential_siblings

    b, levels, k = u.shape
    rows = torch.arange(b)
    cur = torch.zeros(b, dtype=torch.long)
    dist, searching = p[:, 0], limit > 0
    accepted, path = torch.zeros_like(cur), torch.zeros(b, levels, dtype=torch.long)
    rejected = torch.zeros_like(searching)
    for level in range(levels):
        kids = children[rows, cur]
        valid = (searching & (level < limit))[:, None] & (kids >= 0)
        xs = tokens.gather(1, kids.clamp_min(0))
        if hasattr(rule, "siblings"):
            taken, after = rule.siblings(dist, xs, valid, u[:, level], ctx)
        else:
            taken, after = sequential_siblings(rule, dist, xs, valid, u[:, level], ctx)
        moved = taken >= 0
        tried = valid.any(-1) & ~moved
        cur = torch.where(moved, kids.gather(1, taken.clamp_min(0)[:, None])[:, 0], cur)
        path[:, level] = torch.where(moved, cur, path[:, level])
        dist = torch.where(moved[:, None], p[rows, cur], torch.where(tried[:, None], after, dist))
        rejected = torch.where(searching & ~moved, tried, rejected)
        accepted += moved.long()
        searching = searching & moved
    return path, accepted, dist, rejected


class _Neighbours:
    """The one thing LanternRule.candidate reads from a decode Context: a neighbour table."""

    def __init__(self, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        others = [torch.cat([torch.arange(i), torch.arange(i + 1, vocab)]) for i in range(vocab)]
        self.table = torch.stack([o[torch.randperm(vocab - 1, generator=g)] for o in others])  # [V, V-1]

    def neighbours(self, k: int, metric: str = "raw") -> torch.Tensor:
        return self.table[:, :k]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("rule", ["exact", "lantern", "lantern_pooled"])
def test_every_node_decided_at_once_equals_the_level_by_level_walk(seed: int, rule: str) -> None:
    from baselines.framework.acceptance import accept_tree

    b, depth, k, nodes, vocab = 32, 3, 3, 17, 50
    tree = select(_grown_pool(b, depth, k, seed), nodes, k)
    g = torch.Generator().manual_seed(100 + seed)
    p = torch.rand(b, nodes + 1, vocab, generator=g) ** 4
    p[..., -5:] = 0.0  # filtered codes
    block = torch.cat([torch.zeros(b, 1, dtype=torch.long), tree.tokens], 1)
    # each node's children are likely under its p (so that paths get long): put mass on them
    kids = block.gather(1, tree.children.clamp_min(0).flatten(1)).view(b, nodes + 1, k)
    p.scatter_add_(-1, kids, (tree.children >= 0) * 2.0)
    p /= p.sum(-1, keepdim=True)
    u = torch.rand(b, depth + 1, k, generator=g)
    limit = torch.randint(0, depth + 3, (b,), generator=g)
    rules = {"exact": ExactRule(), "lantern": LanternRule(k=6, delta=0.3),
             "lantern_pooled": LanternRule(k=6, delta=0.3, on_reject="pooled")}
    ctx = _Neighbours(vocab, seed)
    got = accept_tree(p, tree.children, block, tree.depth, u, limit, rules[rule], ctx)  # type: ignore[arg-type]
    path, accepted, dist, rejected = _walk_level_by_level(p, tree.children, block, u, limit, rules[rule], ctx)
    assert torch.equal(got.accepted, accepted) and torch.equal(got.path, path)
    assert torch.equal(got.rejected, rejected)
    torch.testing.assert_close(got.dist, dist, atol=1e-6, rtol=1e-5)
    assert (accepted >= 2).any() and rejected.any() and (limit == 0).any(), "the cases this test is about"


def test_lantern_relaxes_acceptance() -> None:
    params = SamplingParams(temperature=1.0, cfg_scale=1.5)
    models = guided(_tiny_bundle(), params)
    cond, seeds = models.condition(PROMPTS * 20), list(range(60))
    exact = _tree_decoder(params, ExactRule(), depth=2, top_k=2, total_tokens=7).generate(models, cond, seeds)
    for on_reject in LanternRule.ON_REJECT:
        relaxed = _tree_decoder(params, LanternRule(k=2, delta=0.9, on_reject=on_reject), depth=2, top_k=2,
                                total_tokens=7).generate(models, cond, seeds)
        assert sum(s.accepted for s in relaxed.stats) > sum(s.accepted for s in exact.stats), on_reject


def test_images_do_not_depend_on_the_batch() -> None:
    params = SamplingParams(temperature=1.0, top_k=20, cfg_scale=2.0)
    models = guided(build(grid=4, vocab=32, dim=32), params)
    for rule in (ExactRule(), LanternRule(k=8, delta=0.4)):
        decoder = _tree_decoder(params, rule)
        whole = decoder.generate(models, models.condition(PROMPTS), [7, 8, 9])
        for i, prompt in enumerate(PROMPTS):
            one = decoder.generate(models, models.condition([prompt]), [7 + i])
            assert torch.equal(one.tokens[0], whole.tokens[i]), (rule.name, i)
            assert one.stats[0].as_row() == whole.stats[i].as_row()


# ----------------------------------------------------------------------------- bad input
def test_tree_options_out_of_range_name_the_option_and_its_bound() -> None:
    with pytest.raises(ConfigValueError, match="draft.depth must be >= 1, got 0"):
        EagleDraft(depth=0)
    with pytest.raises(ConfigValueError, match="draft.top_k must be an integer"):
        EagleDraft(top_k=2.5)
    with pytest.raises(ConfigValueError, match=r"total_tokens \(50\) must be at most .* = 2 \+ 3 x 2\^2 = 14 "
                                               r"nodes, i.e. <= 15"):
        EagleDraft(depth=3, top_k=2, total_tokens=50)
    params = SamplingParams(temperature=0.0)
    models = build(grid=4, vocab=16, dim=32)
    with pytest.raises(ConfigValueError, match=r"draft.top_k \(20\) exceeds the vocabulary of model 'random' "
                                               r"\(16 codes\)"):
        _tree_decoder(params, top_k=20, total_tokens=30).generate(models, models.condition(["x"]), [0])


def test_a_bundle_without_a_head_is_refused_with_the_fix() -> None:
    models = build(grid=4, vocab=16, dim=32, eagle_head=False)
    with pytest.raises(ConfigValueError, match="model 'random' has no EAGLE head.*train_eagle"):
        _tree_decoder(SamplingParams(temperature=0.0)).generate(models, models.condition(["x"]), [0])


def test_a_head_of_another_grid_is_refused_by_the_decoder() -> None:
    models = build(grid=4, vocab=16, dim=32)
    other = build(grid=8, vocab=16, dim=32)
    models.target.eagle_head = other.target.eagle_head
    with pytest.raises(ConfigValueError, match=r"drafts a \(8, 8\) grid of 16 codes, the target has a "
                                               r"\(4, 4\)"):
        _tree_decoder(SamplingParams(temperature=0.0)).generate(models, models.condition(["x"]), [0])


def test_rules_without_a_tree_walk_are_refused() -> None:
    from baselines.methods.pooled import PooledThresholdRule

    with pytest.raises(ConfigValueError, match="cannot decide over a draft tree"):
        TreeDecoder(SamplingParams(), EagleDraft(),
                    PooledThresholdRule(k=4, tau=0.1))  # type: ignore[arg-type]


def test_tree_options_validate_the_pool_bound() -> None:
    assert TreeOptions().pool == 410 and TreeOptions().nodes == 58 and TreeOptions().levels == 5


# ----------------------------------------------------------------------------- the shipped heads
@pytest.mark.parametrize("world", ["x1", "x2"])
def test_shipped_heads_are_listed_with_their_hashes_and_fit_their_targets(world: str) -> None:
    from harness.shapes.bundle import HEAD_FILE, load
    from harness.shapes.weights import WORLDS, read_manifest, verified

    manifest = read_manifest(WORLDS[world])
    assert HEAD_FILE in manifest["files"] and manifest["metrics"]["eagle_head"]["steps"] > 0
    command = manifest["recipe"]["eagle_head"]["command"].split()
    module = command[command.index("-m") + 1]  # as recorded when trained; the module may have moved since
    assert MOVED.get(module, module) == "baselines.training.train_eagle", command
    verified(HEAD_FILE, WORLDS[world])
    bundle = load(world=world, drafter=False, small_drafter=False)
    assert bundle.eagle_head is not None and bundle.eagle_head.cfg.grid == bundle.target.grid


def test_the_shipped_x1_head_drafts_long_paths_and_greedy_trees_equal_raster() -> None:
    from harness.shapes.bundle import load

    params = SamplingParams(temperature=0.0, cfg_scale=1.5)
    models = guided(load(drafter=False, small_drafter=False), params)
    cond = models.condition(["a photo of a red circle and a blue square", "a photo of three triangles"])
    raster = RasterDecoder(params).generate(models, cond, [0, 1])
    for rule in (ExactRule(), LanternRule(delta=0.0), LanternRule(delta=0.4)):
        out = TreeDecoder(params, EagleDraft(), rule).generate(models, cond, [0, 1])
        assert torch.equal(out.tokens, raster.tokens), rule.name
        for stats in out.stats:
            rounds = stats.accepted_per_step[1:]
            assert sum(rounds) / len(rounds) > 2.0, "a trained head's drafts are accepted in long runs"
