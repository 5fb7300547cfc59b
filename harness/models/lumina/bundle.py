"""`model=lumina_mgpt_*`: Lumina-mGPT 7B (Alpha-VLLM) at 512 / 768 / 1024 px as target, optionally
the 512 px checkpoint as the MuLo-SD drafter (same tokenizer and VQGAN), Chameleon's VQGAN, and the
chat-prompt conditioner.

Files: the Hub repos `Alpha-VLLM/Lumina-mGPT-7B-{512,768,1024}` (transformers layout:
`config.json`, `model-*.safetensors` + index, the Chameleon BPE tokenizer), downloaded into the HF
cache or read from `target_path` / `drafter_path`; Chameleon's VQGAN from Meta's Chameleon release,
which is not on the Hub with these weights: `model.local_dir` is the release folder, holding
`tokenizer/vqgan.ckpt` and `tokenizer/vqgan.yaml` (Lumina-mGPT's README puts it at
`lumina_mgpt/ckpts/chameleon/`). The LM's sizes come from its `config.json`; its vocabulary map
gives the special ids and the vocabulary id of each VQGAN code. The LM loads strictly; the only
keys dropped by name are `model.vqmodel.*` (transformers' copy of the VQGAN encoder, unused by the
LM) and the VQGAN's training loss `loss.*`.

`random_init`: a seeded random model of the official layout from `arch` / `vqgan` / `tokens` (the
tiny stand-in `lumina_tiny`; no files, a byte-level text tokenizer).
"""
from __future__ import annotations

import json
from dataclasses import replace
import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from harness.api import ConfigValueError, ModelBundle
from harness.models.eagle_head import attach_head
from harness.models.hub import WeightsError, damaged, dtype_of, load_strict, snapshot
from harness.models.lumina.chameleon import ChameleonArch, ChameleonLM
from harness.models.lumina.image_model import LuminaImageModel
from harness.models.lumina.layout import SpecialTokens, code_ids
from harness.models.lumina.prompts import ByteTokenizer, ChatConditioner, HubTokenizer
from harness.models.lumina.vqgan import VQGAN, VQGANConfig, load_vqgan

log = logging.getLogger(__name__)

HUB_FILES = ("config.json", "*.safetensors", "model.safetensors.index.json", *HubTokenizer.FILES)
VQGAN_CKPT = "tokenizer/vqgan.ckpt"
VQGAN_YAML = "tokenizer/vqgan.yaml"
DROPPED = "model.vqmodel."  # transformers' VQGAN encoder inside some Chameleon checkpoints


def vqgan_files(local_dir: str | None) -> tuple[Path, Path]:
    """(vqgan.ckpt, vqgan.yaml) in the Chameleon release folder `local_dir`, or one WeightsError
    saying where they come from and where they go."""
    where = ("Lumina-mGPT decodes images with Chameleon's VQGAN, which Meta distributes with the Chameleon "
             "release (request access at ai.meta.com/resources/models-and-libraries/chameleon-downloads), "
             f"not with the Lumina-mGPT weights on the Hub. Set model.local_dir to the release folder that holds "
             f"{VQGAN_CKPT} and {VQGAN_YAML} (Lumina-mGPT's README keeps it at lumina_mgpt/ckpts/chameleon)")
    if not local_dir:
        raise WeightsError(f"model.local_dir is not set. {where}")
    root = Path(local_dir).expanduser()
    missing = [name for name in (VQGAN_CKPT, VQGAN_YAML) if not (root / name).is_file()]
    if missing:
        raise WeightsError(f"{', '.join(str(root / m) for m in missing)} not found. {where}")
    return root / VQGAN_CKPT, root / VQGAN_YAML


