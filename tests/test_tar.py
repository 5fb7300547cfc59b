"""Tar: official key layouts (AR-DTok, TA-Tok decode path), strict save/reload through the real
loader, checkpoint-args checks, TA-Tok code embedding, zero-feature CFG null condition."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.models.condition import TextCondition
from harness.models.eagle_head import save_head
from harness.models.gpt import GPT
from harness.models.hub import WeightsError
from harness.models.tar.bundle import ar_dtok_config, check_ar_args
from harness.models.tar.llm import TinyCodeLM, parse_codes
from harness.models.tar.tatok import TATokCodeEmbedding, TATokConfig
from harness.run import _build
from tests.conftest import compose_cfg
from tests.official_keys import diff, keys_of, recorded


@pytest.mark.parametrize("px", [256, 512, 1024])
def test_full_size_ar_dtok_keys_equal_the_official_fixture(px: int) -> None:
    with torch.device("meta"):
        gpt = GPT(ar_dtok_config(px // 16, {}))
    assert diff(keys_of(gpt), recorded(f"tar_ar_dtok_lp_{px}px.txt")) == ""


def test_full_size_tatok_decode_keys_equal_the_official_fixture() -> None:
    with torch.device("meta"):
        module = TATokCodeEmbedding()
    assert diff(keys_of(module), recorded("tar_ta_tok_decode.txt")) == ""


def _tiny(overrides: list[str] | None = None):
    cfg = compose_cfg(["model=tar_tiny", *(overrides or [])])
    return cfg, _build(cfg.model, drop=("name", "sampling"))


def _ar_file(gpt: GPT) -> dict:
    c = gpt.cfg
    args = {"vocab_size": c.vocab_size, "cls_token_num": c.prefix_len, "max_seq_len": c.n_tokens,
            "model_type": "clip_cond", "cond_dim": c.caption_dim}
    return {"model": {"name": "llama-abs-LP", "args": args, "sd": gpt.state_dict()}}


def _save_official(bundle, cfg, folder: Path) -> None:
    """Write the tiny bundle as Tar releases its files ({'model': {'name', 'args', 'sd'}})."""
    torch.save(_ar_file(bundle.target.gpt), folder / cfg.model.target_file)
    torch.save(_ar_file(bundle.drafter.gpt), folder / cfg.model.drafter_file)
    torch.save(_ar_file(bundle.small_drafter.gpt), folder / cfg.model.small_drafter_file)
    tatok = bundle.conditioner.tatok
    sd = dict(tatok.state_dict())
    sd["encoder.vision_model.post_layernorm.weight"] = torch.ones(3)  # the encoder half, not used
    sd["bottleneck.in_linear.weight"] = torch.ones(3, 3)
    regularizer = {"name": "simvq", "args": {"codebook_size": tatok.cfg.codebook_size, "l2_normalized": True}}
    bottleneck = {"bottleneck_dim": tatok.cfg.bottleneck_dim, "regularizer": regularizer}
    args = {"bottleneck": {"name": "bottleneck", "args": bottleneck}, "decoder_depth": tatok.cfg.layers}
    torch.save({"model": {"args": args, "sd": sd}}, folder / cfg.model.tatok_file)
    torch.save({"model": bundle.target.tokenizer.state_dict()}, folder / cfg.model.vq_file)
    save_head(bundle.eagle_head, folder / cfg.model.eagle_head_file, dtype=torch.float32)  # a trained head


@torch.inference_mode()
def test_tiny_official_files_reload_strictly_through_the_loader(tmp_path: Path) -> None:
    cfg, random = _tiny()
    _save_official(random, cfg, tmp_path)
    _, loaded = _tiny(["model.random_init=false", f"model.local_dir={tmp_path}", "model.seed=7"])
    for a, b in [(random.target, loaded.target), (random.drafter, loaded.drafter),
                 (random.small_drafter, loaded.small_drafter), (random.eagle_head, loaded.eagle_head),
                 (random.conditioner.tatok, loaded.conditioner.tatok)]:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    cond = loaded.condition(["a red cube"])
    assert cond.features.shape == (1, 9, 32)
    loaded.target.setup_cache(1)
    random.target.setup_cache(1)
    torch.testing.assert_close(loaded.target.prefill(cond), random.target.prefill(cond))


def test_unknown_tatok_keys_are_reported(tmp_path: Path) -> None:
    cfg, random = _tiny()
    _save_official(random, cfg, tmp_path)
    obj = torch.load(tmp_path / cfg.model.tatok_file, weights_only=True)
    obj["model"]["sd"]["surprise.weight"] = torch.zeros(1)
    torch.save(obj, tmp_path / cfg.model.tatok_file)
    with pytest.raises(Exception) as err:
        _tiny(["model.random_init=false", f"model.local_dir={tmp_path}"])
    assert "surprise.weight" in str(err.value) and cfg.model.tatok_file in str(err.value)


def test_ar_dtok_args_must_match_the_resolution() -> None:
    cfg = ar_dtok_config(32, {})
    assert check_ar_args({"max_seq_len": 1024, "cls_token_num": 729}, cfg, Path("x.pth")) == 1752
    with pytest.raises(WeightsError, match="x.pth.*max_seq_len: file 256 vs config 1024"):
        check_ar_args({"max_seq_len": 256, "cls_token_num": 729}, cfg, Path("x.pth"))


@torch.inference_mode()
def test_tatok_code_embedding_shapes_and_normalised_codes() -> None:
    torch.manual_seed(0)
    cfg = TATokConfig(codebook_size=50, bottleneck_dim=8, hidden=16, layers=1, heads=2, mlp=32, pos_table=16)
    module = TATokCodeEmbedding(cfg).eval()
    codes = torch.randint(0, 50, (2, 9))
    assert module(codes).shape == (2, 9, 16)
    torch.testing.assert_close(module.code_vectors(codes).norm(dim=-1), torch.ones(2, 9))
    pos = module.decoder.vision_model.positions(4)  # the learned 4x4 table at its own size is itself
    torch.testing.assert_close(pos, module.decoder.vision_model.embeddings.position_embedding.weight)
    assert module.decoder.vision_model.positions(3).shape == (9, 16)
    with pytest.raises(ValueError, match="square"):
        module(torch.zeros(1, 8, dtype=torch.long))


@torch.inference_mode()
def test_null_condition_is_zero_features_through_clip_proj() -> None:
    torch.manual_seed(0)
    gpt = GPT(ar_dtok_config(2, {"dim": 16, "n_layer": 1, "n_head": 2, "cond_dim": 8, "prefix_len": 4,
                                 "vocab_size": 16, "multiple_of": 16})).eval()
    assert gpt.abs_pe.shape == (1, 4 + 4 - 1, 16)
    feats = torch.randn(1, 4, 8)
    null = gpt.prefix_embeddings(TextCondition(null=torch.ones(1, dtype=torch.bool), features=feats))
    torch.testing.assert_close(null, gpt.clip_proj.bias.expand(1, 4, 16))
    gpt.setup_cache(1)
    gpt.prefill(TextCondition(null=torch.zeros(1, dtype=torch.bool), features=feats))
    logits = gpt.forward_cached(torch.tensor([[1, 2, 3, 4]]), torch.arange(4))  # last slot: past abs_pe
    assert logits.shape == (1, 4, 16) and torch.isfinite(logits).all()


def test_codes_parsing_and_tiny_code_lm_are_deterministic() -> None:
    assert parse_codes("<im_start><S0><I5><I17>x<I3>", 5) == [5, 17, 3, 0, 0]
    assert parse_codes("<I1><I2><I3>", 2) == [1, 2]
    lm = TinyCodeLM(codebook_size=100, seq_len=9, seed=1)
    a, b = lm(["a cat", "a dog"]), lm(["a dog"])
    assert a.shape == (2, 9) and torch.equal(a[1], b[0]) and not torch.equal(a[0], a[1])


def test_llm_draw_seeds_per_image_and_shared_per_prompt() -> None:
    """TarLLM's seeding, without transformers: per image from the image's seed, shared from the prompt."""
    from harness.models.tar.llm import draw_seeds

    prompts = ["a cat"] * 4 + ["a dog"]
    seeds = [11, 12, 13, 14, 11]
    per_image = draw_seeds("per_image", 0, prompts, seeds)
    assert len(set(per_image[:4])) == 4 and per_image[4] == per_image[0]  # the image seed decides
    assert draw_seeds("per_image", 0, prompts[:1], [12]) == per_image[1:2]  # not the batch
    shared = draw_seeds("shared_per_prompt", 0, prompts, seeds)
    assert len(set(shared[:4])) == 1 and shared[4] != shared[0]
    assert draw_seeds("per_image", 0, prompts, None) == shared  # no image seeds: the prompt's draw
    with pytest.raises(ValueError, match="5 prompts but 2 image seeds"):
        draw_seeds("per_image", 0, prompts, [1, 2])


@pytest.mark.parametrize("draws", ["per_image", "shared_per_prompt"])
def test_the_four_images_of_a_prompt_get_their_own_llm_samples(draws: str) -> None:
    """The generate path hands the images' seeds to Tar's LLM stage (model=tar_tiny's TinyCodeLM):
    under `per_image` (Tar's evaluation scripts) the four images of a prompt are conditioned on four
    LLM samples, under `shared_per_prompt` on one; the codes depend only on (seed, prompt id, image
    index)."""
    from baselines.methods.raster import RasterDecoder
    from harness.api import Prompt, SamplingParams
    from harness.generate import Job, Stopwatch, _decode
    from harness.run import guided
    from harness.store.conditions import ConditionCache
    from harness.store.samples import plan

    cfg, bundle = _tiny([f"model.llm.draws={draws}"])
    params = SamplingParams(cfg_scale=4.0)
    seen: list[torch.Tensor] = []
    llm = bundle.conditioner.llm

    def recording(prompts, seeds=None):  # type: ignore[no-untyped-def]
        codes = llm(prompts, seeds)
        seen.append(codes)
        return codes

    bundle.conditioner.llm = recording
    job = Job(name="raster", decoder=RasterDecoder(params), models=guided(bundle, params),
              sample_set=None)  # type: ignore[arg-type]
    prompts = [Prompt(id="t/0", text="a red cube"), Prompt(id="t/1", text="a blue ball")]
    specs = plan(prompts, 4, 7)
    _decode(job, specs, Stopwatch(torch.device("cpu")), ConditionCache())
    # images 0, 1 of prompt t/1 alone, drawn again (a fresh condition cache: no stored entry)
    _decode(job, specs[4:6], Stopwatch(torch.device("cpu")), ConditionCache())
    codes, again = seen
    for first in (0, 4):
        distinct = {tuple(row.tolist()) for row in codes[first:first + 4]}
        assert len(distinct) == (4 if draws == "per_image" else 1), draws
    assert not torch.equal(codes[0], codes[4])
    assert torch.equal(again, codes[4:6])
