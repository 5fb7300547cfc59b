"""CLIP score with open_clip: per image 100 x cos(image, prompt); summary max(mean, 0), as
torchmetrics' `CLIPScore` reports it.

Default model: ViT-L-14 with OpenAI weights (open_clip tag "openai"; the same network as
torchmetrics' default HF `openai/clip-vit-large-patch14`), open_clip's eval preprocessing
(shortest side to 224 bicubic, centre crop, OpenAI normalisation); prompts beyond 77 tokens are
truncated. A local checkpoint file may replace the pretrained tag. Not the GigaGAN CLIP score
(ViT-B/32, "A photo depicts " prefix, raw cosine).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from PIL import Image

from evaluators.clip_models import create_open_clip, open_clip_assets, resolve_device
from evaluators.image_text_score import mean_rows, score_samples
from harness.api import EvalResult
from harness.store.samples import SampleSet

log = logging.getLogger(__name__)

VERSION = "1"


class CLIPScoreEvaluator:
    """CLIP score of every sample.

    Args:
        name: evaluator name.
        arch, pretrained: open_clip model and pretrained tag (ViT-L-14 / "openai").
        checkpoint: local state-dict file instead of the pretrained tag.
        batch_size, device, show_progress: scoring loop.
    """

    def __init__(self, name: str = "clip_score", arch: str = "ViT-L-14", pretrained: str | None = "openai",
                 checkpoint: str | None = None, batch_size: int = 32, device: str = "auto",
                 show_progress: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"clip_score batch_size must be >= 1, got {batch_size}")
        if checkpoint is not None and not Path(checkpoint).expanduser().is_file():
            raise FileNotFoundError(f"CLIP checkpoint {checkpoint} does not exist")
        self.name, self.arch, self.pretrained, self.checkpoint = name, arch, pretrained, checkpoint
        self.batch_size, self.device, self.show_progress = batch_size, resolve_device(device), show_progress
        self._model: tuple | None = None

    @property
    def version(self) -> str:
        """e.g. "clip_score-1/ViT-L-14:openai"."""
        weights = self._model[3] if self._model else f"{self.arch}:{self.pretrained}"
        return f"clip_score-{VERSION}/{weights}"

    def check(self) -> None:
        """Before generation (harness/run.py): open_clip imports here."""
        from evaluators.dependencies import require_modules

        require_modules("evaluator clip_score", ("open_clip",), "install the harness's dependencies: pip install -e .")

    def assets(self) -> list:
        """What `load` downloads (harness/assets): open_clip's hub file of `pretrained`, unless a checkpoint."""
        return [] if self.checkpoint else open_clip_assets(f"evaluator {self.name}", self.arch, self.pretrained)

    def load(self) -> tuple:
        """(model, tokenizer, preprocess uint8 [H, W, 3] -> [3, S, S], weights tag), loaded once."""
        if self._model is None:
            checkpoint = Path(self.checkpoint).expanduser() if self.checkpoint else None
            model, tokenizer, pil_preprocess, tag = create_open_clip(
                self.arch, pretrained=None if checkpoint else self.pretrained, checkpoint=checkpoint,
                device=self.device)
            self._model = (model, tokenizer, lambda image: pil_preprocess(Image.fromarray(np.asarray(image))), tag)
        return self._model

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """Summary `clip_score` (max(mean, 0)) and per-sample 100 x cosine."""
        model, tokenizer, preprocess, _ = self.load()
        per_sample = score_samples(samples, model, tokenizer, preprocess, self.device, self.batch_size,
                                   self.name, self.show_progress)
        summary = mean_rows("clip_score", per_sample, clamp_zero=True)
        log.info("%s: CLIP score %.3f over %d images (%s)", self.name, summary["value"].iloc[0], len(per_sample),
                 self.version)
        return EvalResult(summary=summary, per_sample=per_sample)


__all__ = ["CLIPScoreEvaluator"]