def read_lm_state(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors shards."""
    from safetensors.torch import load_file

    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise WeightsError(f"{folder} holds no .safetensors weights (expected a Lumina-mGPT checkpoint folder)")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            state.update(load_file(str(shard)))
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: a damaged shard either way
            raise damaged(shard, err) from err
    return state


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise WeightsError(f"cannot read {path} (a Lumina-mGPT checkpoint folder has a transformers "
                           f"config.json): {err}") from err


def load_lm(folder: Path, dtype: torch.dtype) -> ChameleonLM:
    """The Chameleon LM of a checkpoint folder, sizes from its config.json, loaded strictly."""
    arch = ChameleonArch.from_hf(read_config(folder), str(folder / "config.json"))
    state = {k: v for k, v in read_lm_state(folder).items() if not k.startswith(DROPPED)}
    norm = state.get("model.layers.0.self_attn.q_norm.weight")
    if norm is not None and norm.dim() == 2 and norm.shape[0] in (1, arch.num_attention_heads):
        # Lumina-mGPT's fork stores one q/k-norm affine per model-parallel shard, transformers'
        # mainline one per head: the file says which
        arch = replace(arch, qk_norm_shards=int(norm.shape[0]))
    with torch.device("meta"):
        lm = ChameleonLM(arch)
    load_strict(lm, state, folder, "Chameleon LM", assign=True)
    log.info("loaded the Chameleon LM from %s (%d tensors)", folder, len(state))
    return lm.eval().to(dtype)


def vocabulary(config: Mapping[str, Any], base: SpecialTokens, where: str) -> tuple[SpecialTokens, list[int] | None]:
    """Special ids and the vocabulary id of each VQGAN code from a config's `vocabulary_map`
    (Chameleon's image tokens are named IMGIMG + the code's digits as letters A-J + Z); `base`
    when the config has no map."""
    vmap = config.get("vocabulary_map")
    if not vmap:
        return base, None
    names = {"sep": "<reserved08706>", "image_start": "<racm3:break>", "image_end": "<eoss>",
             "new_line": "<reserved08799>", "size_base": "<reserved08800>"}
    missing = [n for n in names.values() if n not in vmap]
    if missing:
        raise WeightsError(f"{where}: the vocabulary map lacks {missing}")
    digits = {chr(ord("A") + i): str(i) for i in range(10)}
    order: dict[int, int] = {}
    for name, vid in vmap.items():
        if name.startswith("IMGIMG"):
            order[int("".join(digits.get(c, c) for c in name[len("IMGIMG"):-1]))] = int(vid)
    if sorted(order) != list(range(len(order))):
        raise WeightsError(f"{where}: the IMGIMG codes of the vocabulary map are not 0..{len(order) - 1}")
    ids = {k: int(vmap[n]) for k, n in names.items()}
    tokens = SpecialTokens(bos=base.bos, first_code=min(order.values()), codes=len(order), **ids)
    return tokens, [order[c] for c in range(len(order))]


def _mulo_ratio(target: int, drafter: int) -> int:
    if target % drafter:
        raise ConfigValueError(f"model.drafter_size={drafter} does not divide model.target_size={target}: MuLo-SD "
                               "needs an integer ratio r between the grids (e.g. 512 for a 1024 target)")
    return target // drafter


def build(name: str = "lumina_mgpt", target_repo: str = "Alpha-VLLM/Lumina-mGPT-7B-768", target_size: int = 768,
          drafter_repo: str | None = None, drafter_size: int | None = None, target_path: str | None = None,
          drafter_path: str | None = None, local_dir: str | None = None, cache_dir: str | None = None,
          prompt_slots: int = 128, dtype: str = "bf16", vq_dtype: str = "fp32", device: str | None = None,
          trust_pickle: bool = False, random_init: bool = False, seed: int = 0, arch: dict[str, Any] | None = None,
          vqgan: dict[str, Any] | None = None, tokens: dict[str, Any] | None = None,
          byte_tokenizer: int | None = None, eagle_head_file: str | None = None,
          eagle_head_config: str | None = None, eagle_head_repo: str | None = None) -> ModelBundle:
    """Target at `target_size` px (square), drafter at `drafter_size` px (null: none), one
    VQGAN, one chat conditioner for both sizes. `byte_tokenizer`: the id of byte 0 of a byte-level
    text tokenizer (the tiny stand-in), null: the checkpoint's BPE tokenizer.
    `eagle_head_file`: the target's EAGLE head (harness/models/eagle_head.build_head: a head trained by
    python -m baselines.training.train_eagle, or with `eagle_head_config` LANTERN's release, a path or a
    file of the Hugging Face repo `eagle_head_repo`; random with `random_init`; null: none)."""
    if drafter_size is not None:
        _mulo_ratio(target_size, drafter_size)
        if not (random_init or drafter_repo):
            raise ConfigValueError("model.drafter_size is set but model.drafter_repo is null: name the drafter's "
                                   "repo (e.g. Alpha-VLLM/Lumina-mGPT-7B-512) or set drafter_size: null")
    base = SpecialTokens(**(tokens or {}))
    if random_init:
        torch.manual_seed(seed)
        vq = VQGAN(VQGANConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in (vqgan or {}).items()}))
        vq = vq.eval().to(dtype_of(vq_dtype))
        lms = {"target": ChameleonLM(ChameleonArch(**(arch or {}))).eval().to(dtype_of(dtype))}
        if drafter_size is not None:
            lms["drafter"] = ChameleonLM(ChameleonArch(**(arch or {}))).eval().to(dtype_of(dtype))
        special, order, folder = base, None, None
    else:
        ckpt, yaml = vqgan_files(local_dir)  # before the large downloads: the error a user can fix first
        folder = Path(snapshot(target_repo, target_path, cache_dir, HUB_FILES))
        special, order = vocabulary(read_config(folder), base, str(folder / "config.json"))
        vq = load_vqgan(ckpt, yaml, dtype_of(vq_dtype), trust_pickle)
        lms = {"target": load_lm(folder, dtype_of(dtype))}
        if drafter_size is not None:
            dfolder = Path(snapshot(str(drafter_repo), drafter_path, cache_dir, HUB_FILES))
            if vocabulary(read_config(dfolder), base, str(dfolder))[1] != order:
                raise WeightsError(f"{dfolder} maps image codes to other vocabulary ids than {folder}: "
                                   "the drafter must share the target's tokenizer")
            lms["drafter"] = load_lm(dfolder, dtype_of(dtype))
    if vq.cfg.n_embed != special.codes:
        raise ConfigValueError(f"the VQGAN has {vq.cfg.n_embed} codes but the vocabulary {special.codes} image tokens")
    if byte_tokenizer is not None:
        turn: ByteTokenizer | HubTokenizer = ByteTokenizer(byte_tokenizer, special.sep)
    else:
        turn = HubTokenizer(str(folder))
        if turn.sep != special.sep:
            raise WeightsError(f"{folder}: the tokenizer's {HubTokenizer.SEP} is id {turn.sep}, the vocabulary map's "
                               f"{special.sep}")
        special = replace(special, bos=turn.bos)
    ids = code_ids(special, order)
    sizes = {"target": target_size, "drafter": drafter_size}

    def model(role: str) -> LuminaImageModel:
        px = sizes[role]
        return LuminaImageModel(lms[role], vq, (px, px), prompt_slots, special, ids, vq.cfg.downsample)

    target = model("target")
    if eagle_head_file:  # a path, or a file of eagle_head_repo (local_dir holds other files here)
        attach_head(target, dtype_of(dtype), file=eagle_head_file, config_file=eagle_head_config,
                    repo_id=eagle_head_repo, cache_dir=cache_dir, random=random_init, seed=seed + 4)
    drafter = model("drafter") if "drafter" in lms else None
    size_list = [target.size] + ([drafter.size] if drafter is not None else [])
    bundle = ModelBundle(name=name, target=target, drafter=drafter,
                         conditioner=ChatConditioner(turn, size_list, prompt_slots, special))
    return bundle.to(device) if device else bundle
