"""Lumina-mGPT: the Chameleon LM against transformers' Chameleon, strict loading, the official header
and end-of-row layout, greedy decoding against a reference generator that follows Lumina-mGPT's
(commit 104abe4: `lumina_mgpt/inference_solver.py` with its CFG, candidate and top-k processors,
`lumina_mgpt/data/item_processor.py`), batch independence, SJD, draft-tree scratch slots and greedy
SJD-PAC, and the VQGAN's key layout."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file
from torch import Tensor

from baselines.framework.acceptance import ExactRule
from baselines.framework.drafts import JacobiDraft
from baselines.framework.speculative import SpeculativeDecoder
from baselines.methods.raster import RasterDecoder
from harness.api import ConfigValueError, SamplingParams
from harness.checks import build_decoder
from harness.models.hub import WeightsError
from harness.models.lumina.bundle import VQGAN_CKPT, VQGAN_YAML, load_lm, vocabulary
from harness.models.lumina.chameleon import ChameleonArch, ChameleonLM
from harness.models.lumina.layout import SpecialTokens, check_header, header
from harness.models.lumina.vqgan import VQGAN, VQGANConfig, load_vqgan
from harness.models.masks import attention_mask
from harness.run import _build, guided
from harness.models.eagle_head import save_head
from tests.backbone_contract import check_rows_independent, check_scratch_node, greedy_equals_raster
from tests.conftest import compose_cfg

TINY_ARCH = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
GREEDY = SamplingParams(temperature=0.0, cfg_scale=3.0)


def _tiny(overrides: list[str] | None = None):
    cfg = compose_cfg(["model=lumina_tiny", *(overrides or [])])
    return cfg, _build(cfg.model, drop=("name", "sampling"))


def _refusal(overrides: list[str]) -> BaseException:
    """The error that building the model config refuses with (Hydra wraps it; the cause is ours)."""
    cfg = compose_cfg(overrides)
    with pytest.raises(Exception) as caught:  # noqa: PT011 - unwrapped below
        _build(cfg.model, drop=("name", "sampling"))
    err: BaseException = caught.value
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def _randomise(lm: ChameleonLM, seed: int) -> ChameleonLM:
    """Random values everywhere, the q/k norms' affines included (the default init leaves them 1, 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lm.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return lm


