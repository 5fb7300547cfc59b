"""Emu3 through transformers' Emu3 modules (`model=emu3_tiny`, a tiny random
Emu3ForConditionalGeneration): greedy raster decoding with CFG against a negative prompt equals
transformers' own `generate` (the documented `prefix_allowed_tokens_fn` constraint and
`negative_prompt_ids`) token for token; the cached forward equals transformers' full forward over
the sequence with its end-of-row tokens; explicit masks across the end-of-row slots; draft-tree
scratch slots; batch independence; SJD and SJD-PAC greedy equal raster; strict reloading; the
configs' drafter, refusals and hub listing."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baselines.methods.raster import RasterDecoder
from harness.api import ModelBundle, SamplingParams
from harness.models.emu3 import tiny
from harness.models.hub import WeightsError
from harness.run import _build, guided
from harness.models.eagle_head import save_head
from tests.backbone_contract import check_rows_independent, check_scratch_node, greedy_equals_raster
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

PROMPTS = ["a red cube on a wooden table", "two dogs", "a blue bird flying over a wide green river at dusk"]
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)


def _tiny(overrides: list[str] | None = None) -> ModelBundle:
    return _build(compose_cfg(["model=emu3_tiny", *(overrides or [])]).model, drop=("name", "sampling"))


@pytest.fixture(scope="module")
def bundle() -> ModelBundle:
    return _tiny()


def _reference(bundle: ModelBundle, prompt: str, scale: float, baai: bool = False) -> list[int]:
    """transformers' own image generation of one prompt (greedy, CFG `scale` against the config's
    negative prompt), constrained as transformers' Emu3 documentation constrains it; the codes.
    `baai`: the context of BAAI's image_generation.py (the quality suffix after the prompt, the
    negative prompt followed by the header, both given to the same `generate`)."""
    hf, tok = bundle.target.hf, bundle.conditioner.tokenizer
    rows, cols = bundle.target.grid
    suffix = bundle.conditioner.suffix if baai else ""
    ids = torch.tensor([tok.text([prompt + suffix])[0] + tok.header((rows, cols))])
    neg = bundle.conditioner.negative[bundle.conditioner.negative_keep][None]
    if baai:
        neg = torch.cat([neg, torch.tensor([tok.header((rows, cols))])], 1)
    visual = hf.vocabulary_mapping.image_tokens

    def allowed(batch_id: int, input_ids: torch.Tensor) -> list[int]:
        position = torch.nonzero(input_ids == tiny.WRAPPER, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (cols + 1) == 0:
            return [tiny.EOL]
        if offset == (cols + 1) * rows + 1:
            return [tiny.EOF]
        return visual

    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=rows * (cols + 1) + 1,
                      do_sample=False, guidance_scale=scale, negative_prompt_ids=neg,
                      negative_prompt_attention_mask=torch.ones_like(neg), prefix_allowed_tokens_fn=allowed)
    seq = out[0, ids.shape[1]:]
    assert seq[-1] == tiny.EOF
    image = seq[:-1].view(rows, cols + 1)
    assert (image[:, -1] == tiny.EOL).all()
    return hf.vocabulary_mapping.convert_bpe2img(image).flatten().tolist()


@pytest.mark.parametrize("scale", [3.0, 1.5])
def test_emu3_greedy_raster_equals_transformers_generate(bundle: ModelBundle, scale: float) -> None:
    """Prompts of different lengths in one batch (left-padded in the harness, alone in transformers);
    transformers mixes log-softmaxed scores, the harness raw logits: the same tokens."""
    params = SamplingParams(temperature=0.0, cfg_scale=scale)
    models = guided(bundle, params)
    ours = RasterDecoder(params).generate(models, models.condition(PROMPTS), [0, 1, 2]).tokens
    for row, prompt in zip(ours.tolist(), PROMPTS):
        assert row == _reference(bundle, prompt, scale), prompt
    assert len({tuple(r) for r in ours.tolist()}) == 3 and len(set(ours.flatten().tolist())) > 16  # not one code


def test_emu3_baai_context_equals_generate_with_baai_inputs(bundle: ModelBundle) -> None:
    """cfg_context=baai: the prompts carry the quality suffix and the unconditional rows the header
    after the negative prompt, as BAAI's image_generation.py builds both; greedy raster equals
    transformers' generate given those inputs, and differs from the transformers context."""
    baai = _tiny(["model.cfg_context=baai"])
    assert baai.conditioner.suffix == " masterpiece best" and bundle.conditioner.suffix == ""
    models = guided(baai, GREEDY)
    ours = RasterDecoder(GREEDY).generate(models, models.condition(PROMPTS), [0, 1, 2]).tokens
    for row, prompt in zip(ours.tolist(), PROMPTS):
        assert row == _reference(baai, prompt, 3.0, baai=True), prompt
    plain = guided(bundle, GREEDY)
    other = RasterDecoder(GREEDY).generate(plain, plain.condition(PROMPTS), [0, 1, 2]).tokens
    assert not torch.equal(ours, other)
    cond = baai.condition(PROMPTS[:1]).with_null()
    ids, keep = cond.rows((8, 8))
    header = list(cond.header((8, 8)))
    assert ids[1][keep[1]].tolist() == baai.conditioner.tokenizer.text(["lowres blurry"])[0] + header
    with pytest.raises(Exception, match="model.cfg_context='hf'"):
        _tiny(["model.cfg_context=hf"])


