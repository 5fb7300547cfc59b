"""`model=llamagen_*`: LlamaGen T2I (GPT-XL stage 2 at 512 px as target, stage 1 at 256 px as the
MuLo-SD drafter), the shared VQ-16 tokenizer and FLAN-T5-XL caption features.

Weights: `peizesun/llamagen_t2i` (`t2i_XL_stage2_512.pt`, `t2i_XL_stage1_256.pt`, `vq_ds16_t2i.pt`),
downloaded with huggingface_hub into a cache or read from `local_dir`, loaded strictly.
Architecture facts (LlamaGen `autoregressive/models/gpt.py`, `GPT_XL` with `model_type='t2i'`):
36 layers, 20 heads, width 1280, SwiGLU hidden rounded to a multiple of 256, RMSNorm eps 1e-5,
120 caption tokens of width 2048 through `cls_embedding.cap_proj` (GELU-tanh MLP, no biases),
a learned `uncond_embedding` [120, 2048] for CFG, 2-D RoPE over the token grid with an all-zero
table on the caption slots, vocabulary 16384.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from harness.api import ModelBundle
from harness.models.eagle_head import attach_head
from harness.models.gpt import GPT, randomise_head
from harness.models.gpt_config import GPTConfig
from harness.models.hub import dtype_of, load_file_into, resolve
from harness.models.official_model import OfficialImageModel
from harness.models.llamagen.t5_captions import CaptionConditioner, CaptionEncoder
from harness.models.vq16 import load_vq, vq_config

log = logging.getLogger(__name__)

REPO_ID = "peizesun/llamagen_t2i"
GPT_XL = {"dim": 1280, "n_layer": 36, "n_head": 20, "caption_dim": 2048, "prefix_len": 120,
          "vocab_size": 16384}


def gpt_config(grid: int, arch: dict[str, Any]) -> GPTConfig:
    """LlamaGen T2I GPT at a `grid x grid` token grid; `arch` overrides GPT_XL's sizes."""
    a = {**GPT_XL, **arch}
    return GPTConfig(vocab_size=a["vocab_size"], grid=(grid, grid), dim=a["dim"], n_layer=a["n_layer"],
                     n_head=a["n_head"], multiple_of=a.get("multiple_of", 256), prefix_len=a["prefix_len"],
                     caption_dim=a["caption_dim"], pos_embed="rope2d", prefix_rope="zero",
                     cond_embed="caption_mlp", norm_eps=a.get("norm_eps", 1e-5),
                     rope_base=a.get("rope_base", 10000.0), dropout=0.0)


def load_gpt(cfg: GPTConfig, path: Path | None, dtype: torch.dtype, trust_pickle: bool, seed: int,
             what: str) -> GPT:
    """A GPT from an official checkpoint `path` (strict), or seeded random weights when None."""
    torch.manual_seed(seed)
    gpt = GPT(cfg)
    if path is None:
        randomise_head(gpt, seed)
    else:
        load_file_into(gpt, path, what, trust_pickle)
    return gpt.eval().to(dtype)


def build(name: str = "llamagen", repo_id: str = REPO_ID, target_file: str = "t2i_XL_stage2_512.pt",
          drafter_file: str | None = "t2i_XL_stage1_256.pt", vq_file: str = "vq_ds16_t2i.pt",
          target_size: int = 512, drafter_size: int = 256, arch: dict[str, Any] | None = None,
          vq: dict[str, Any] | None = None, local_dir: str | None = None, cache_dir: str | None = None,
          dtype: str = "bf16", vq_dtype: str = "fp32", device: str | None = None, trust_pickle: bool = False,
          random_init: bool = False, seed: int = 0, text_encoder: CaptionEncoder | None = None,
          left_padding: bool = True, small_drafter_file: str | None = None,
          small_arch: dict[str, Any] | None = None, eagle_head_file: str | None = None,
          eagle_head_config: str | None = None, eagle_head_repo: str | None = None) -> ModelBundle:
    """Target at `target_size` px, drafter (same family) at `drafter_size` px (None/null file: no
    drafter), optional small drafter at the target's size (`small_arch` overrides `arch`; LlamaGen
    releases none), the target's EAGLE head (`eagle_head_file`, with `eagle_head_config` for
    LANTERN's release, from `eagle_head_repo`: harness/models/eagle_head.build_head; null: none),
    one VQ-16 and one caption conditioner. `random_init` builds seeded random weights in the
    official layout instead of reading files (tiny test stacks; a named head is random too)."""
    if text_encoder is None:
        raise ValueError("model.text_encoder is required "
                         "(FlanT5Encoder for the real model, TinyTextEncoder in tests)")
    vcfg = vq_config(vq)
    arch = dict(arch or {})

    def path(file: str) -> Path | None:
        return None if random_init else resolve(repo_id, file, _local(local_dir, file), cache_dir)

    tok = load_vq(vcfg, path(vq_file), dtype_of(vq_dtype), trust_pickle, seed)

    def model(file: str, size: int, offset: int, sizes: dict[str, Any]) -> OfficialImageModel:
        grid = _grid(size, vcfg.downsample)
        gpt = load_gpt(gpt_config(grid, sizes), path(file), dtype_of(dtype), trust_pickle, seed + offset,
                       f"LlamaGen GPT ({size} px)")
        return OfficialImageModel(gpt, tok, image_size=size)

    target = model(target_file, target_size, 1, arch)
    if eagle_head_file:
        attach_head(target, dtype_of(dtype), file=eagle_head_file, config_file=eagle_head_config,
                    repo_id=eagle_head_repo, local_dir=local_dir, cache_dir=cache_dir, random=random_init,
                    seed=seed + 4, trust_pickle=trust_pickle)
    bundle = ModelBundle(
        name=name,
        target=target,
        drafter=model(drafter_file, drafter_size, 2, arch) if drafter_file else None,
        small_drafter=(model(small_drafter_file, target_size, 3, {**arch, **(small_arch or {})})
                       if small_drafter_file else None),
        conditioner=CaptionConditioner(text_encoder, left_padding=left_padding),
    )
    return bundle.to(device) if device else bundle


def _local(local_dir: str | None, file: str) -> str | None:
    return None if local_dir is None else str(Path(local_dir).expanduser() / file)


def _grid(size: int, downsample: int) -> int:
    if size % downsample:
        raise ValueError(f"image size {size} is not a multiple of the tokenizer's downsampling {downsample}")
    return size // downsample