def _hf_twin(lm: ChameleonLM):
    """transformers' ChameleonForConditionalGeneration with the weights of `lm` (mainline keeps one
    q/k-norm affine per head: the shard's affine repeated)."""
    transformers = pytest.importorskip("transformers")
    a = lm.arch
    cfg = transformers.ChameleonConfig(
        vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_hidden_layers, num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads, rms_norm_eps=a.rms_norm_eps, rope_theta=a.rope_theta,
        vocabulary_map={"<image>": a.vocab_size - 1}, attn_implementation="eager",
        vq_config={"embed_dim": 8, "num_embeddings": 16, "latent_channels": 8, "base_channels": 32,
                   "channel_multiplier": [1, 2], "resolution": 16, "attn_resolutions": None})
    hf = transformers.ChameleonForConditionalGeneration(cfg).eval()
    state = {}
    for k, v in lm.state_dict().items():
        if ".q_norm." in k:
            v = v.repeat_interleave(a.num_attention_heads // v.shape[0], 0)
        elif ".k_norm." in k:
            v = v.repeat_interleave(a.num_key_value_heads // v.shape[0], 0)
        state[k] = v
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("model.vqmodel.") for k in missing), (missing, unexpected)
    return hf


@torch.inference_mode()
def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    """Last-position logits [V] of transformers' Chameleon over the full vocabulary (the model body and
    lm_head: the mainline forward masks image logits)."""
    hidden = hf.model(input_ids=torch.tensor([ids])).last_hidden_state
    return hf.lm_head(hidden)[0, -1].float()


@torch.inference_mode()
def test_lumina_lm_logits_equal_transformers_chameleon() -> None:
    lm = _randomise(ChameleonLM(ChameleonArch(**TINY_ARCH)), 0).eval()
    hf = _hf_twin(lm)
    ids = torch.randint(0, 299, (2, 11), generator=torch.Generator().manual_seed(1))
    hidden_hf = hf.model(input_ids=ids).last_hidden_state
    hidden = lm.hidden(ids, torch.arange(11).expand(2, -1))
    torch.testing.assert_close(hidden, hidden_hf, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lm.logits(hidden), hf.lm_head(hidden_hf).float(), atol=1e-5, rtol=1e-5)
    # the cached forward, token by token through the static cache, gives the same logits
    lm.setup_cache(2, 11)
    causal = torch.ones(11, 11).tril().bool()
    steps = [lm.hidden(ids[:, i:i + 1], torch.tensor([[i], [i]]), causal[i:i + 1].expand(2, 1, 11),
                       torch.tensor([[i], [i]])) for i in range(11)]
    torch.testing.assert_close(torch.cat(steps, 1), hidden_hf, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_lumina_bf16_keeps_qk_norm_and_rotary_in_float32() -> None:
    """Under bf16 the q/k LayerNorm (with its affine) and the rotation compute in float32, as
    Lumina-mGPT's bf16 run under autocast does; the bf16-only computation would round them."""
    from harness.models.lumina.chameleon import rope_cos_sin, rotate

    lm = _randomise(ChameleonLM(ChameleonArch(**TINY_ARCH)), 3).eval().to(torch.bfloat16)
    att = lm.model.layers[0].self_attn
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(5).expand(2, -1), att.head_dim, 10000.0, torch.bfloat16)
    q, k = att.rotated_qk(x, cos, sin)
    assert q.dtype == k.dtype == torch.float32

    def reference(proj: torch.nn.Linear, norm, heads: int) -> Tensor:  # float32 from the bf16 projection
        h = proj(x).view(2, 5, heads, att.head_dim).float()
        h = torch.nn.functional.layer_norm(h, (att.head_dim,), eps=1e-5)
        w = norm.weight.float().repeat_interleave(norm.per_shard, 0)
        b = norm.bias.float().repeat_interleave(norm.per_shard, 0)
        return rotate((h * w + b).transpose(1, 2), cos.float(), sin.float())

    q_ref, k_ref = reference(att.q_proj, att.q_norm, att.heads), reference(att.k_proj, att.k_norm, att.kv_heads)
    torch.testing.assert_close(q, q_ref, atol=0, rtol=0)
    torch.testing.assert_close(k, k_ref, atol=0, rtol=0)
    # the same ops in bf16 throughout round differently: the float32 path is not a no-op
    h = att.q_proj(x).view(2, 5, att.heads, att.head_dim)
    h = torch.nn.functional.layer_norm(h, (att.head_dim,), eps=1e-5)
    h = h * att.q_norm.weight.repeat_interleave(att.q_norm.per_shard, 0) + att.q_norm.bias.repeat_interleave(
        att.q_norm.per_shard, 0)
    assert not torch.equal(rotate(h.transpose(1, 2), cos, sin).float(), q)
    # a bf16 forward still returns bf16 hidden states (attention and MLP in the model's dtype)
    assert lm.hidden(torch.randint(0, 299, (1, 4)), torch.arange(4)[None]).dtype == torch.bfloat16


def test_lumina_full_size_keys_equal_transformers_chameleon() -> None:
    """The 7B LM's key names and shapes are transformers' (but the q/k norms: one affine per shard,
    as Lumina-mGPT's fork stores them, where mainline keeps one per head); the VQGAN's encoder half
    is transformers' ChameleonVQVAE at Chameleon's sizes, key for key."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

    with torch.device("meta"):
        hf = transformers.ChameleonForConditionalGeneration(transformers.ChameleonConfig(vocabulary_map={"<image>": 8711}))
        hf_vq = ChameleonVQVAE(transformers.ChameleonVQVAEConfig())
        lm, vq = ChameleonLM(ChameleonArch()), VQGAN(VQGANConfig())
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items() if not k.startswith("model.vqmodel.")}
    ours = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    assert theirs.keys() == ours.keys()
    differ = {k for k in ours if ours[k] != theirs[k]}
    assert differ == {k for k in ours if ".q_norm." in k or ".k_norm." in k}
    assert all(ours[k] == (1, 128) and theirs[k] == (32, 128) for k in differ)
    encoder_half = {k: tuple(v.shape) for k, v in vq.state_dict().items() if not k.startswith("decoder.")}
    assert encoder_half == {k: tuple(v.shape) for k, v in hf_vq.state_dict().items()}


def _save_lm_folder(lm: ChameleonLM, folder: Path, state: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    a = lm.arch
    config = {"model_type": "chameleon", "vocab_size": a.vocab_size, "hidden_size": a.hidden_size,
              "intermediate_size": a.intermediate_size, "num_hidden_layers": a.num_hidden_layers,
              "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_key_value_heads,
              "rms_norm_eps": a.rms_norm_eps, "rope_theta": a.rope_theta, "model_parallel_size": 1,
              "swin_norm": False, "rope_scaling": None}
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state if state is not None else {k: v.contiguous() for k, v in lm.state_dict().items()},
              str(folder / "model.safetensors"))
    return folder


def test_lumina_strict_loading_names_a_missing_or_extra_key(tmp_path: Path) -> None:
    lm = _randomise(ChameleonLM(ChameleonArch(**TINY_ARCH)), 2)
    state = {k: v.contiguous() for k, v in lm.state_dict().items()}
    # transformers' VQGAN encoder keys inside a checkpoint are dropped by name; the rest loads exactly
    loaded = load_lm(_save_lm_folder(lm, tmp_path / "ok", {**state, "model.vqmodel.encoder.conv_in.weight":
                                                          torch.zeros(2)}), torch.float32)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    short = {k: v for k, v in state.items() if k != "model.layers.1.self_attn.k_norm.bias"}
    with pytest.raises(WeightsError, match=r"missing keys \[model\.layers\.1\.self_attn\.k_norm\.bias\]"):
        load_lm(_save_lm_folder(lm, tmp_path / "missing", short), torch.float32)
    extra = {**state, "model.layers.0.self_attn.q_norm.gamma": torch.zeros(16)}
    with pytest.raises(WeightsError, match=r"unexpected keys \[model\.layers\.0\.self_attn\.q_norm\.gamma\]"):
        load_lm(_save_lm_folder(lm, tmp_path / "extra", extra), torch.float32)
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    (tmp_path / "ok" / "config.json").write_text(json.dumps({**config, "swin_norm": True}))
    with pytest.raises(ConfigValueError, match="swin_norm"):
        load_lm(tmp_path / "ok", torch.float32)


def test_lumina_header_follows_the_official_resolution_tokens() -> None:
    chameleon = SpecialTokens()
    # item_processor: <racm3:break> <reserved{8800 + h/32}> <reserved{8800 + w/32}>, id = 8804 + n
    assert header(chameleon, 512, 512) == [8197, 8820, 8820]
    assert header(chameleon, 768, 768) == [8197, 8828, 8828]
    assert header(chameleon, 1024, 512) == [8197, 8820, 8836]  # height first
    check_header(chameleon, [8197, 8836, 8836], (64, 64))
    with pytest.raises(ValueError, match="32x64 token grid"):
        check_header(chameleon, header(chameleon, 1024, 512), (64, 32))  # width and height swapped
    with pytest.raises(ValueError, match="16x16 token grid"):
        check_header(chameleon, [8197, 8812, 8812], (32, 32))  # units of 16 px instead of 32
    # the vocabulary map of a checkpoint gives the same ids and each code's vocabulary id
    vmap = {"<racm3:break>": 8197, "<eoss>": 8196, "<reserved08799>": 8803, "<reserved08706>": 8710,
            "<reserved08800>": 8804, "IMGIMGAZ": 4, "IMGIMGBZ": 5, "IMGIMGCZ": 7, "IMGIMGDZ": 6}
    tokens, order = vocabulary({"vocabulary_map": vmap}, SpecialTokens(codes=4), "config.json")
    assert order == [4, 5, 7, 6] and tokens.new_line == 8803 and tokens.size_base == 8804
    refused = _refusal(["model=lumina_tiny", "model.target_size=1024", "model.drafter_size=768"])
    assert isinstance(refused, ConfigValueError) and "model.drafter_size=768" in str(refused)


@torch.inference_mode()
def _reference_greedy(hf, prompt_ids: list[int], tokens: SpecialTokens, grid: tuple[int, int], size: int,
                      cfg: float) -> torch.Tensor:
    """Greedy generation as Lumina-mGPT's FlexARInferenceSolver: the prompt, the header, then at each
    step the conditional logits of the whole sequence and the unconditional logits of the sequence
    from <image-start> on (a second context), mixed as cfg * (c - u) + u over the full vocabulary;
    <eol> forced when (tokens after the header + 1) % (cols + 1) == 0, else every non-image id
    suppressed; the argmax is the next token (no cache: the sequence is recomputed each step)."""
    rows, cols = grid
    seq = prompt_ids + header(tokens, size, size)
    start = len(prompt_ids)
    image = torch.arange(tokens.first_code, tokens.first_code + tokens.codes)
    codes: list[int] = []
    while len(codes) < rows * cols:
        if (len(seq) - start - 3 + 1) % (cols + 1) == 0:
            seq.append(tokens.new_line)
            continue
        c, u = _hf_logits(hf, seq), _hf_logits(hf, seq[start:])
        mixed = cfg * (c - u) + u
        allowed = torch.full_like(mixed, float("-inf"))
        allowed[image] = mixed[image]
        nxt = int(allowed.argmax())
        seq.append(nxt)
        codes.append(nxt - tokens.first_code)
    return torch.tensor(codes)


def _randomised_tiny():
    cfg, bundle = _tiny()
    for model in (bundle.target, bundle.drafter):
        _randomise(model.lm, 7)
    return cfg, bundle


def test_lumina_greedy_raster_equals_the_official_generator() -> None:
    cfg, bundle = _randomised_tiny()
    hf = _hf_twin(bundle.target.lm)
    prompts = ["a red cube on a table", "two dogs"]
    gen = RasterDecoder(GREEDY).generate(guided(bundle, GREEDY), bundle.condition(prompts), [0, 1])
    for row, prompt in enumerate(prompts):
        ids = bundle.conditioner.prompt_ids(prompt, 64, 64)
        ref = _reference_greedy(hf, ids, bundle.target.tokens, bundle.target.grid, 64, GREEDY.cfg_scale)
        assert torch.equal(gen.tokens[row].cpu(), ref), (prompt, gen.tokens[row], ref)
    assert len(set(gen.tokens.flatten().tolist())) > 3, "a constant image would make the check vacuous"


def test_lumina_batch_rows_equal_single_rows() -> None:
    _, bundle = _randomised_tiny()
    check_rows_independent(bundle, SamplingParams(temperature=1.0, top_k=20, cfg_scale=3.0),
                           ["a cat", "a much longer prompt about a lighthouse at dusk"], [3, 4])


@torch.inference_mode()
def test_lumina_explicit_masks_map_onto_the_slots() -> None:
    _, bundle = _randomised_tiny()
    model, cond = bundle.target, bundle.condition(["a lighthouse"])
    tokens = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(16)

    def run(*steps: tuple[Tensor, Tensor | None]) -> Tensor:
        model.setup_cache(1)
        model.prefill(cond)
        return [model(tokens[:, pos], pos, mask) for pos, mask in steps][-1]

    causal = attention_mask(positions + model.prefix_len, model.cache_len)[None]
    whole = run((positions, None))
    torch.testing.assert_close(run((positions, causal)), whole)
    # any forward width: one token at a time, or windows across row ends, write and read the same
    model.setup_cache(1)
    model.prefill(cond)
    windows = [positions[:1], positions[1:7], positions[7:8], positions[8:16]]
    torch.testing.assert_close(torch.cat([model(tokens[:, w], w) for w in windows], 1), whole)
    # an island mask that hides row 0 hides its end-of-row token too: whether row 0 (and its <eol>)
    # was written before or never, row 1 computes the same
    row1 = positions[4:8]
    island = causal[:, 4:8].clone()
    island[..., model.prefix_len:model.prefix_len + 4] = False
    after_row0 = run((positions[:4], None), (row1, island))
    alone = run((row1, island))
    torch.testing.assert_close(after_row0, alone)
    assert not torch.allclose(after_row0, run((positions[:4], None), (row1, None)))  # row 0 matters when seen


def test_lumina_mulo_sd_runs_with_the_low_resolution_drafter() -> None:
    cfg, bundle = _randomised_tiny()
    assert bundle.drafter.grid == (2, 2) and bundle.target.grid == (4, 4)
    job = compose_cfg(["model=lumina_tiny", "decoder=[mulo_sd]"])
    decoder = build_decoder("mulo_sd", job.decoder.mulo_sd)
    sampling = _build(job.sampling, drop=())
    out = decoder.generate(guided(bundle, sampling), bundle.condition(["a red cube", "a cat"]), [0, 1])
    assert out.tokens.shape == (2, 16) and int(out.tokens.max()) < 64
    assert all(s.drafter_forwards > 0 and s.tokens == 16 for s in out.stats)


def test_lumina_sjd_runs_and_greedy_sjd_equals_raster() -> None:
    _, bundle = _randomised_tiny()
    cond = bundle.condition(["a red cube", "a blue sphere"])
    raster = RasterDecoder(GREEDY).generate(guided(bundle, GREEDY), cond, [0, 1])
    sjd = SpeculativeDecoder(GREEDY, JacobiDraft(window=6, init="random"), ExactRule())
    out = sjd.generate(guided(bundle, GREEDY), cond, [0, 1])
    assert torch.equal(out.tokens, raster.tokens)
    sampled = SamplingParams(temperature=1.0, top_k=20, cfg_scale=3.0)
    run = sjd.__class__(sampled, JacobiDraft(window=6, init="random"), ExactRule()).generate(
        guided(bundle, sampled), cond, [0, 1])
    assert run.tokens.shape == (2, 16) and int(run.tokens.max()) < 64
    assert all(s.target_forwards <= 16 and s.tokens == 16 for s in run.stats)


@pytest.mark.parametrize("at", [2, 3])
def test_lumina_scratch_slots_and_move_cache_equal_direct_writes(at: int) -> None:
    """2: mid-row; 3: a row's last, with its <eol> twin (tests/backbone_contract.py)."""
    _, bundle = _randomised_tiny()
    check_scratch_node(bundle.target, bundle.condition(["a lighthouse"]), at)


def test_lumina_scratch_slots_shape_errors_name_the_scratch() -> None:
    _, bundle = _tiny()
    model = bundle.target
    with pytest.raises(ValueError, match="scratch slots must be an integer >= 0"):
        model.setup_cache(1, scratch=-1)
    model.setup_cache(1, scratch=3)
    model.prefill(bundle.condition(["a cat"]))
    with pytest.raises(ValueError, match="3 scratch"):
        model.forward(torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]),
                      torch.ones(1, 1, model.cache_len, dtype=torch.bool))


