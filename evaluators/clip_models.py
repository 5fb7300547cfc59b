"""open_clip model loading and image preprocessing shared by HPSv2, CLIP score and GenEval's colour
classifier.

Weights come from an open_clip pretrained tag (e.g. ViT-L-14 "openai", fetched by open_clip from the
HF hub), a checkpoint on the HF hub (`hf_hub_file`, e.g. xswu/HPSv2) or a local file. Every loader
fails with an error naming the missing file and how to pre-download it for offline nodes
(HF_HUB_OFFLINE=1 then reads the local HF cache only).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from harness.api import InputError
from harness.datasets.downloads import sha256_file

log = logging.getLogger(__name__)

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


class MissingModelError(InputError, FileNotFoundError):
    """Model weights are not available locally and cannot be downloaded."""


def hf_hub_file(repo: str, filename: str, local: str | None = None) -> Path:
    """A file of HF hub model repo `repo` (cached by huggingface_hub), or the local path `local`."""
    if local is not None:
        path = Path(local).expanduser()
        if not path.is_file():
            raise MissingModelError(f"checkpoint {path} does not exist; download {filename} from the HF hub repo "
                                    f"{repo} (hf download {repo} {filename}) and point to it")
        return path
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename))
    except Exception as exc:  # offline, gated, missing: huggingface_hub raises many types
        raise MissingModelError(
            f"could not get {filename} from the HF hub repo {repo} ({type(exc).__name__}: {exc}). Pre-download it on "
            f"a connected machine with `hf download {repo} {filename}` (then copy the HF cache, "
            "~/.cache/huggingface, and set HF_HUB_OFFLINE=1), or give its local path."
        ) from exc


def open_clip_assets(what: str, arch: str, pretrained: str | None) -> list:
    """The hub file open_clip reads for `arch` / `pretrained` (its safetensors copy when the tag names
    a hub repo, as open_clip prefers it); empty when the weights come from a file or nowhere."""
    import open_clip

    from harness.assets.asset import HubFiles

    if not pretrained:
        return []
    cfg = open_clip.get_pretrained_cfg(arch, pretrained) or {}
    hub = str(cfg.get("hf_hub") or "")
    if not hub:
        return []
    parts = hub.strip("/").split("/")  # "org/name/" or "org/name/file"
    repo, filename = "/".join(parts[:2]), "/".join(parts[2:]) or "open_clip_pytorch_model.bin"
    if filename == "open_clip_pytorch_model.bin":  # open_clip reads the safetensors copy first
        filename = "open_clip_model.safetensors"
    return [HubFiles(what, repo, (filename,))]


def create_open_clip(arch: str, pretrained: str | None = None, checkpoint: Path | None = None,
                     device: torch.device | str = "cpu") -> tuple[torch.nn.Module, Callable, Callable, str]:
    """(model in eval mode, tokenizer, open_clip's eval preprocess, weights tag for `version`).

    `pretrained` is an open_clip tag (downloads through open_clip); `checkpoint` a state-dict file
    ({"state_dict": ...} or a plain state dict, "module." prefixes stripped), loaded strictly.
    """
    import open_clip

    if arch not in open_clip.list_models():
        raise ValueError(f"open_clip has no model {arch!r}; known e.g. ViT-H-14, ViT-L-14 ({len(open_clip.list_models())} in all)")
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=pretrained, device="cpu")
    except RuntimeError as exc:
        raise MissingModelError(
            f"open_clip could not load {arch} weights {pretrained!r} ({exc}). Pre-download them on a connected machine "
            f"(python -c \"import open_clip; open_clip.create_model('{arch}', pretrained='{pretrained}')\") and copy "
            "~/.cache/huggingface; then set HF_HUB_OFFLINE=1."
        ) from exc
    tag = f"{arch}:{pretrained or 'init'}"
    if checkpoint is not None:
        load_state(model, checkpoint)
        tag = f"{arch}:{checkpoint.name}:{sha256_file(checkpoint)[:10]}"
    return model.to(device).eval(), open_clip.get_tokenizer(arch), preprocess, tag


def load_state(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load a checkpoint file into `model` strictly; errors name the file and the mismatching keys."""
    try:
        blob: Any = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{checkpoint} is not a loadable torch checkpoint ({exc})") from exc
    state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{checkpoint} holds no state dict (expected a dict with 'state_dict')")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches
        raise ValueError(f"{checkpoint} does not fit the model ({str(exc)[:300]}); wrong architecture or file") from exc
    if missing or unexpected:
        raise ValueError(f"{checkpoint} does not fit the model: missing {missing[:5]} (of {len(missing)}), "
                         f"unexpected {unexpected[:5]} (of {len(unexpected)}); wrong architecture or file")


def resize_max_size(image: np.ndarray, size: int = 224) -> torch.Tensor:
    """HPSv2's eval transform: uint8 [H, W, 3] -> float [3, size, size].

    RGB -> ToTensor ([0, 1]) -> resize the longest side to `size` (bicubic, antialiased, on the
    tensor; no-op when it already is) -> zero-pad to a centred square -> OpenAI Normalize.
    """
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode

    tensor = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float() / 255
    height, width = tensor.shape[-2:]
    scale = size / float(max(height, width))
    if scale != 1.0:
        new = [round(height * scale), round(width * scale)]
        tensor = F.resize(tensor, new, InterpolationMode.BICUBIC, antialias=True)
        pad_h, pad_w = size - new[0], size - new[1]
        tensor = F.pad(tensor, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    return F.normalize(tensor, OPENAI_MEAN, OPENAI_STD)


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; anything else as given."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={device} requested but CUDA is not available; use device=cpu or auto")
    return torch.device(device)
