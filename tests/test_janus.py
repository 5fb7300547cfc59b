"""Janus-Pro through transformers' Janus modules (`model=janus_tiny`, a tiny random
JanusForConditionalGeneration): greedy raster decoding with CFG equals transformers' own
`generate(generation_mode="image")` token for token; the cached forward equals transformers' full
forward (logits), rollback by overwrite, explicit masks; batch independence; SJD and draft-model SD
greedy equal raster; strict reloading; the configs' refusals (MuLo-SD) and hub listings."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baselines.methods.raster import RasterDecoder
from harness.api import ModelBundle, SamplingParams
from harness.models.hub import WeightsError
from harness.models.janus.model import JanusImageModel
from harness.run import _build, guided
from harness.models.eagle_head import save_head
from tests.backbone_contract import check_rows_independent, check_scratch_node, greedy_equals_raster
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

PROMPTS = ["a red cube on a wooden table", "two dogs", "a blue bird flying over a wide green river at dusk"]
GREEDY = SamplingParams(temperature=0.0, cfg_scale=5.0)


def _tiny(overrides: list[str] | None = None) -> ModelBundle:
    return _build(compose_cfg(["model=janus_tiny", *(overrides or [])]).model, drop=("name", "sampling"))


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return _tiny()


def _reference(bundle: ModelBundle, prompt: str, scale: float) -> list[int]:
    """transformers' own image generation of one prompt, greedy, CFG `scale`."""
    ids = torch.tensor([bundle.conditioner.tokenizer([prompt])[0]])
    out = bundle.target.hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_mode="image",
                                    do_sample=False, guidance_scale=scale)
    return out[0].tolist()


@pytest.mark.parametrize("scale", [5.0, 2.0])
def test_janus_greedy_raster_equals_transformers_generate(bundle: ModelBundle, scale: float) -> None:
    """Prompts of different lengths in one batch (left-padded in the harness, alone in transformers)."""
    params = SamplingParams(temperature=0.0, cfg_scale=scale)
    models = guided(bundle, params)
    ours = RasterDecoder(params).generate(models, models.condition(PROMPTS), [0, 1, 2]).tokens
    for row, prompt in zip(ours.tolist(), PROMPTS):
        assert row == _reference(bundle, prompt, scale), prompt
    assert len({tuple(r) for r in ours.tolist()}) == 3 and len(set(ours.flatten().tolist())) > 8  # not one code


def test_janus_bf16_greedy_raster_equals_transformers_generate() -> None:
    """In bf16 too: CFG is mixed in the gen head's dtype, as transformers does (`guidance_dtype`)."""
    bf16 = _tiny(["model.dtype=bf16", "model.small_arch=null"])
    models = guided(bf16, GREEDY)
    prompts = [*PROMPTS, "a cat", "three apples", "a car near a tree"]
    ours = RasterDecoder(GREEDY).generate(models, models.condition(prompts), list(range(6))).tokens
    for row, prompt in zip(ours.tolist(), prompts):
        assert row == _reference(bf16, prompt, 5.0), prompt


@torch.inference_mode()
def test_janus_cached_forward_equals_the_full_forward(bundle: ModelBundle) -> None:
    """Teacher-forced logits of the harness (prefill + one wide forward) equal transformers' forward
    of the whole sequence through the gen path; overwriting positions (rollback) and an explicit
    slot-causal mask change nothing; a mask hiding a slot changes the queries after it."""
    model, cond = bundle.target, bundle.condition(PROMPTS[:1])
    hf, n = model.hf, model.grid[0] * model.grid[1]
    tokens = torch.randint(0, model.vocab_size, (1, n), generator=torch.Generator().manual_seed(3))
    prompt = cond.ids[cond.keep][None]  # [1, L] without padding
    embeds = torch.cat([hf.model.language_model.embed_tokens(prompt),
                        hf.prepare_embeddings_for_image_generation(tokens[:, :-1])], 1)
    hidden = hf.model.language_model(inputs_embeds=embeds).last_hidden_state
    reference = hf.model.generation_head(hidden[:, prompt.shape[1] - 1:]).float()  # [1, n, V]
    model.setup_cache(1)
    first = model.prefill(cond)
    rest = model.forward(tokens[:, :-1], torch.arange(n - 1))
    torch.testing.assert_close(torch.cat([first[:, None], rest], 1), reference, rtol=1e-5, atol=1e-5)
    model.forward(torch.zeros(1, 8, dtype=torch.long), torch.arange(5, 13))  # junk at 5..12
    again = model.forward(tokens[:, 5:13], torch.arange(5, 13))  # rollback: overwrite
    torch.testing.assert_close(again, rest[:, 5:13], rtol=1e-5, atol=1e-5)
    causal = torch.arange(model.cache_len)[None, None] <= (torch.arange(5, 13) + model.prefix_len)[None, :, None]
    explicit = model.forward(tokens[:, 5:13], torch.arange(5, 13), causal)
    torch.testing.assert_close(explicit, rest[:, 5:13], rtol=1e-5, atol=1e-5)
    hidden_mask = causal.clone()
    hidden_mask[..., model.prefix_len + 6] = False  # hide image position 6 (its query keeps nothing of it)
    hidden_mask[0, 1, model.prefix_len + 6] = True  # ... except its own
    masked = model.forward(tokens[:, 5:13], torch.arange(5, 13), hidden_mask)
    torch.testing.assert_close(masked[:, :2], rest[:, 5:7], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(masked[:, 2:], rest[:, 7:13], atol=1e-3)


@pytest.mark.parametrize("at", [3, 7])
def test_janus_scratch_slots_and_move_cache_equal_direct_writes(bundle: ModelBundle, at: int) -> None:
    check_scratch_node(bundle.target, bundle.condition(PROMPTS[1:2]), at)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0, cfg_scale=5.0)])
