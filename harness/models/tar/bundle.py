"""`model=tar_*`: Tar's image generation path. The LLM stage (Qwen2.5, `tar_llm.py`) emits TA-Tok
codes, the TA-Tok code embedding (`tatok.py`) turns them into 729 condition features, AR-DTok
(a LlamaGen-architecture GPT with learned absolute positions) samples LlamaGen VQ-16 tokens at
512 / 1024 px (target) or 256 px (drafter), and the VQ-16 decoder makes pixels.

Weights: `csuhan/TA-Tok` (`ar_dtok_lp_{256,512,1024}px.pth`, `ta_tok.pth`) and
`peizesun/llamagen_t2i` (`vq_ds16_t2i.pt`). Architecture facts (Tar `tok/ar_dtok/ar_model.py`,
`LLAMA_ABS_LP`, `model_type='clip_cond'`): 30 layers, 20 heads, width 1280, SwiGLU hidden a
multiple of 256, condition `clip_proj` Linear(1152 -> 1280, bias) with zero features as the CFG
null condition, `abs_pe` [1, max_seq_len + cls_token_num - 1, 1280], no RoPE, vocabulary 16384.
AR-DTok checkpoints are {'model': {'name', 'args', 'sd'}}; the args are checked against the config.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from harness.api import ModelBundle
from harness.models.eagle_head import attach_head
from harness.models.gpt import GPT, randomise_head
from harness.models.gpt_config import GPTConfig
from harness.models.hub import WeightsError, dtype_of, load_strict, read_checkpoint, resolve, state_dict_of
from harness.models.official_model import OfficialImageModel
from harness.models.tar.llm import CodeGenerator, TarConditioner
from harness.models.vq16 import load_vq, vq_config
from harness.models.tar.tatok import TATokCodeEmbedding, TATokConfig, decode_path_state

log = logging.getLogger(__name__)

TATOK_REPO = "csuhan/TA-Tok"
VQ_REPO = "peizesun/llamagen_t2i"
AR_DTOK_LP = {"dim": 1280, "n_layer": 30, "n_head": 20, "cond_dim": 1152, "prefix_len": 729,
              "vocab_size": 16384}


def ar_dtok_config(grid: int, arch: Mapping[str, Any], pos_embed_len: int | None = None) -> GPTConfig:
    """AR-DTok GPT at a `grid x grid` token grid; `arch` overrides AR_DTOK_LP's sizes."""
    a = {**AR_DTOK_LP, **arch}
    return GPTConfig(vocab_size=a["vocab_size"], grid=(grid, grid), dim=a["dim"], n_layer=a["n_layer"],
                     n_head=a["n_head"], multiple_of=a.get("multiple_of", 256), prefix_len=a["prefix_len"],
                     caption_dim=a["cond_dim"], pos_embed="abs_pe", pos_embed_len=pos_embed_len,
                     cond_embed="linear", norm_eps=a.get("norm_eps", 1e-5), dropout=0.0)


def _ckpt_args(obj: Any) -> dict[str, Any]:
    model = obj.get("model") if isinstance(obj, Mapping) else None
    args = model.get("args") if isinstance(model, Mapping) else None
    return dict(args) if isinstance(args, Mapping) else {}


def check_ar_args(args: Mapping[str, Any], cfg: GPTConfig, path: Path) -> int | None:
    """Compare an AR-DTok checkpoint's own args with the config; return its `abs_pe` length."""
    expected = {"vocab_size": cfg.vocab_size, "cond_dim": cfg.caption_dim, "max_seq_len": cfg.n_tokens}
    wrong = [f"{k}: file {args[k]} vs config {v}" for k, v in expected.items() if k in args and args[k] != v]
    if args.get("model_type", "clip_cond") != "clip_cond":
        wrong.append(f"model_type: file {args['model_type']!r} vs 'clip_cond'")
    if wrong:
        raise WeightsError(f"{path} is not an AR-DTok checkpoint for this config ({'; '.join(wrong)}); "
                           "check the file name / resolution and model.arch")
    if "max_seq_len" in args and "cls_token_num" in args:
        rows = int(args["max_seq_len"]) + int(args["cls_token_num"]) - 1
        if rows < cfg.prefix_len + cfg.n_tokens - 1:
            raise WeightsError(f"{path}: abs_pe has {rows} rows, fewer than {cfg.prefix_len} condition + "
                               f"{cfg.n_tokens} image slots need; lower model.seq_len / arch.prefix_len")
        return rows
    return None


def load_ar_dtok(grid: int, arch: Mapping[str, Any], path: Path | None, dtype: torch.dtype,
                 trust_pickle: bool, seed: int) -> GPT:
    """AR-DTok from an official checkpoint (args checked, strict), or seeded random weights."""
    torch.manual_seed(seed)
    if path is None:
        return randomise_head(GPT(ar_dtok_config(grid, arch)), seed).eval().to(dtype)
    obj = read_checkpoint(path, trust_pickle)
    rows = check_ar_args(_ckpt_args(obj), ar_dtok_config(grid, arch), path)
    gpt = GPT(ar_dtok_config(grid, arch, rows))
    load_strict(gpt, state_dict_of(obj, path, ("model", "sd")), path, f"AR-DTok ({grid}x{grid})")
    log.info("loaded AR-DTok %dx%d from %s", grid, grid, path)
    return gpt.eval().to(dtype)


