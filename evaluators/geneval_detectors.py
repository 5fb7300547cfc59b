"""GenEval detector backends with COCO Mask2Former (Swin-S): `MMDetBackend` (the official weights,
mmdet lazily imported) and `HFMask2FormerBackend` (transformers' Detectron2-trained checkpoint:
a named variant, never the official score; see reference/evaluators.md 1.7).

Both report the 80 classes of GenEval's `object_names.txt` by detector label index (three names
differ from COCO's). `mask2former_detections` is mmdet's instance post-processing on raw query
outputs (softmax without the no-object class, top-k (query, class) pairs, bilinear upsampling
of mask logits, mask = logit > 0, score = class prob x mean sigmoid inside the mask, box = tight
box of the mask); the HF backend uses it so both share one rule.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from evaluators.geneval_rules import Detection
from harness.datasets.downloads import Pinned, fetch, resolve

log = logging.getLogger(__name__)

OBJECT_NAMES = Pinned(
    name="geneval_object_names.txt",
    url="https://raw.githubusercontent.com/djghosh13/geneval/af4902f24d3ca90ebbb446dd9891a59e0f82725f/"
        "prompts/object_names.txt",
    git_sha1="f4822dd01d0d1d2598d5e0190c121204e55925f1", what="GenEval object_names.txt @af4902f")
MMDET_CONFIG = "mask2former/mask2former_swin-s-p4-w7-224_8xb2-lsj-50e_coco.py"
MMDET_WEIGHTS = ("https://download.openmmlab.com/mmdetection/v3.0/mask2former/"
                 "mask2former_swin-s-p4-w7-224_8xb2-lsj-50e_coco/"
                 "mask2former_swin-s-p4-w7-224_8xb2-lsj-50e_coco_20220504_001756-c9d0c4f2.pth")
# Pinned by the sha256 prefix OpenMMLab puts in the file name (its publish_model convention): no
# full sha256 of this conversion is published where it could be read.
MMDET_CHECKPOINT = Pinned(name=MMDET_WEIGHTS.rsplit("/", 1)[1], url=MMDET_WEIGHTS, sha256_prefix="c9d0c4f2",
                          what="GenEval's Mask2Former Swin-S (mmdet v3.0 conversion)")
# HF repo files the transformers backend reads (config, image processor, safetensors weights)
HF_FILES = ("config.json", "preprocessor_config.json", "model.safetensors")
HF_REQUIRED = ("config.json", "model.safetensors")
HF_MODEL = "facebook/mask2former-swin-small-coco-instance"


def object_names(path: str | None = None) -> list[str]:
    """GenEval's 80 class names in detector-label order (pinned download or local file)."""
    names = [line.strip() for line in resolve(OBJECT_NAMES, path).read_text().splitlines() if line.strip()]
    if len(names) != 80:
        raise ValueError(f"object_names.txt must list 80 COCO classes, got {len(names)}")
    return names


def names_assets(path: str | None) -> list:
    """object_names.txt as an asset (harness/assets), unless a local copy is given."""
    from harness.assets.asset import UrlFile

    return [] if path else [UrlFile("GenEval object names", OBJECT_NAMES)]


def _cached_names(backend: object) -> list[str]:
    """object_names of a backend, read once and kept on it."""
    names = getattr(backend, "_names", None)
    if names is None:
        names = object_names(getattr(backend, "object_names_path"))
        setattr(backend, "_names", names)
    return names


def mask2former_detections(class_logits: torch.Tensor, mask_logits: torch.Tensor, size: tuple[int, int],
                           classes: Sequence[str], top_k: int = 100) -> list[Detection]:
    """One image's raw Mask2Former outputs -> detections (mmdet's instance post-processing).

    class_logits [Q, C+1] (last = no object), mask_logits [Q, h, w] over the valid (unpadded) image
    region, size = (H, W) of the original image.
    """
    probs = class_logits.float().softmax(-1)[:, :-1]  # [Q, C]
    num_classes = probs.shape[1]
    if num_classes != len(classes):
        raise ValueError(f"detector has {num_classes} classes but {len(classes)} class names were given")
    scores, flat = probs.flatten().topk(min(top_k, probs.numel()))
    queries, labels = flat // num_classes, flat % num_classes
    masks = torch.nn.functional.interpolate(mask_logits[queries][None].float(), size=size, mode="bilinear",
                                            align_corners=False)[0]
    binary = masks > 0
    detections = []
    for score, label, logit, mask in zip(scores, labels, masks, binary):
        area = mask.sum()
        if area == 0:
            continue
        mask_score = (logit.sigmoid() * mask).sum() / area
        ys, xs = torch.nonzero(mask, as_tuple=True)
        box = (float(xs.min()), float(ys.min()), float(xs.max()) + 1, float(ys.max()) + 1)
        detections.append(Detection(classes[int(label)], box, float(score * mask_score), mask.cpu().numpy()))
    return detections