def test_janus_batch_of_one_equals_batch_of_three(bundle: ModelBundle, params: SamplingParams) -> None:
    check_rows_independent(bundle, params, PROMPTS, [4, 5, 6])


def _decoder(name: str):
    cfg = compose_cfg([f"decoder=[{name}]", "model=janus_tiny", "sampling.temperature=0.0"])
    return _build(cfg.decoder[name])


@pytest.mark.parametrize("name", ["sjd", "sd"])
def test_janus_speculative_greedy_equals_raster(bundle: ModelBundle, name: str) -> None:
    out = greedy_equals_raster(bundle, _decoder(name), PROMPTS, [0, 1, 2])
    assert all(s.drafter_forwards > 0 for s in out.stats) == (name == "sd")


def test_janus_sd_with_the_target_as_drafter_accepts_every_draft(bundle: ModelBundle) -> None:
    """A small drafter over the target's own weights (its own cache): every draft is accepted, so
    the SD path reads the drafter's logits at the right positions."""
    decoder = _decoder("sd")  # gamma 4: 15 tokens after the prefill in 3 verifications of 4 + 1
    twin = ModelBundle(name="twin", target=bundle.target, conditioner=bundle.conditioner,
                       small_drafter=JanusImageModel(bundle.target.hf, bundle.target.prefix_len))
    out = decoder.generate(guided(twin, decoder.sampling), twin.condition(PROMPTS), [0, 1, 2])
    assert [s.target_forwards for s in out.stats] == [1 + 3] * 3
    assert all(s.accepted == 12 for s in out.stats)