def tatok_config(base: Mapping[str, Any], args: Mapping[str, Any]) -> TATokConfig:
    """TA-Tok sizes from the config, overridden by the checkpoint's own args when present
    (as Tar's `TextAlignedTokenizer.from_checkpoint` builds the model from them)."""
    cfg = dict(base)
    bottleneck = (args.get("bottleneck") or {}).get("args") or {}
    regular = (bottleneck.get("regularizer") or {}).get("args") or {}
    found = {"bottleneck_dim": bottleneck.get("bottleneck_dim"),
             "codebook_size": regular.get("codebook_size"), "l2_norm": regular.get("l2_normalized"),
             "layers": args.get("decoder_depth")}
    cfg.update({k: v for k, v in found.items() if v is not None})
    return TATokConfig(**cfg)


def load_tatok(base: Mapping[str, Any], path: Path | None, dtype: torch.dtype, trust_pickle: bool,
               seed: int) -> TATokCodeEmbedding:
    """The TA-Tok code embedding from `ta_tok.pth` (decode path, strict), or seeded random weights."""
    torch.manual_seed(seed)
    if path is None:
        return TATokCodeEmbedding(TATokConfig(**base)).eval().to(dtype)
    obj = read_checkpoint(path, trust_pickle)
    module = TATokCodeEmbedding(tatok_config(base, _ckpt_args(obj)))
    state = decode_path_state(state_dict_of(obj, path, ("model", "sd")))
    load_strict(module, state, path, "TA-Tok code embedding")
    return module.eval().to(dtype)


def build(name: str = "tar", tatok_repo: str = TATOK_REPO, target_file: str = "ar_dtok_lp_512px.pth",
          drafter_file: str | None = "ar_dtok_lp_256px.pth", tatok_file: str = "ta_tok.pth",
          vq_repo: str = VQ_REPO, vq_file: str = "vq_ds16_t2i.pt", target_size: int = 512,
          drafter_size: int = 256, arch: dict[str, Any] | None = None, tatok: dict[str, Any] | None = None,
          vq: dict[str, Any] | None = None, local_dir: str | None = None, cache_dir: str | None = None,
          dtype: str = "bf16", vq_dtype: str = "fp32",
          device: str | None = None, trust_pickle: bool = False, random_init: bool = False, seed: int = 0,
          llm: CodeGenerator | None = None, small_drafter_file: str | None = None,
          small_arch: dict[str, Any] | None = None, eagle_head_file: str | None = None,
          eagle_head_config: str | None = None, eagle_head_repo: str | None = None) -> ModelBundle:
    """AR-DTok target at `target_size` px and drafter at `drafter_size` px (null file: none), an
    optional small drafter at the target's size (`small_arch` overrides `arch`; Tar releases none),
    an EAGLE head for the target (`eagle_head_file`: one trained by python -m baselines.training.train_eagle;
    Tar releases none), one VQ-16, and the conditioner (LLM stage `llm` + TA-Tok code embedding).
    `random_init`: seeded random weights in the official layout, no files (tiny test stacks; a named
    head is random too)."""
    if llm is None:
        raise ValueError("model.llm is required (TarLLM for the real model, TinyCodeLM in tests)")
    arch, vcfg = dict(arch or {}), vq_config(vq)
    if llm.seq_len != arch.get("prefix_len", AR_DTOK_LP["prefix_len"]):
        raise ValueError(f"the LLM emits {llm.seq_len} codes but AR-DTok takes {arch.get('prefix_len', 729)}")

    def path(repo: str, file: str) -> Path | None:
        local = None if local_dir is None else str(Path(local_dir).expanduser() / file)
        return None if random_init else resolve(repo, file, local, cache_dir)

    tok = load_vq(vcfg, path(vq_repo, vq_file), dtype_of(vq_dtype), trust_pickle, seed)
    tatok_path = path(tatok_repo, tatok_file)
    code_embedding = load_tatok(dict(tatok or {}), tatok_path, dtype_of(dtype), trust_pickle, seed + 3)

    def model(file: str, size: int, offset: int, sizes: dict[str, Any]) -> OfficialImageModel:
        if size % vcfg.downsample:
            raise ValueError(f"image size {size} is not a multiple of {vcfg.downsample}")
        gpt = load_ar_dtok(size // vcfg.downsample, sizes, path(tatok_repo, file), dtype_of(dtype),
                           trust_pickle, seed + offset)
        return OfficialImageModel(gpt, tok, image_size=size)

    small = {**arch, **(small_arch or {})}
    target = model(target_file, target_size, 1, arch)
    if eagle_head_file:
        attach_head(target, dtype_of(dtype), file=eagle_head_file, config_file=eagle_head_config,
                    repo_id=eagle_head_repo, local_dir=local_dir, cache_dir=cache_dir, random=random_init,
                    seed=seed + 5, trust_pickle=trust_pickle)
    bundle = ModelBundle(name=name, target=target,
                         drafter=model(drafter_file, drafter_size, 2, arch) if drafter_file else None,
                         small_drafter=(model(small_drafter_file, target_size, 4, small)
                                        if small_drafter_file else None),
                         conditioner=TarConditioner(llm, code_embedding))
    return bundle.to(device) if device else bundle
