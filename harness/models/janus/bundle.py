"""`model=janus_pro_*`: Janus-Pro's text-to-image path (harness/models/janus/model.py) over the
Hugging Face-format repos `deepseek-community/Janus-Pro-1B` and `-7B` (transformers'
`JanusForConditionalGeneration`): 384 px, 24x24 = 576 tokens of a VQ-16 tokenizer with 16384 codes.
Both sizes share the tokenizer and the image tokenizer's layout, so the 1B is the 7B's
same-resolution `small_drafter` (draft-model SD, `sd`). There is no lower-resolution Janus-Pro:
no MuLo-SD drafter (the configs say so in `lacks`, which the preflight reports).

Weights load strictly: any key of the checkpoint the architecture lacks, or the reverse, or a shape
that differs, is a WeightsError naming them (transformers' own loading report). `REPO_FILES` are the
repo files it reads (`stages=[fetch]` lists them, harness/assets/fetching.py).
"""
from __future__ import annotations

from typing import Any

import torch

from harness.api import ModelBundle
from harness.models.eagle_head import attach_head
from harness.models.hub import WeightsError, dtype_of, hub_revision, pretrained_strict, snapshot
from harness.models.janus.model import JanusImageModel
from harness.models.janus.prompts import JanusConditioner, PromptTokenizer
from harness.models.janus.tiny import tiny_model


# the files of a Janus-Pro repo the loader reads: config, generation defaults, weights, tokenizer and
# processor (chat template); the understanding tower's weights are part of the one checkpoint
REPO_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
              "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "processor_config.json",
              "preprocessor_config.json", "chat_template.*")


def load_janus(repo_id: str | None, local_path: str | None, cache_dir: str | None,
               dtype: torch.dtype) -> tuple[Any, str | None]:
    """A JanusForConditionalGeneration from a repo (or a local copy of one), loaded strictly, and
    the hub snapshot's `repo@commit` (None for a local copy)."""
    from transformers import JanusForConditionalGeneration

    if not repo_id and not local_path:
        raise WeightsError("a Janus model needs a hub repo (model.repo_id / model.small_drafter_repo) or a "
                           "local copy (model.local_dir / model.small_drafter_local_dir)")
    folder = snapshot(repo_id or "", local_path, cache_dir, REPO_FILES)
    model = pretrained_strict(JanusForConditionalGeneration, folder, "a Janus", repo_id, dtype)
    return model, None if local_path else hub_revision(repo_id, folder)


def special_ids(hf: Any) -> tuple[int, tuple[int, int]]:
    """(pad id, (BOS id, image-start id)) from the model's generation config, which transformers'
    Janus generate reads to build the unconditional rows."""
    gen = hf.generation_config
    boi = (getattr(gen, "generation_kwargs", None) or {}).get("boi_token_id", getattr(gen, "boi_token_id", None))
    if gen.pad_token_id is None or gen.bos_token_id is None or boi is None:
        raise WeightsError("the Janus generation config lacks pad_token_id, bos_token_id or "
                           "generation_kwargs.boi_token_id (a Hugging Face-format Janus-Pro repo sets them)")
    return int(gen.pad_token_id), (int(gen.bos_token_id), int(boi))


def _check(model: JanusImageModel, role: str, image_size: int, codebook_size: int) -> None:
    if model.image_size != image_size or model.vocab_size != codebook_size:
        raise WeightsError(f"the {role} generates {model.image_size} px with {model.vocab_size} codes; the config "
                           f"says model.image_size={image_size}, model.codebook_size={codebook_size}")


def build(name: str = "janus", tokenizer: PromptTokenizer | None = None, repo_id: str | None = None,
          small_drafter_repo: str | None = None, local_dir: str | None = None,
          small_drafter_local_dir: str | None = None, cache_dir: str | None = None, prefix_len: int = 256,
          image_size: int = 384, codebook_size: int = 16384, dtype: str = "bf16", device: str | None = None,
          random_init: bool = False, arch: dict[str, Any] | None = None,
          small_arch: dict[str, Any] | None = None, seed: int = 0, eagle_head_file: str | None = None,
          eagle_head_config: str | None = None, eagle_head_repo: str | None = None) -> ModelBundle:
    """The target (`repo_id` / `local_dir`), the optional small drafter (`small_drafter_repo` /
    `small_drafter_local_dir`) and the prompt conditioner (`tokenizer`; pad / BOS / image-start ids
    from the target's generation config). `random_init`: tiny random models built in code
    (harness/models/janus/tiny.py; `arch` sizes the target, `small_arch` overrides them for a small
    drafter, null: none). `eagle_head_file`: the target's EAGLE head
    (harness/models/eagle_head.build_head: a head trained by python -m baselines.training.train_eagle,
    or with `eagle_head_config` LANTERN's release; a path or a file of the Hugging Face repo
    `eagle_head_repo`; random with `random_init`; null: none)."""
    if tokenizer is None:
        raise ValueError("model.tokenizer is required (ChatPromptTokenizer for the real models, "
                         "TinyPromptTokenizer for janus_tiny)")
    if int(prefix_len) != prefix_len or prefix_len < 2:
        raise ValueError(f"model.prefix_len must be an integer >= 2, got {prefix_len!r}")
    torch_dtype = dtype_of(dtype)
    revisions: list[str | None] = [None]  # hub commits of the loaded models (None: random or local)
    if random_init:
        target_hf = tiny_model(arch, seed).to(torch_dtype)
        small_hf = None if small_arch is None else tiny_model({**(arch or {}), **small_arch}, seed + 1).to(torch_dtype)
    else:
        target_hf, revision = load_janus(repo_id, local_dir, cache_dir, torch_dtype)
        revisions, small_hf = [revision], None
        if small_drafter_repo or small_drafter_local_dir:
            small_hf, revision = load_janus(small_drafter_repo, small_drafter_local_dir, cache_dir, torch_dtype)
            revisions.append(revision)
    target = JanusImageModel(target_hf, prefix_len)
    _check(target, "target", image_size, codebook_size)
    if eagle_head_file:  # a path, or a file of eagle_head_repo (local_dir holds other files here)
        attach_head(target, torch_dtype, file=eagle_head_file, config_file=eagle_head_config,
                    repo_id=eagle_head_repo, cache_dir=cache_dir, random=random_init, seed=seed + 4)
    pad, kept = special_ids(target_hf)
    small = None
    if small_hf is not None:
        small = JanusImageModel(small_hf, prefix_len)
        _check(small, "small drafter", image_size, codebook_size)
        if special_ids(small_hf) != (pad, kept) or small_hf.config.text_config.vocab_size != \
                target_hf.config.text_config.vocab_size:
            raise WeightsError("the small drafter's text vocabulary or special ids differ from the target's: "
                               "it cannot read the target's prompts")
    # hub snapshots are identified by their commits (no digest of 9B parameters); else None: digested
    weights_id = "hub:" + ";".join(map(str, revisions)) if all(revisions) else None
    bundle = ModelBundle(name=name, target=target, small_drafter=small, weights_id=weights_id,
                         conditioner=JanusConditioner(tokenizer, int(prefix_len), pad, kept))
    return bundle.to(device) if device else bundle