@torch.inference_mode()
def test_janus_decode_and_encode_shapes(bundle: ModelBundle) -> None:
    model = bundle.target
    images = model.decode(torch.randint(0, model.vocab_size, (2, 16)))
    assert images.shape == (2, 3, 64, 64) and images.dtype == torch.uint8 and images.float().std() > 0
    assert model.encode(images).shape == (2, 16)
    assert model.codebook.shape == (64, 8)
    with pytest.raises(ValueError, match="64x64"):
        model.encode(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_janus_unconditional_rows_keep_only_bos_and_image_start(bundle: ModelBundle) -> None:
    cond = bundle.condition(PROMPTS[:2])
    both = cond.with_null()
    null, keep = both.ids[2:], both.keep[2:]
    assert torch.equal(keep, cond.keep) and torch.equal(both.ids[:2], cond.ids)
    pad, (bos, boi) = cond.pad_id, cond.kept
    for row, kept in zip(null, keep):
        real = row[kept].tolist()
        assert real[0] == bos and real[-1] == boi and set(real[1:-1]) == {pad}
    with pytest.raises(ValueError, match="model.prefix_len=16"):
        bundle.condition([" ".join(["word"] * 20)])


def test_janus_strict_reload_from_saved_folders(bundle: ModelBundle, tmp_path: Path) -> None:
    bundle.target.hf.save_pretrained(tmp_path / "target")
    bundle.small_drafter.hf.save_pretrained(tmp_path / "small")
    save_head(bundle.target.eagle_head, tmp_path / "head.safetensors", dtype=torch.float32)
    loaded = _tiny(["model.random_init=false", f"model.local_dir={tmp_path / 'target'}",
                    f"model.small_drafter_local_dir={tmp_path / 'small'}",
                    f"model.eagle_head_file={tmp_path / 'head.safetensors'}"])
    for a, b in [(bundle.target, loaded.target), (bundle.small_drafter, loaded.small_drafter)]:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    from safetensors.torch import load_file, save_file

    file = tmp_path / "target" / "model.safetensors"
    state = load_file(str(file))
    state["model.surprise.weight"] = torch.zeros(1)
    del state["model.generation_head.vision_head.bias"]
    save_file(state, str(file), metadata={"format": "pt"})
    with pytest.raises(Exception) as err:  # Hydra wraps the loader's WeightsError
        _tiny(["model.random_init=false", f"model.local_dir={tmp_path / 'target'}", "model.small_arch=null",
               "model.eagle_head_file=null"])
    assert isinstance(err.value.__cause__, WeightsError)
    assert "unexpected keys [model.surprise.weight]" in str(err.value)
    assert "missing keys [model.generation_head.vision_head.bias]" in str(err.value)


def test_janus_hub_snapshots_are_identified_by_their_commits(bundle: ModelBundle) -> None:
    from harness.models.hub import hub_revision

    folder = "/cache/models--deepseek-community--Janus-Pro-7B/snapshots/0123abcd"
    assert hub_revision("deepseek-community/Janus-Pro-7B", folder) == "deepseek-community/Janus-Pro-7B@0123abcd"
    assert hub_revision("deepseek-community/Janus-Pro-7B", "/data/janus-7b") is None
    assert bundle.weights_id is None  # random weights: the harness digests them


def test_janus_preflight_refuses_mulo_sd_with_the_reason() -> None:
    from harness.preflight import IncompatibleError, plan

    cfg = compose_cfg(["model=janus_pro_7b", "decoder=[mulo_sd,eagle2,sd,sjd,raster]", "incompatible=skip"])
    jobs = plan(cfg)
    assert sorted(jobs.decoders) == ["raster", "sd", "sjd"]
    assert "384 px" in jobs.skipped["mulo_sd"] and "low-resolution" in jobs.skipped["mulo_sd"]
    assert "eagle_head" in jobs.skipped["eagle2"]
    with pytest.raises(IncompatibleError, match="mulo_sd: needs drafter: Janus-Pro generates at one fixed"):
        plan(compose_cfg(["model=janus_pro_1b", "decoder=[raster,mulo_sd]"]))
    with pytest.raises(IncompatibleError, match="small_drafter"):
        plan(compose_cfg(["model=janus_pro_1b", "decoder=[sd]"]))
    assert plan(compose_cfg(["model=janus_tiny", "decoder=[sd]"])).decoders == ["sd"]


def test_janus_fetch_lists_both_repos() -> None:
    from harness.assets.fetching import model_assets

    assets = model_assets(compose_cfg(["model=janus_pro_7b"]).model)
    assert [a.repo for a in assets] == ["deepseek-community/Janus-Pro-7B", "deepseek-community/Janus-Pro-1B"]
    assert all("*.safetensors" in a.patterns and "config.json" in a.patterns for a in assets)
    local = model_assets(compose_cfg(["model=janus_pro_7b", "model.local_dir=/x"]).model)
    assert [a.repo for a in local] == ["deepseek-community/Janus-Pro-1B"]
    assert model_assets(compose_cfg(["model=janus_tiny"]).model) == []


def test_janus_pro_1b_sized_config_gives_the_384px_grid() -> None:
    """The Janus-Pro-1B layout (JanusConfig's defaults with the 1B's Llama, built on the meta
    device): 24x24 = 576 image tokens of 16384 codes at 384 px."""
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig

    text = LlamaConfig(vocab_size=102400, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                       num_attention_heads=16, num_key_value_heads=16)
    with torch.device("meta"):
        hf = JanusForConditionalGeneration(JanusConfig(text_config=text))
    model = JanusImageModel(hf, 256)
    assert model.grid == (24, 24) and model.vocab_size == 16384 and model.image_size == 384
    assert model.cache_len == 256 + 576 and len(model.layers) == 24


@pytest.mark.slow
def test_janus_tiny_runs_through_the_cli(tmp_path: Path) -> None:
    """`python -m harness model=janus_tiny` with the decoders Janus can run: images, stats, summary."""
    import os
    import subprocess
    import sys

    import pandas as pd
    from PIL import Image

    from tests.conftest import ROOT

    out, decoders = tmp_path / "run", ["raster", "sjd", "sd", "zipar", "lantern_chain"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    args = ["model=janus_tiny", f"decoder=[{','.join(decoders)}]", "dataset_limit=2", "batch_size=2",
            "warmup_batches=0", "threads=1", "device=cpu", f"hydra.run.dir={out}"]
    res = subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary[summary.metric == "latency_s"].decoder) == set(decoders)
    for dec in decoders:
        pngs = sorted((out / "samples" / dec).rglob("*.png"))
        assert len(pngs) == 2 and Image.open(pngs[0]).size == (64, 64)