def test_lumina_greedy_sjd_pac_equals_raster() -> None:
    _, bundle = _randomised_tiny()
    cfg = compose_cfg(["model=lumina_tiny", "decoder=[sjd_pac]", "sampling.temperature=0.0"])
    decoder = build_decoder("sjd_pac", cfg.decoder.sjd_pac)
    assert decoder.cache_scratch > 0
    greedy_equals_raster(bundle, decoder, ["a red cube", "a blue sphere", "two dogs"], [0, 1, 2])


def _sequence_cache(lm: ChameleonLM, slots: Tensor) -> list[Tensor]:
    """Keys and values [R, H, len(slots), hd] of every layer at cache `slots`."""
    caches = [layer.self_attn.kv_cache for layer in lm.model.layers]
    return [c[:, :, slots].clone() for cache in caches for c in (cache.k_cache, cache.v_cache)]


def test_lumina_sampled_sjd_pac_leaves_the_cache_of_its_tokens() -> None:
    """A sampled SJD-PAC decode whose accepted paths leave the chain through tree nodes (moved from
    scratch slots, <eol> twins included) ends with the cache a teacher-forced forward of its tokens
    writes: every prefix, image and <eol> slot up to the last position (all fed by then)."""
    _, bundle = _randomised_tiny()
    cfg = compose_cfg(["model=lumina_tiny", "decoder=[sjd_pac]", "sampling.temperature=1.0"])
    decoder = build_decoder("sjd_pac", cfg.decoder.sjd_pac)
    models = guided(bundle, decoder.sampling)
    cond = models.condition(["a red cube", "a blue sphere", "two dogs"])
    out = decoder.generate(models, cond, [3, 4, 5])
    assert sum(s.extra["tree_paths"] for s in out.stats) > 0, "no tree node accepted: a vacuous check"
    m = bundle.target.map
    n = m.n_tokens
    slots = torch.cat([torch.arange(m.prefix), m.token_slot(torch.arange(n - 1)),
                       m.eol_slot(torch.arange(m.grid[0] - 1))])
    decoded = _sequence_cache(bundle.target.lm, slots)
    with torch.inference_mode():
        models.target.setup_cache(3)
        models.target.prefill(cond)
        models.target.forward(out.tokens[:, :n - 1], torch.arange(n - 1))
    for got, want in zip(decoded, _sequence_cache(bundle.target.lm, slots)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _save_vqgan(vq: VQGAN, root: Path, drop: str | None = None) -> None:
    (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    c = vq.cfg
    params = {"embed_dim": c.embed_dim, "n_embed": c.n_embed,
              "ddconfig": {"double_z": False, "z_channels": c.z_channels, "resolution": c.resolution,
                           "in_channels": c.in_channels, "out_ch": c.out_ch, "ch": c.ch, "ch_mult": list(c.ch_mult),
                           "num_res_blocks": c.num_res_blocks, "attn_resolutions": list(c.attn_resolutions),
                           "dropout": 0.0},
              "lossconfig": {"target": "taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator"}}
    (root / VQGAN_YAML).write_text(yaml.safe_dump({"model": {"target": "taming.models.vqgan.VQModel",
                                                             "params": params}}))
    state = {k: v for k, v in vq.state_dict().items() if k != drop}
    state["loss.discriminator.main.0.weight"] = torch.zeros(3)  # the GAN loss the release keeps
    torch.save({"state_dict": state}, root / VQGAN_CKPT)


def test_lumina_vqgan_decodes_and_loads_strictly(tmp_path: Path) -> None:
    _, bundle = _tiny()
    vq = bundle.target.tokenizer
    assert "decoder.up.0.block.1.nin_shortcut.weight" not in vq.state_dict()  # same width: no shortcut
    for key in ("encoder.down.4.attn.0.proj_out.weight", "decoder.up.4.upsample.conv.weight",
                "decoder.mid.attn_1.q.weight", "encoder.down.3.downsample.conv.weight", "quantize.embedding.weight",
                "quant_conv.weight", "post_quant_conv.bias", "decoder.up.3.block.0.nin_shortcut.weight",
                "encoder.down.4.block.0.nin_shortcut.weight"):
        assert key in vq.state_dict(), key
    _save_vqgan(vq, tmp_path)
    loaded = load_vqgan(tmp_path / VQGAN_CKPT, tmp_path / VQGAN_YAML, torch.float32, trust_pickle=False)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in vq.state_dict().items())
    codes = torch.randint(0, 64, (2, 4, 3))
    images = loaded.decode(codes)
    assert images.shape == (2, 3, 64, 48) and images.dtype == torch.uint8
    assert loaded.encode(images).shape == (2, 4, 3)
    _save_vqgan(vq, tmp_path / "short", drop="decoder.conv_out.bias")
    with pytest.raises(WeightsError, match=r"missing keys \[decoder\.conv_out\.bias\]"):
        load_vqgan(tmp_path / "short" / VQGAN_CKPT, tmp_path / "short" / VQGAN_YAML, torch.float32, False)


def test_lumina_fetch_lists_the_repos_of_target_and_drafter() -> None:
    from harness.assets.fetching import model_assets

    found = model_assets(compose_cfg(["model=lumina_mgpt_1024", "model.local_dir=chameleon"]).model)
    assert [(a.what.split()[-1], a.repo) for a in found] == [("target", "Alpha-VLLM/Lumina-mGPT-7B-1024"),
                                                            ("drafter", "Alpha-VLLM/Lumina-mGPT-7B-512")]
    assert {"config.json", "*.safetensors", "tokenizer.json"} <= set(found[0].patterns)
    assert model_assets(compose_cfg(["model=lumina_mgpt_512", "model.target_path=copy"]).model) == []
    assert model_assets(compose_cfg(["model=lumina_tiny"]).model) == []


def test_lumina_preflight_knows_which_configs_have_a_drafter() -> None:
    from harness.preflight import decoder_problem, model_parts

    assert "drafter" in model_parts(compose_cfg(["model=lumina_mgpt_1024"]).model)
    job = compose_cfg(["model=lumina_mgpt_512", "decoder=[mulo_sd]"])
    problem = decoder_problem("mulo_sd", job.decoder.mulo_sd, job.model)
    assert problem is not None and "model.drafter_repo and model.drafter_size" in problem


def _save_tokenizer(folder: Path, tokens: SpecialTokens) -> None:
    """A word-level tokenizer with Chameleon's special token names at the tiny stand-in's ids, saved
    as transformers saves a fast tokenizer (the layout of the checkpoint repos)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "Generate an image of 64x64 according to the following prompt: a red cube".split()
    vocab = {"<s>": tokens.bos, "<unk>": 1, "<reserved08706>": tokens.sep, **{w: 256 + i for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<reserved08706>"]})
    assert fast.convert_tokens_to_ids("<reserved08706>") == tokens.sep
    fast.save_pretrained(str(folder))


def test_lumina_tiny_official_files_reload_through_the_loader(tmp_path: Path) -> None:
    cfg, random = _randomised_tiny()
    tokens = random.target.tokens
    letters = "ABCDEFGHIJ"
    vmap = {"<s>": 0, "<racm3:break>": tokens.image_start, "<eoss>": tokens.image_end,
            "<reserved08799>": tokens.new_line, "<reserved08706>": 3, "<reserved08800>": tokens.size_base,
            **{"IMGIMG" + "".join(letters[int(d)] for d in str(c)) + "Z": tokens.first_code + c for c in range(64)}}
    for role, model in (("target", random.target), ("drafter", random.drafter)):
        folder = _save_lm_folder(model.lm, tmp_path / role)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "vocabulary_map": vmap}))
        _save_tokenizer(folder, tokens)
    _save_vqgan(random.target.tokenizer, tmp_path / "chameleon")
    save_head(random.target.eagle_head, tmp_path / "head.safetensors", dtype=torch.float32)
    _, loaded = _tiny(["model.random_init=false", f"model.target_path={tmp_path / 'target'}",
                       f"model.drafter_path={tmp_path / 'drafter'}", f"model.local_dir={tmp_path / 'chameleon'}",
                       "model.byte_tokenizer=null", "model.seed=5",
                       f"model.eagle_head_file={tmp_path / 'head.safetensors'}"])
    for a, b in [(random.target, loaded.target), (random.drafter, loaded.drafter)]:
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    ids = loaded.conditioner.prompt_ids("a red cube", 64, 64)
    assert ids[0] == 0 and ids[-1] == 3 and 1 not in ids  # bos, every word known, the separator token
    cond = loaded.condition(["a red cube"])
    for model in (loaded.target, random.target):
        model.setup_cache(1)
    torch.testing.assert_close(loaded.target.prefill(cond), random.target.prefill(cond))
    codes = torch.randint(0, 64, (1, 16))
    assert torch.equal(loaded.target.decode(codes), random.target.decode(codes))


@pytest.mark.parametrize("local_dir", [None, "empty"])
def test_lumina_without_the_vqgan_fails_before_loading(tmp_path: Path, local_dir: str | None) -> None:
    err = _refusal(["model=lumina_mgpt_512"] + ([f"model.local_dir={tmp_path}"] if local_dir else []))
    assert isinstance(err, WeightsError), err
    text = str(err)
    assert all(part in text for part in ("Chameleon", "model.local_dir", "tokenizer/vqgan.ckpt",
                                         "tokenizer/vqgan.yaml")), text
    if local_dir:
        assert str(tmp_path / "tokenizer" / "vqgan.ckpt") in text  # names the file it looked for