def test_emu3_gen_defaults_to_baai_context() -> None:
    node = compose_cfg(["model=emu3_gen"]).model
    assert node.cfg_context == "baai" and node.positive_prompt == " masterpiece, film grained, best quality."


@pytest.mark.parametrize("name", ["preprocessor_config.json", "processor_config.json"])
def test_emu3_reads_either_processor_file(tmp_path: Path, name: str) -> None:
    """The hub repo's preprocessor_config.json, or a transformers-5 folder's processor_config.json
    (the image processor nested under image_processor)."""
    from harness.models.emu3.bundle import pixel_norm

    norm = {"image_mean": [0.25, 0.5, 0.75], "image_std": [0.5, 0.5, 0.25]}
    body = norm if name == "preprocessor_config.json" else {"image_processor": norm, "processor_class": "Emu3Processor"}
    (tmp_path / name).write_text(__import__("json").dumps(body))
    assert pixel_norm(str(tmp_path)) == ((0.25, 0.5, 0.75), (0.5, 0.5, 0.25))
    (tmp_path / name).unlink()
    with pytest.raises(WeightsError, match="neither preprocessor_config.json nor processor_config.json"):
        pixel_norm(str(tmp_path))


def test_emu3_drafter_is_the_same_model_at_half_the_grid(bundle: ModelBundle) -> None:
    """The MuLo-SD drafter: the same weights at 4x4, its own header ("4*4"); greedy equals
    transformers' generate at that size too."""
    drafter = bundle.drafter
    assert drafter.hf is bundle.target.hf and drafter.grid == (4, 4) and bundle.target.grid == (8, 8)
    low = ModelBundle(name="low", target=drafter, conditioner=bundle.conditioner)
    models = guided(low, GREEDY)
    ours = RasterDecoder(GREEDY).generate(models, models.condition(PROMPTS[:2]), [0, 1]).tokens
    for row, prompt in zip(ours.tolist(), PROMPTS[:2]):
        assert row == _reference(low, prompt, 3.0), prompt


