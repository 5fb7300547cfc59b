"""`model=emu3_gen`: Emu3's text-to-image path (harness/models/emu3/model.py) over the Hugging
Face-format repo `BAAI/Emu3-Gen-hf` (transformers' `Emu3ForConditionalGeneration`): a 184622-token
Llama-style LM whose vocabulary holds the 32768 codes of its VQ tokenizer (8x spatial downsampling).
The token grid is a run-time choice (the prompt's header names it), so one checkpoint is the target
at `target_size` px and, at `drafter_size` px, the MuLo-SD drafter (the same weights and modules,
its own cache and grid).

Weights load strictly: any key of the checkpoint the architecture lacks, or the reverse, or a shape
that differs, is a WeightsError naming them (transformers' own loading report). `REPO_FILES` are the
repo files it reads (`stages=[fetch]` lists them, harness/assets/fetching.py).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from harness.api import ConfigValueError, ModelBundle
from harness.models.emu3.model import Emu3ImageModel
from harness.models.emu3.prompts import Emu3Conditioner, PromptTokenizer
from harness.models.emu3.tiny import tiny_model
from harness.models.eagle_head import attach_head
from harness.models.hub import WeightsError, dtype_of, hub_revision, pretrained_strict, snapshot


# the files of an Emu3 repo the loader reads: config, generation defaults, weights, tokenizer and
# processor settings (the image processor's normalisation for decoding)
REPO_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
              "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "processor_config.json",
              "preprocessor_config.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.*")
DEFAULT_NORM = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # the tiny stand-in's (the repo's file is read otherwise)


def load_emu3(repo_id: str | None, local_path: str | None, cache_dir: str | None,
              dtype: torch.dtype) -> tuple[Any, str, str | None]:
    """An Emu3ForConditionalGeneration from a repo (or a local copy of one), loaded strictly, its
    folder, and the hub snapshot's `repo@commit` (None for a local copy)."""
    from transformers import Emu3ForConditionalGeneration

    if not repo_id and not local_path:
        raise WeightsError("an Emu3 model needs a hub repo (model.repo_id) or a local copy (model.local_dir)")
    folder = snapshot(repo_id or "", local_path, cache_dir, REPO_FILES)
    model = pretrained_strict(Emu3ForConditionalGeneration, folder, "an Emu3", repo_id, dtype)
    return model, folder, None if local_path else hub_revision(repo_id, folder)


def pixel_norm(folder: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(image_mean, image_std) of the repo's image processor, which its postprocess inverts to turn
    decoded pixels into uint8: from `preprocessor_config.json` (the hub repo's file), or from the
    `image_processor` entry of `processor_config.json` (a folder saved by transformers 5, which writes
    the processor's parts into that one file)."""
    for name, entry in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
        file = Path(folder) / name
        if not file.is_file():
            continue
        cfg = json.loads(file.read_text())
        cfg = cfg.get(entry, cfg) if entry else cfg
        try:
            return tuple(map(float, cfg["image_mean"])), tuple(map(float, cfg["image_std"]))
        except (KeyError, TypeError) as err:
            raise WeightsError(f"{file} lacks the image processor's image_mean / image_std lists: {err}") from err
    raise WeightsError(f"{folder} holds neither preprocessor_config.json nor processor_config.json: the Emu3 "
                       "image processor's normalisation is read from one of them")


def grid_of(size: int, spatial: int, key: str) -> tuple[int, int]:
    """A square image of `size` px -> its token grid (size / spatial per side)."""
    if int(size) != size or size <= 0 or size % spatial:
        raise ConfigValueError(f"{key}={size!r}: Emu3 image sides are positive multiples of {spatial} px "
                               f"(the VQ model downsamples by {spatial})")
    return (size // spatial, size // spatial)


def build(name: str = "emu3", tokenizer: PromptTokenizer | None = None, repo_id: str | None = None,
          local_dir: str | None = None, cache_dir: str | None = None, target_size: int = 720,
          drafter: bool = False, drafter_size: int | None = None, prompt_slots: int = 256,
          negative_prompt: str = "", cfg_context: str = "transformers", positive_prompt: str = "",
          codebook_size: int = 32768, dtype: str = "bf16", device: str | None = None,
          random_init: bool = False, arch: dict[str, Any] | None = None, seed: int = 0,
          eagle_head_file: str | None = None, eagle_head_config: str | None = None,
          eagle_head_repo: str | None = None) -> ModelBundle:
    """The target at `target_size` px, with `drafter` the same weights at `drafter_size` px (MuLo-SD),
    and the conditioner (`tokenizer`, `negative_prompt` for CFG in the context `cfg_context`: "baai", each
    prompt followed by `positive_prompt` and the negative prompt given the image header, as BAAI's
    image_generation.py; or "transformers", as its documentation). `random_init`: a tiny random model
    built in code (harness/models/emu3/tiny.py, `arch` sizing it). `eagle_head_file`: the target's
    EAGLE head (harness/models/eagle_head.build_head: a head trained by python -m
    baselines.training.train_eagle, or with `eagle_head_config` LANTERN's release; a path or a file of
    the Hugging Face repo `eagle_head_repo`; random with `random_init`; null: none)."""
    if tokenizer is None:
        raise ValueError("model.tokenizer is required (ChatPromptTokenizer for the real model, "
                         "TinyPromptTokenizer for emu3_tiny)")
    if int(prompt_slots) != prompt_slots or prompt_slots < 1:
        raise ConfigValueError(f"model.prompt_slots must be an integer >= 1, got {prompt_slots!r}")
    if drafter and drafter_size is None:
        raise ConfigValueError("model.drafter=true needs model.drafter_size (px), e.g. half of model.target_size")
    torch_dtype = dtype_of(dtype)
    revision = None
    if random_init:
        hf, norm = tiny_model(arch, seed).to(torch_dtype), DEFAULT_NORM
    else:
        hf, folder, revision = load_emu3(repo_id, local_dir, cache_dir, torch_dtype)
        norm = pixel_norm(folder)
    spatial = int(hf.model.vqmodel.vision_spatial_factor)
    if int(hf.config.vq_config.codebook_size) != codebook_size:
        raise WeightsError(f"the checkpoint's VQ model has {hf.config.vq_config.codebook_size} codes; the config "
                           f"says model.codebook_size={codebook_size}")
    grids = [grid_of(target_size, spatial, "model.target_size")]
    if drafter:
        low = grid_of(int(drafter_size), spatial, "model.drafter_size")  # type: ignore[arg-type]
        if target_size % drafter_size or target_size == drafter_size:
            raise ConfigValueError(f"model.drafter_size={drafter_size} must divide model.target_size={target_size} "
                                   "(a whole grid ratio r >= 2 for MuLo-SD)")
        grids.append(low)
    conditioner = Emu3Conditioner(tokenizer, int(prompt_slots), negative_prompt, grids, cfg_context, positive_prompt)
    models = [Emu3ImageModel(hf, g, int(prompt_slots), conditioner.header_len(g), *norm) for g in grids]
    target = models[0]
    if eagle_head_file:  # a path, or a file of eagle_head_repo (local_dir holds other files here)
        attach_head(target, torch_dtype, file=eagle_head_file, config_file=eagle_head_config,
                    repo_id=eagle_head_repo, cache_dir=cache_dir, random=random_init, seed=seed + 4)
    weights_id = f"hub:{revision}" if revision else None  # a hub snapshot is its commit; else digested
    bundle = ModelBundle(name=name, target=models[0], drafter=models[1] if drafter else None,
                         conditioner=conditioner, weights_id=weights_id)
    return bundle.to(device) if device else bundle
