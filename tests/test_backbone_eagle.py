"""EAGLE heads on every backbone's stand-in (`lumina_tiny`, `janus_tiny`, `emu3_tiny`): the head the
bundle attaches fits its target (width, heads, codes, grid, condition slots) and drafts through the
target's own position code (1-D rotary positions, end-of-row slots counted); greedy eagle2 gives
raster's tokens, a sampled image does not depend on its batch, lantern and lantern_pp run; a head
trained for a few steps by baselines/training/train_eagle.py lowers its loss and loads back through
the model config; LANTERN's Lumina-mGPT head layout loads strictly."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from baselines.methods.raster import RasterDecoder
from baselines.training import train_eagle
from harness import preflight
from harness.api import ModelBundle
from harness.models.eagle_head import (EagleHead, EagleHeadConfig, TargetSpec, build_head, check_compatible,
                                       head_spec, load_trained, read_info)
from harness.models.hub import WeightsError
from harness.run import _build, guided
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

BACKBONES = ("lumina_tiny", "janus_tiny", "emu3_tiny")
PROMPTS = ["a red cube on a table", "two dogs", "a blue bird over a river at dusk"]
HEAD_DECODERS = ("eagle2", "lantern", "lantern_pp")


@pytest.fixture(scope="module", params=BACKBONES)
def backbone(request) -> tuple[str, ModelBundle]:
    model = request.param
    return model, _build(compose_cfg([f"model={model}"]).model, drop=("name", "sampling"))


def _decoder(model: str, name: str, extra: list[str]):
    cfg = compose_cfg([f"model={model}", f"decoder=[{name}]", *extra])
    return _build(cfg.decoder[name])


def test_each_backbone_attaches_a_fitting_head(backbone) -> None:
    model, bundle = backbone
    head, target = bundle.target.eagle_head, bundle.target
    assert isinstance(head, EagleHead), model
    spec = head_spec(target)
    assert isinstance(spec, TargetSpec)
    assert (head.cfg.dim, head.cfg.vocab_size, tuple(head.cfg.grid), head.cfg.prefix_len) == \
        (spec.dim, spec.vocab_size, tuple(target.grid), int(target.cache_len) - spec.grid[0] * spec.grid[1])
    assert torch.allclose(head.embed_tokens.weight.float(), target.token_embeddings.detach().float().cpu())


def test_a_head_for_another_grid_is_refused_naming_both_sides(backbone) -> None:
    model, bundle = backbone
    spec = head_spec(bundle.target)
    other = EagleHeadConfig.for_target(spec, grid=(spec.grid[0] + 1, spec.grid[1]), vocab_size=spec.vocab_size + 1)
    with pytest.raises(WeightsError, match=r"token grid .* vs the target's .*vocabulary|vocabulary .*token grid"):
        check_compatible(other, spec, "head.safetensors")


def test_positional_counts_end_of_row_slots(backbone) -> None:
    """Lumina-mGPT and Emu3 close every row with an end-of-row token: the first position of row 1 is
    cols + 1 rotary steps after position 0; Janus-Pro has none (cols steps)."""
    model, bundle = backbone
    target = bundle.target
    target.setup_cache(1)
    target.prefill(bundle.condition(["a cat"]))
    p, cols = target.prefix_len, target.grid[1]
    slots = torch.tensor([[p, p + cols]], device=target.device)
    spec = head_spec(target)
    h = torch.zeros(1, 2, spec.dim)
    same, table = target.positional(h, slots)
    assert same is h and table.shape == (1, 2, spec.head_dim // 2, 2)
    angle = torch.atan2(table[0, :, 0, 1], table[0, :, 0, 0])  # the fastest pair turns by 1 rad a step
    steps = cols + (0 if model == "janus_tiny" else 1)
    assert float(angle[1] - angle[0]) % (2 * torch.pi) == pytest.approx(steps % (2 * torch.pi), abs=1e-4)


def test_eagle2_greedy_equals_raster_on_each_backbone(backbone) -> None:
    model, bundle = backbone
    decoder = _decoder(model, "eagle2", ["sampling.temperature=0.0"])
    models = guided(bundle, decoder.sampling)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(decoder.sampling).generate(models, cond, [0, 1, 2])
    out = decoder.generate(models, cond, [3, 4, 5])
    assert torch.equal(out.tokens, raster.tokens), model
    assert len(set(raster.tokens.flatten().tolist())) > 4  # not one repeated code
    assert all(s.target_forwards <= raster.stats[0].target_forwards for s in out.stats)


def test_eagle2_sampled_images_do_not_depend_on_the_batch(backbone) -> None:
    model, bundle = backbone
    decoder = _decoder(model, "eagle2", ["sampling.temperature=1.0"])
    models = guided(bundle, decoder.sampling)
    seeds = [11, 12]
    together = decoder.generate(models, models.condition(PROMPTS[:2]), seeds)
    for i, (prompt, seed) in enumerate(zip(PROMPTS[:2], seeds)):
        alone = decoder.generate(models, models.condition([prompt]), [seed])
        assert torch.equal(alone.tokens[0], together.tokens[i]), f"{model}, image {i}"
        assert alone.stats[0].target_forwards == together.stats[i].target_forwards


@pytest.mark.parametrize("name", ["lantern", "lantern_pp"])
def test_lantern_decoders_run_on_each_backbone(backbone, name: str) -> None:
    model, bundle = backbone
    decoder = _decoder(model, name, [])
    models = guided(bundle, decoder.sampling)
    out = decoder.generate(models, models.condition(PROMPTS[:2]), [5, 6])
    n = bundle.target.grid[0] * bundle.target.grid[1]
    assert out.tokens.shape == (2, n)
    assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < bundle.target.vocab_size
    assert all(0 < s.target_forwards <= n for s in out.stats)


@pytest.mark.parametrize("model", [*BACKBONES, "lumina_mgpt_768"])
def test_paper_main_and_field_compose_head_rows_where_a_head_is_configured(model: str) -> None:
    paper = preflight.plan(compose_cfg(["+experiment=paper_main", f"model={model}"]))
    assert {"eagle2", "lantern"} <= set(paper.decoders), paper.skipped
    field = preflight.plan(compose_cfg(["+experiment=field", f"model={model}"]))
    assert set(HEAD_DECODERS) <= set(field.decoders), field.skipped


@pytest.mark.parametrize("model", ["lumina_mgpt_512", "janus_pro_1b", "emu3_gen"])
def test_field_skips_head_rows_where_no_head_is_configured(model: str) -> None:
    field = preflight.plan(compose_cfg(["+experiment=field", f"model={model}"]))
    for row in HEAD_DECODERS:
        assert row not in field.decoders and "model.eagle_head_file" in field.skipped[row]


@pytest.mark.parametrize("model", ["lumina_mgpt_512", "lumina_mgpt_1024", "janus_pro_7b", "emu3_gen"])
def test_real_backbones_without_a_head_skip_head_rows_with_the_fix(model: str) -> None:
    cfg = compose_cfg([f"model={model}"])
    node = compose_cfg([f"model={model}", "decoder=[eagle2]"]).decoder["eagle2"]
    problem = preflight.decoder_problem("eagle2", node, cfg.model)
    assert problem is not None and "eagle_head_file" in problem


def test_lumina_768_names_lanterns_released_head() -> None:
    from harness.assets.fetching import model_assets

    cfg = compose_cfg(["model=lumina_mgpt_768"])
    assert cfg.model.eagle_head_repo == "sihwanpark/LANTERN-Lumina-mGPT-7B-768"
    heads = [a for a in model_assets(cfg.model) if a.repo == cfg.model.eagle_head_repo]
    assert len(heads) == 1 and heads[0].patterns == ("config.json",)
    assert heads[0].weights == (("pytorch_model.bin",), ("model.safetensors",))  # LANTERN's order
    node = compose_cfg(["model=lumina_mgpt_768", "decoder=[eagle2]"]).decoder["eagle2"]
    assert preflight.decoder_problem("eagle2", node, cfg.model) is None


# ----------------------------------------------------------------------------- training
@pytest.mark.parametrize("model", BACKBONES)
def test_train_eagle_lowers_the_loss_and_the_head_loads_from_the_config(model: str, tmp_path: Path) -> None:
    bundle, _ = train_eagle.build_bundle(model)
    assert bundle.target.eagle_head is None  # the training target carries no head
    held = [next(train_eagle.self_batches(bundle, seed=99, batch_size=4, null=0.25, prompts=PROMPTS))]
    out = tmp_path / f"{model}.safetensors"
    start = train_eagle.evaluate(train_eagle.initial_head(bundle.target, None, 0), bundle.target, held)
    head, metrics = train_eagle.train(bundle, lambda s: train_eagle.self_batches(
        bundle, seed=0, batch_size=4, null=0.25, prompts=PROMPTS, start=s), steps=20, out=out, lr=3e-3,
        ckpt_every=0, log_every=0, eval_batches=held)
    assert metrics["heldout"]["vloss"] < 0.9 * start["vloss"], (start, metrics["heldout"])
    loaded = load_trained(out)
    assert loaded.cfg == head.cfg
    reloaded = _build(compose_cfg([f"model={model}", f"model.eagle_head_file={out}"]).model,
                      drop=("name", "sampling"))
    assert torch.equal(reloaded.target.eagle_head.fc.weight.float(), loaded.fc.weight.float())


def test_train_eagle_cli_on_a_tiny_backbone(tmp_path: Path) -> None:
    out = tmp_path / "head.safetensors"
    train_eagle.main(["--model", "janus_tiny", "--data", "self", "--steps", "3", "--batch-size", "2",
                      "--eval-batches", "1", "--out", str(out), "--log-every", "0"])
    info = read_info(out)
    assert info["model"] == "janus_tiny" and info["data"] == "self" and info["steps"] == 3


# ----------------------------------------------------------------------------- LANTERN's Lumina head
LUMINA_CONFIG = {"model_type": "chameleon", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
                 "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 512, "rms_norm_eps": 1e-5,
                 "model_parallel_size": 1, "rope_theta": 10000.0}


def _lantern_lumina_state(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random head in LANTERN's Chameleon drafter layout (cnets_lumina_mgpt.Model's state dict)."""
    g = torch.Generator().manual_seed(seed)
    d, f, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    state = {"embed_tokens.weight": rand(cfg["vocab_size"], d), "fc.weight": rand(d, 2 * d), "fc.bias": rand(d),
             "layers.0.input_layernorm.weight": 1 + rand(d), "layers.0.post_attention_layernorm.weight": 1 + rand(d)}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        state[f"layers.0.self_attn.{name}.weight"] = rand(d, d)
    for name in ("q_norm", "k_norm"):
        state[f"layers.0.self_attn.{name}.weight"] = 1 + rand(1, hd)
        state[f"layers.0.self_attn.{name}.bias"] = rand(1, hd)
    for name, shape in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f))):
        state[f"layers.0.mlp.{name}.weight"] = rand(*shape)
    return state