def _sequence(bundle: ModelBundle, prompt: str, codes: torch.Tensor) -> tuple[torch.Tensor, int]:
    """transformers' input ids [1, L + rows * (cols + 1)]: text, header, the codes' vocabulary ids
    with an end-of-row token after every row; and L."""
    tok, model = bundle.conditioner.tokenizer, bundle.target
    rows, cols = model.grid
    prefix = torch.tensor([tok.text([prompt])[0] + tok.header(model.grid)])
    image = torch.cat([model.code_ids[codes].view(rows, cols), torch.full((rows, 1), tiny.EOL)], 1)
    return torch.cat([prefix, image.view(1, -1)], 1), prefix.shape[1]


@torch.inference_mode()
def test_emu3_cached_forward_equals_the_full_forward(bundle: ModelBundle) -> None:
    """Teacher-forced logits of the harness (prefill + one wide forward over the image, end-of-row
    tokens run inside it) equal transformers' forward of the whole sequence at the image code ids;
    overwriting positions (rollback) and an explicit slot-causal mask change nothing."""
    model, cond = bundle.target, bundle.condition(PROMPTS[:1])
    rows, cols = model.grid
    n = rows * cols
    codes = torch.randint(0, model.vocab_size, (1, n), generator=torch.Generator().manual_seed(3))
    ids, length = _sequence(bundle, PROMPTS[0], codes[0])
    full = model.hf(input_ids=ids).logits[0][:, model.code_ids].float()  # [L + rows*(cols+1), V]
    # position i's logits come after input i, or after its row's end-of-row token at a row end
    after = torch.tensor([length - 1] + [length + i + i // cols + int(i % cols == cols - 1) for i in range(n - 1)])
    reference = full[after][None]
    model.setup_cache(1)
    first = model.prefill(cond)
    rest = model.forward(codes[:, :-1], torch.arange(n - 1))
    torch.testing.assert_close(torch.cat([first[:, None], rest], 1), reference, rtol=1e-5, atol=1e-5)
    model.forward(torch.zeros(1, 12, dtype=torch.long), torch.arange(5, 17))  # junk across a row end
    again = model.forward(codes[:, 5:17], torch.arange(5, 17))  # rollback: overwrite
    torch.testing.assert_close(again, rest[:, 5:17], rtol=1e-5, atol=1e-5)
    causal = torch.arange(model.cache_len)[None, None] <= (torch.arange(5, 17) + model.prefix_len)[None, :, None]
    explicit = model.forward(codes[:, 5:17], torch.arange(5, 17), causal)
    torch.testing.assert_close(explicit, rest[:, 5:17], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_emu3_explicit_masks_across_the_end_of_row_slots(bundle: ModelBundle) -> None:
    """A mask that hides a row's last token (position 7) from later queries hides its end-of-row
    token too: their logits do not depend on the token there, while a query that sees it does."""
    model, cond = bundle.target, bundle.condition(PROMPTS[1:2])
    p = model.prefix_len
    codes = torch.randint(0, model.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(4, 16)
    causal = torch.arange(model.cache_len)[None, None] <= (positions + p)[None, :, None]
    hidden = causal.clone()
    hidden[:, 4:, p + 7] = False  # queries at 8.. do not see position 7 (nor, so, its end-of-row token)
    outs = {}
    for name, mask in (("causal", causal), ("hidden", hidden)):
        for token in (3, 40):
            model.setup_cache(1)
            model.prefill(cond)
            model.forward(torch.randint(0, 64, (1, 4), generator=torch.Generator().manual_seed(1)), torch.arange(4))
            tokens = codes.clone()
            tokens[0, 3] = token  # position 7
            outs[name, token] = model.forward(tokens, positions, mask)
    torch.testing.assert_close(outs["hidden", 3][:, 4:], outs["hidden", 40][:, 4:], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(outs["causal", 3][:, 4:], outs["causal", 40][:, 4:], atol=1e-3)
    assert not torch.allclose(outs["hidden", 3][:, 3], outs["hidden", 40][:, 3], atol=1e-3)  # 7's own query


@pytest.mark.parametrize("at", [3, 7])
def test_emu3_scratch_slots_and_move_cache_equal_direct_writes(bundle: ModelBundle, at: int) -> None:
    """7: a row's last position, with its end-of-row twin (tests/backbone_contract.py)."""
    check_scratch_node(bundle.target, bundle.condition(PROMPTS[1:2]), at)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0, cfg_scale=3.0)])
def test_emu3_batch_of_one_equals_batch_of_three(bundle: ModelBundle, params: SamplingParams) -> None:
    check_rows_independent(bundle, params, PROMPTS, [4, 5, 6])


def _decoder(name: str):
    cfg = compose_cfg([f"decoder=[{name}]", "model=emu3_tiny", "sampling.temperature=0.0"])
    return _build(cfg.decoder[name])


@pytest.mark.parametrize("name", ["sjd", "sjd_pac"])
def test_emu3_speculative_greedy_equals_raster(bundle: ModelBundle, name: str) -> None:
    greedy_equals_raster(bundle, _decoder(name), PROMPTS, [0, 1, 2])


@torch.inference_mode()
def test_emu3_decode_and_encode_shapes(bundle: ModelBundle) -> None:
    model = bundle.target
    images = model.decode(torch.randint(0, model.vocab_size, (2, 64)))
    assert images.shape == (2, 3, 64, 64) and images.dtype == torch.uint8 and images.float().std() > 0
    assert model.encode(images).shape == (2, 64)
    assert bundle.drafter.decode(torch.randint(0, 64, (1, 16))).shape == (1, 3, 32, 32)
    with pytest.raises(ValueError, match="64x64"):
        model.encode(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_emu3_condition_rows_and_the_negative_prompt(bundle: ModelBundle) -> None:
    cond = bundle.condition(PROMPTS[:2]).with_null()
    ids, keep = cond.rows((8, 8))
    header = list(cond.header((8, 8)))
    assert header == [tiny.BOI, tiny.DIGIT0 + 8, tiny.STAR, tiny.DIGIT0 + 8, tiny.WRAPPER]
    negative = bundle.conditioner.tokenizer.text(["lowres blurry"])[0]
    for row in range(4):
        real = ids[row][keep[row]].tolist()
        if row < 2:
            assert real == bundle.conditioner.tokenizer.text([PROMPTS[row]])[0] + header
        else:
            assert real == negative and ids.shape[1] == bundle.target.prefix_len
    with pytest.raises(ValueError, match="model.prompt_slots=16"):
        bundle.condition([" ".join(["word"] * 20)])


def test_emu3_strict_reload_from_a_saved_folder(bundle: ModelBundle, tmp_path: Path) -> None:
    bundle.target.hf.save_pretrained(tmp_path / "emu3")
    (tmp_path / "emu3" / "preprocessor_config.json").write_text('{"image_mean": [0.5, 0.5, 0.5], '
                                                               '"image_std": [0.5, 0.5, 0.5]}')
    save_head(bundle.target.eagle_head, tmp_path / "head.safetensors", dtype=torch.float32)
    local = ["model.random_init=false", f"model.local_dir={tmp_path / 'emu3'}",
             f"model.eagle_head_file={tmp_path / 'head.safetensors'}"]
    loaded = _tiny(local)
    sa, sb = bundle.target.state_dict(), loaded.target.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert loaded.drafter.hf is loaded.target.hf
    from safetensors.torch import load_file, save_file

    file = tmp_path / "emu3" / "model.safetensors"
    state = load_file(str(file))
    state["model.surprise.weight"] = torch.zeros(1)
    del state["text_model.model.norm.weight"]  # the repo layout save_pretrained writes
    save_file(state, str(file), metadata={"format": "pt"})
    with pytest.raises(Exception) as err:  # Hydra wraps the loader's WeightsError
        _tiny(local)
    assert isinstance(err.value.__cause__, WeightsError)
    assert "unexpected keys [model.surprise.weight]" in str(err.value)
    assert "missing keys [model.text_model.norm.weight]" in str(err.value)


def test_emu3_configs_plan_mulo_sd_and_refuse_eagle_heads() -> None:
    from harness.preflight import plan

    jobs = plan(compose_cfg(["model=emu3_gen", "decoder=[mulo_sd,eagle2,sjd,sjd_pac,raster]", "incompatible=skip"]))
    assert sorted(jobs.decoders) == ["mulo_sd", "raster", "sjd", "sjd_pac"]
    assert "eagle_head" in jobs.skipped["eagle2"]
    off = plan(compose_cfg(["model=emu3_gen", "model.drafter=false", "decoder=[mulo_sd,raster]",
                            "incompatible=skip"]))
    assert off.decoders == ["raster"] and "drafter" in off.skipped["mulo_sd"]
    with pytest.raises(Exception, match="model.drafter_size=24 must divide model.target_size=64"):
        _tiny(["model.drafter_size=24"])
    with pytest.raises(Exception, match="model.target_size=60: Emu3 image sides are positive multiples of 8"):
        _tiny(["model.target_size=60"])


def test_emu3_fetch_lists_the_repo() -> None:
    from harness.assets.fetching import model_assets

    assets = model_assets(compose_cfg(["model=emu3_gen"]).model)
    assert [a.repo for a in assets] == ["BAAI/Emu3-Gen-hf"]
    assert all("*.safetensors" in a.patterns and "preprocessor_config.json" in a.patterns for a in assets)
    assert model_assets(compose_cfg(["model=emu3_gen", "model.local_dir=/x"]).model) == []
    assert model_assets(compose_cfg(["model=emu3_tiny"]).model) == []


def test_emu3_gen_sized_config_gives_the_720px_grid() -> None:
    """The Emu3-Gen layout (transformers' Emu3Config defaults: the 8B text model, the 32768-code VQ
    model with 8x downsampling; built on the meta device, a vocabulary map of the same size): 90x90
    tokens at 720 px with an end-of-row slot per row, the drafter 45x45 at 360 px."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from harness.models.emu3.model import Emu3ImageModel

    first = 151854  # an offset of the visual tokens in a 184622-token vocabulary (the map is read as given)
    vocab = {tiny.visual_token(c): first + c for c in range(32768)} | {"<|extra_200|>": 151846, "<image>": 151847}
    with torch.device("meta"):
        hf = Emu3ForConditionalGeneration(Emu3Config(vocabulary_map=vocab))
    target, drafter = Emu3ImageModel(hf, (90, 90), 256, 9), Emu3ImageModel(hf, (45, 45), 256, 9)
    assert target.vocab_size == 32768 and target.image_size == 720 and drafter.image_size == 360
    assert target.cache_len == 265 + 8100 and target.map.slots == 265 + 90 * 91 - 1 and len(target.layers) == 32
    assert target.code_ids[5].item() == first + 5 and target.eol_id == 151846


@pytest.mark.slow
def test_emu3_tiny_runs_through_the_cli(tmp_path: Path) -> None:
    """`python -m harness model=emu3_tiny` with the decoders Emu3 can run: images, stats, summary."""
    import os
    import subprocess
    import sys

    import pandas as pd
    from PIL import Image

    from tests.conftest import ROOT

    out, decoders = tmp_path / "run", ["raster", "sjd", "sjd_pac", "scd", "gsd", "zipar", "mulo_sd"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    args = ["model=emu3_tiny", f"decoder=[{','.join(decoders)}]", "dataset_limit=2", "batch_size=2",
            "warmup_batches=0", "threads=1", "device=cpu", f"hydra.run.dir={out}"]
    res = subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary[summary.metric == "latency_s"].decoder) == set(decoders)
    for dec in decoders:
        pngs = sorted((out / "samples" / dec).rglob("*.png"))
        assert len(pngs) == 2 and Image.open(pngs[0]).size == (64, 64)
