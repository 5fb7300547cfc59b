"""GenEval's colour classifier: open_clip ViT-L-14 (OpenAI weights), zero-shot over GENEVAL_COLORS.

As djghosh13/geneval `evaluate_images.py` with clip_benchmark's zero-shot classifier: per colour c the
class embedding is the renormalised mean of the L2-normalised text embeddings of
"a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object"; each object
is its mask composited on a uniform #999 canvas (image size), cropped to its box
(`crop=1`), preprocessed by open_clip's eval transform; colour = argmax of
normalize(image features) @ W (fp16 autocast on CUDA).
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from evaluators.clip_models import create_open_clip, open_clip_assets, resolve_device
from evaluators.geneval_rules import GENEVAL_COLORS, Detection

log = logging.getLogger(__name__)

TEMPLATES = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")
BACKGROUND = (0x99, 0x99, 0x99)  # GenEval's bgcolor=#999


def object_crop(image: np.ndarray, det: Detection, background: tuple[int, int, int] = BACKGROUND) -> np.ndarray:
    """uint8 [H, W, 3] + detection -> the object's pixels on a grey canvas, cropped to its box [h, w, 3]."""
    canvas = np.empty_like(image)
    canvas[:] = background
    if det.mask is not None:
        canvas[det.mask] = image[det.mask]
    else:
        canvas = image.copy()
    height, width = image.shape[:2]
    x1, y1 = max(int(round(det.box[0])), 0), max(int(round(det.box[1])), 0)
    x2, y2 = min(int(round(det.box[2])), width), min(int(round(det.box[3])), height)
    if x2 <= x1 or y2 <= y1:
        raise ValueError(f"detection of {det.cls!r} has an empty box {det.box} in a {width}x{height} image")
    return canvas[y1:y2, x1:x2]


class ClipColorClassifier:
    """The ColorClassifier of GenEval (plugs into evaluators.geneval.GenEvalEvaluator).

    Args:
        arch, pretrained: open_clip model (ViT-L-14, "openai" = the official weights).
        checkpoint: local state-dict file instead of `pretrained`.
        device: "auto" | "cpu" | "cuda[:N]".
    """

    def __init__(self, arch: str = "ViT-L-14", pretrained: str | None = "openai", checkpoint: str | None = None,
                 device: str = "auto") -> None:
        self.arch, self.pretrained, self.checkpoint = arch, pretrained, checkpoint
        self.device = resolve_device(device)
        self.name = f"clip-color-{arch}:{pretrained if checkpoint is None else 'file'}"
        self._model: tuple | None = None
        self._weights: dict[str, torch.Tensor] = {}

    def assets(self) -> list:
        """What `_load` downloads (harness/assets): open_clip's hub file of `pretrained`."""
        return [] if self.checkpoint else open_clip_assets("GenEval colour classifier", self.arch, self.pretrained)

    def _load(self) -> tuple:
        if self._model is None:
            from pathlib import Path

            checkpoint = Path(self.checkpoint).expanduser() if self.checkpoint else None
            model, tokenizer, preprocess, tag = create_open_clip(
                self.arch, pretrained=None if checkpoint else self.pretrained, checkpoint=checkpoint,
                device=self.device)
            self._model = (model, tokenizer, preprocess)
            self.name = f"clip-color-{tag}"
        return self._model

    def class_weights(self, cls: str) -> torch.Tensor:
        """Zero-shot weights [D, 10] for object class `cls` (cached per class)."""
        if cls not in self._weights:
            model, tokenizer, _ = self._load()
            columns = []
            with torch.no_grad(), self._autocast():
                for color in GENEVAL_COLORS:
                    texts = [t.format(c=color, cls=cls) for t in TEMPLATES]
                    emb = torch.nn.functional.normalize(model.encode_text(tokenizer(texts).to(self.device)).float(), dim=-1)
                    columns.append(torch.nn.functional.normalize(emb.mean(dim=0), dim=0))
            self._weights[cls] = torch.stack(columns, dim=1)
        return self._weights[cls]

    def classify(self, image: np.ndarray, detections: Sequence[Detection]) -> list[str]:
        """image uint8 [H, W, 3] and its detections -> one of GENEVAL_COLORS per detection (batched)."""
        if not detections:
            return []
        model, _, preprocess = self._load()
        crops = torch.stack([preprocess(Image.fromarray(object_crop(image, d))) for d in detections]).to(self.device)
        with torch.no_grad(), self._autocast():
            feats = torch.nn.functional.normalize(model.encode_image(crops).float(), dim=-1)
        colors = []
        for feat, det in zip(feats, detections):
            logits = 100 * feat @ self.class_weights(det.cls)
            colors.append(GENEVAL_COLORS[int(logits.argmax())])
        return colors

    def _autocast(self):
        from contextlib import nullcontext

        return torch.autocast("cuda", dtype=torch.float16) if self.device.type == "cuda" else nullcontext()