def _write_lantern(folder: Path, state: dict[str, torch.Tensor], cfg: dict) -> tuple[Path, Path]:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "model.safetensors", folder / "config.json"


@pytest.fixture(scope="module")
def lumina() -> ModelBundle:
    return _build(compose_cfg(["model=lumina_tiny"]).model, drop=("name", "sampling"))


def test_lantern_lumina_head_loads_strictly_and_drafts(lumina: ModelBundle, tmp_path: Path) -> None:
    target = lumina.target
    weights, config = _write_lantern(tmp_path / "lantern", _lantern_lumina_state(LUMINA_CONFIG), LUMINA_CONFIG)
    head = build_head(head_spec(target), target.token_embeddings, file=str(weights), config_file=str(config),
                      vocab_ids=target.code_ids)
    assert head.cfg.input_norm and head.cfg.qk_norm_shards == 1
    assert head.cfg.vocab_size == target.vocab_size and tuple(head.cfg.grid) == target.grid
    raw = _lantern_lumina_state(LUMINA_CONFIG)
    assert torch.equal(head.embed_tokens.weight, raw["embed_tokens.weight"][target.code_ids])
    # the rotate-half pairs became interleaved ones: channel 1 of head 0 is the old channel hd/2
    hd = LUMINA_CONFIG["hidden_size"] // LUMINA_CONFIG["num_attention_heads"]
    assert torch.equal(head.layers[0].self_attn.q_proj.weight[1], raw["layers.0.self_attn.q_proj.weight"][hd // 2])
    target.eagle_head = head
    try:
        decoder = _decoder("lumina_tiny", "eagle2", ["sampling.temperature=0.0"])
        models = guided(lumina, decoder.sampling)
        cond = models.condition(PROMPTS[:1])
        out = decoder.generate(models, cond, [0])
        assert torch.equal(out.tokens, RasterDecoder(decoder.sampling).generate(models, cond, [0]).tokens)
    finally:
        target.eagle_head = None


def test_rotate_half_conversion_keeps_the_heads_attention(tmp_path: Path) -> None:
    """The loaded head's attention equals a rotate-half Chameleon attention on the file's weights."""
    from harness.models.lumina.chameleon import ChameleonArch, ChameleonAttention, rope_cos_sin
    from harness.models.transformer import rope_1d_table

    cfg = LUMINA_CONFIG
    raw = _lantern_lumina_state(cfg, seed=3)
    weights, config = _write_lantern(tmp_path / "lantern", raw, cfg)
    spec = TargetSpec(dim=64, n_head=4, n_kv_head=4, vocab_size=8, grid=(2, 2), prefix_len=3, ffn_dim=96)
    head = build_head(spec, torch.zeros(8, 64), file=str(weights), config_file=str(config),
                      vocab_ids=torch.arange(8))
    arch = ChameleonArch(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4)
    ref = ChameleonAttention(arch)
    ref.load_state_dict({k.split("self_attn.")[1]: v for k, v in raw.items() if "self_attn." in k})
    x = torch.randn(1, 5, 64)
    pos = torch.arange(5)[None] + 7
    cos, sin = rope_cos_sin(pos, 16, 10000.0, x.dtype)
    want = ref(x, cos, sin, None, None)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    got = head.layers[0].self_attn(x, rope_1d_table(pos, inv), None, None)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_lantern_lumina_head_names_a_missing_or_extra_key(lumina: ModelBundle, tmp_path: Path, change: str) -> None:
    state = _lantern_lumina_state(LUMINA_CONFIG)
    if change == "missing":
        del state["layers.0.self_attn.k_norm.bias"]
        key = "layers.0.self_attn.k_norm.bias"
    else:
        state["layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        key = "layers.0.self_attn.rotary_emb.inv_freq"
    weights, config = _write_lantern(tmp_path / change, state, LUMINA_CONFIG)
    target = lumina.target
    with pytest.raises(WeightsError, match=key.replace(".", r"\.")):
        build_head(head_spec(target), target.token_embeddings, file=str(weights), config_file=str(config),
                   vocab_ids=target.code_ids)


def test_lantern_lumina_head_refuses_another_width(lumina: ModelBundle, tmp_path: Path) -> None:
    cfg = {**LUMINA_CONFIG, "hidden_size": 32, "intermediate_size": 48}
    weights, config = _write_lantern(tmp_path / "narrow", _lantern_lumina_state(cfg), cfg)
    target = lumina.target
    with pytest.raises(WeightsError, match="width 32 vs the target's 64"):
        build_head(head_spec(target), target.token_embeddings, file=str(weights), config_file=str(config),
                   vocab_ids=target.code_ids)
