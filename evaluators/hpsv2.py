"""HPSv2 (Human Preference Score v2) with open_clip directly, not the `hpsv2` package.

Reference: tgxs002/HPSv2 @866735e (`img_score.py`, `evaluation.py`). Model: open_clip ViT-H-14
created without pretrained weights, then the HPS state dict from the HF hub repo `xswu/HPSv2`
(`HPS_v2.1_compressed.pt` for v2.1, default; `HPS_v2_compressed.pt` for v2.0; the two versions'
scores are not comparable). Preprocessing: ToTensor -> longest side to 224 (bicubic) -> zero pad
-> OpenAI normalisation (`clip_models.resize_max_size`). Score per image = 100 x cosine of the
L2-normalised image and prompt embeddings (logit_scale unused); summary = mean over images, plus
one row per value of the prompt meta key `subset_key` (HPDv2's styles) when present.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from evaluators.clip_models import MissingModelError, create_open_clip, hf_hub_file, resize_max_size, resolve_device
from evaluators.image_text_score import mean_rows, score_samples
from harness.api import EvalResult
from harness.datasets.downloads import Pinned, mismatch
from harness.store.samples import SampleSet

log = logging.getLogger(__name__)

VERSION = "1"
HUB_REPO = "xswu/HPSv2"
CHECKPOINTS = {"v2.1": "HPS_v2.1_compressed.pt", "v2.0": "HPS_v2_compressed.pt"}
# sha256 of each hub checkpoint: their Git LFS oids in xswu/HPSv2 @697403c (the commit that added them)
CHECKPOINT_SHA256 = {"HPS_v2.1_compressed.pt": "c57a38fb4a2f7e7c15bf00da2ea377cdf165448b4dd1052a484c215a998c9837",
                     "HPS_v2_compressed.pt": "07cb0d20626232204ca3a6ec53ff5984e7e53212a8a7b0e0ec2bac1bdaf125a1"}


def hub_pin(filename: str) -> Pinned:
    """The pin of an HPS checkpoint of the hub repo (its resolve URL and sha256)."""
    return Pinned(name=filename, url=f"https://huggingface.co/{HUB_REPO}/resolve/main/{filename}",
                  sha256=CHECKPOINT_SHA256[filename], what=f"HPSv2 checkpoint {filename}")


def check_pinned(path: Path, pinned: Pinned) -> None:
    """MissingModelError naming `path` unless it has the pinned hash (a damaged or substituted file)."""
    found = mismatch(path, pinned)
    if found is not None:
        raise MissingModelError(f"{path} ({pinned.what}) has {found}, not the pinned {pinned.checksum} (damaged, "
                                f"truncated or substituted); delete it (rm {path}) and fetch it again with "
                                "stages=[fetch]")


class HPSv2Evaluator:
    """HPSv2 score of every sample (its prompt and image).

    Args:
        name: evaluator name.
        hps_version: "v2.1" (default) or "v2.0"; recorded in `version`.
        checkpoint: local checkpoint file (None: download from the HF hub repo `xswu/HPSv2`).
        arch: open_clip architecture (ViT-H-14; tests use tiny ones).
        batch_size, device, show_progress: scoring loop ("auto": cuda if available; fp16 autocast on cuda).
        subset_key: prompt meta key whose values get their own summary rows (None: off).
    """

    def __init__(self, name: str = "hpsv2", hps_version: str = "v2.1", checkpoint: str | None = None,
                 arch: str = "ViT-H-14", batch_size: int = 16, device: str = "auto", show_progress: bool = True,
                 subset_key: str | None = "style") -> None:
        if hps_version not in CHECKPOINTS:
            raise ValueError(f"hps_version must be one of {sorted(CHECKPOINTS)}, got {hps_version!r}")
        if batch_size < 1:
            raise ValueError(f"hpsv2 batch_size must be >= 1, got {batch_size}")
        self.name, self.hps_version, self.checkpoint, self.arch = name, hps_version, checkpoint, arch
        self.batch_size, self.device, self.show_progress = batch_size, resolve_device(device), show_progress
        self.subset_key = subset_key
        self._model: tuple | None = None

    @property
    def version(self) -> str:
        """e.g. "hpsv2-1/v2.1/ViT-H-14:HPS_v2.1_compressed.pt:<sha256[:10]>" once loaded."""
        weights = self._model[3] if self._model else f"{self.arch}:{CHECKPOINTS[self.hps_version]}"
        return f"hpsv2-{VERSION}/{self.hps_version}/{weights}"

    def check(self) -> None:
        """Before generation (harness/run.py): open_clip imports here."""
        from evaluators.dependencies import require_modules

        require_modules("evaluator hpsv2", ("open_clip",), "install the harness's dependencies: pip install -e .")

    def assets(self) -> list:
        """What `load` downloads (harness/assets): the HPS checkpoint of `hps_version`, unless given."""
        from harness.assets.asset import HubFiles

        return [] if self.checkpoint else [HubFiles("evaluator hpsv2", HUB_REPO, (CHECKPOINTS[self.hps_version],))]

    def load(self) -> tuple:
        """(model, tokenizer, preprocess, weights tag), loaded once."""
        if self._model is None:
            path = hf_hub_file(HUB_REPO, CHECKPOINTS[self.hps_version], self.checkpoint)
            if self.checkpoint is None:  # the hub's file decides every score: its pinned bytes
                check_pinned(path, hub_pin(CHECKPOINTS[self.hps_version]))
            model, tokenizer, _, tag = create_open_clip(self.arch, pretrained=None, checkpoint=path, device=self.device)
            self._model = (model, tokenizer, resize_max_size, tag)
        return self._model

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """Summary `hpsv2` ("all" + per subset) and per-sample scores."""
        model, tokenizer, preprocess, _ = self.load()
        per_sample = score_samples(samples, model, tokenizer, preprocess, self.device, self.batch_size,
                                   self.name, self.show_progress)
        if self.subset_key:
            metas = [json.loads(m) for m in samples.records()["meta"]]
            values = [m.get(self.subset_key) for m in metas]
            if any(v is not None for v in values):
                per_sample[self.subset_key] = [str(v) for v in values]
        summary = mean_rows("hpsv2", per_sample, self.subset_key)
        log.info("%s: HPSv2 %.3f over %d images (%s)", self.name, summary["value"].iloc[0], len(per_sample),
                 self.version)
        return EvalResult(summary=summary, per_sample=per_sample)


__all__ = ["HPSv2Evaluator", "CHECKPOINTS", "HUB_REPO"]