class HFMask2FormerBackend:
    """transformers' Mask2Former (named variant "hf-mask2former", not the official GenEval detector)."""

    def __init__(self, model: str = HF_MODEL, object_names_path: str | None = None, device: str = "auto",
                 top_k: int = 100) -> None:
        self.model_id, self.top_k = model, top_k
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if device == "auto" else device))
        self.object_names_path = object_names_path
        self.name = f"hf-mask2former:{model}"
        self._model = None

    @property
    def classes(self) -> list[str]:
        """GenEval's 80 class names (read on first use)."""
        return _cached_names(self)

    def assets(self) -> list:
        """What `_load` downloads: the model's hub files (a local folder needs none) and the names."""
        from harness.assets.asset import HubFiles

        local = Path(self.model_id).expanduser().is_dir()
        return names_assets(self.object_names_path) + (
            [] if local else [HubFiles("GenEval detector (transformers)", self.model_id, HF_FILES, required=HF_REQUIRED)])

    def _load(self):
        if self._model is None:
            try:
                from transformers import AutoImageProcessor, Mask2FormerForUniversalSegmentation
            except ImportError as exc:
                raise ImportError("detector hf_mask2former needs `pip install transformers`") from exc
            try:
                processor = AutoImageProcessor.from_pretrained(self.model_id)
                model = Mask2FormerForUniversalSegmentation.from_pretrained(self.model_id).to(self.device).eval()
            except OSError as exc:
                raise FileNotFoundError(f"could not load {self.model_id} ({exc}); pre-download it with "
                                        f"`hf download {self.model_id}` (HF_HUB_OFFLINE=1 offline)") from exc
            if len(model.config.id2label) != len(self.classes):
                raise ValueError(f"{self.model_id} has {len(model.config.id2label)} labels, GenEval needs 80")
            self._model = (processor, model)
        return self._model

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """images uint8 [H, W, 3] -> detections (no GenEval threshold applied)."""
        processor, model = self._load()
        inputs = processor(images=list(images), return_tensors="pt").to(self.device)
        with torch.no_grad():
            out = model(**inputs)
        results = []
        for i, image in enumerate(images):
            valid = inputs["pixel_mask"][i] if "pixel_mask" in inputs else None
            logits = out.masks_queries_logits[i]
            if valid is not None:  # crop the mask logits to the unpadded region
                h = int(valid.any(dim=1).sum()) * logits.shape[-2] // valid.shape[0]
                w = int(valid.any(dim=0).sum()) * logits.shape[-1] // valid.shape[1]
                logits = logits[:, :max(h, 1), :max(w, 1)]
            results.append(mask2former_detections(out.class_queries_logits[i], logits, image.shape[:2],
                                                  self.classes, self.top_k))
        return results


class MMDetBackend:
    """The official GenEval detector through mmdet 3.x (same 2022-05-04 training run as GenEval's 2.x
    weights; parity with mmdet 2.x unverified). Needs mmdet + mmcv with CUDA ops."""

    def __init__(self, config: str | None = None, checkpoint: str | None = None, object_names_path: str | None = None,
                 device: str = "cuda") -> None:
        self.config, self.checkpoint, self.device = config, checkpoint, device
        self.object_names_path = object_names_path
        self.name = f"mmdet-mask2former-swin-s:{Path(checkpoint or MMDET_WEIGHTS).name}"
        self._model = None

    @property
    def classes(self) -> list[str]:
        """GenEval's 80 class names (read on first use)."""
        return _cached_names(self)

    def check(self) -> None:
        """Before generation: mmdet and mmcv import here (MissingDependencyError naming the fix)."""
        from evaluators.dependencies import require_modules

        require_modules("evaluator geneval (detector mmdet, in process)", ("mmdet", "mmcv"),
                        "mmdet 3.x with mmcv's CUDA ops does not install beside the harness's torch. The GenEval "
                        "protocol scores with the official scripts: evaluator=[speed,geneval_official] (the default "
                        "of protocol=geneval; build its environment with `python -m evaluators.official_build geneval`), "
                        "or evaluator=[speed,geneval_hf], a named variant")

    def assets(self) -> list:
        """What `_load` downloads: the detector checkpoint (unless given) and the names."""
        from harness.assets.asset import UrlFile

        return names_assets(self.object_names_path) + (
            [] if self.checkpoint else [UrlFile("GenEval detector (mmdet)", MMDET_CHECKPOINT)])

    def _load(self):
        if self._model is None:
            try:
                import mmdet
                from mmdet.apis import init_detector
            except ImportError as exc:
                raise ImportError("detector mmdet needs mmdet 3.x and mmcv with CUDA ops (GenEval README); or use "
                                  "detector hf_mask2former, a named variant") from exc
            config = self.config or str(Path(mmdet.__file__).parent / ".mim" / "configs" / MMDET_CONFIG)
            if not Path(config).is_file():
                raise FileNotFoundError(f"mmdet config {config} does not exist; give `config` (the file "
                                        f"configs/{MMDET_CONFIG} of the mmdetection source tree)")
            checkpoint = self.checkpoint or str(fetch(MMDET_CHECKPOINT))  # through assets.mirror, cached
            self._model = init_detector(config, checkpoint, device=self.device)
        return self._model

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """images uint8 [H, W, 3] RGB -> detections (mmdet's own post-processing)."""
        from mmdet.apis import inference_detector

        model = self._load()
        outputs = inference_detector(model, [np.ascontiguousarray(im[:, :, ::-1]) for im in images])  # BGR
        results = []
        for out in outputs:
            inst = out.pred_instances
            masks = inst.masks.cpu().numpy() if "masks" in inst else [None] * len(inst.scores)
            results.append([Detection(self.classes[int(label)], tuple(float(v) for v in box), float(score), mask)
                            for box, label, score, mask in zip(inst.bboxes.cpu().numpy(), inst.labels.cpu().numpy(),
                                                               inst.scores.cpu().numpy(), masks)])
        return results
