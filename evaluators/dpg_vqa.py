"""VQA backends for DPG-Bench: answer yes/no questions about images.

`mplug` is the official model (ModelScope `damo/mplug_visual-question-answering_coco_large_en`, now
also `iic/...`; heavy, version-sensitive stack: modelscope + its requirements, lazily imported).
`hf` is a transformers visual-question-answering pipeline (default `Salesforce/blip-vqa-base`): a
clearly named variant whose scores are not the official DPG-Bench numbers.
"""
from __future__ import annotations

import logging
from typing import Protocol, Sequence

import numpy as np
from PIL import Image

log = logging.getLogger(__name__)

MPLUG_MODEL = "damo/mplug_visual-question-answering_coco_large_en"
HF_MODEL = "Salesforce/blip-vqa-base"
# what the transformers pipeline reads of a BLIP-style repo: config, weights, processor and tokenizer
HF_FILES = ("config.json", "model.safetensors", "preprocessor_config.json", "processor_config.json",
            "special_tokens_map.json", "tokenizer_config.json", "tokenizer.json", "vocab.txt")
HF_REQUIRED = ("config.json", "model.safetensors")


class VQABackend(Protocol):
    """name: identifies model and settings in `evaluator_version`."""

    name: str

    def answer(self, image: np.ndarray, questions: Sequence[str]) -> list[str]:
        """image uint8 [H, W, 3] and questions -> one raw answer string per question."""
        ...


class MplugVQA:
    """The official DPG-Bench VQA model through ModelScope (lazy import; GPU recommended)."""

    def __init__(self, model: str = MPLUG_MODEL, device: str = "auto") -> None:
        self.model_id, self.device = model, device
        self.name = f"mplug:{model.split('/')[-1]}"
        self._pipe = None

    def check(self) -> None:
        """Before generation: ModelScope's mPLUG pipeline imports here (MissingDependencyError naming the fix)."""
        from evaluators.dependencies import require_modules

        require_modules("evaluator dpg_bench (vqa mplug, in process)", ("modelscope", "fairseq"),
                        "ModelScope's mPLUG needs fairseq, which does not build on Python >= 3.11. The DPG-Bench "
                        "protocol scores with the official script: evaluator=[speed,dpg_bench_official] (the default "
                        "of protocol=dpg_bench; build its environment with `python -m evaluators.official_build dpg_bench`), "
                        "or evaluator.dpg_bench.vqa._target_=evaluators.dpg_vqa.HFVQA, a named variant")

    def assets(self) -> list:
        """The ModelScope model `_pipeline` downloads (harness/assets)."""
        from harness.assets.asset import ModelScopeModel

        return [ModelScopeModel("DPG-Bench VQA (mPLUG)", self.model_id)]

    def _pipeline(self):
        if self._pipe is None:
            try:
                from modelscope.pipelines import pipeline
                from modelscope.utils.constant import Tasks
            except ImportError as exc:
                raise ImportError(
                    "the mplug VQA backend needs ModelScope and its multimodal requirements (see ELLA's "
                    "requirements-for-dpg_bench.txt: modelscope, fairseq, decord, ...); install them, or use "
                    "vqa: hf (a named variant, not the official score)") from exc
            kwargs = {} if self.device == "auto" else {"device": self.device}
            try:
                self._pipe = pipeline(Tasks.visual_question_answering, model=self.model_id, **kwargs)
            except Exception as exc:
                raise FileNotFoundError(
                    f"could not load ModelScope model {self.model_id} ({exc}). Pre-download it on a connected machine "
                    f"with `modelscope download --model {self.model_id}` and copy ~/.cache/modelscope") from exc
        return self._pipe

    def answer(self, image: np.ndarray, questions: Sequence[str]) -> list[str]:
        pipe, pil = self._pipeline(), Image.fromarray(image)
        return [str(pipe({"image": pil, "question": q})["text"]) for q in questions]


class HFVQA:
    """A transformers visual-question-answering model (BLIP-style: a processor and a model whose
    `generate` writes the answer; named variant). transformers 5 removed the VQA pipeline, so the
    processor and the model are used directly."""

    def __init__(self, model: str = HF_MODEL, device: str = "auto", batch_size: int = 16,
                 max_new_tokens: int = 10) -> None:
        self.model_id, self.device, self.batch_size, self.max_new_tokens = model, device, batch_size, max_new_tokens
        self.name = f"hf:{model}"
        self._model = None

    def assets(self) -> list:
        """The hub files the processor and model read (harness/assets); none for a local folder."""
        from pathlib import Path

        from harness.assets.asset import HubFiles

        if Path(self.model_id).expanduser().is_dir():
            return []
        return [HubFiles("DPG-Bench VQA (transformers)", self.model_id, HF_FILES, required=HF_REQUIRED)]

    def _load(self):
        if self._model is None:
            try:
                from transformers import AutoModelForVisualQuestionAnswering, AutoProcessor
            except ImportError as exc:
                raise ImportError("the hf VQA backend needs `pip install transformers`") from exc
            import torch

            device = ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device
            try:
                processor = AutoProcessor.from_pretrained(self.model_id)
                model = AutoModelForVisualQuestionAnswering.from_pretrained(self.model_id).to(device).eval()
            except OSError as exc:
                raise FileNotFoundError(
                    f"could not load {self.model_id} ({exc}); pre-download it with `hf download "
                    f"{self.model_id}` (or stages=[fetch]) and set HF_HUB_OFFLINE=1 on offline nodes") from exc
            self._model = (processor, model, device)
        return self._model

    def answer(self, image: np.ndarray, questions: Sequence[str]) -> list[str]:
        import torch

        processor, model, device = self._load()
        pil, answers = Image.fromarray(image), []
        for start in range(0, len(questions), self.batch_size):
            chunk = list(questions[start:start + self.batch_size])
            inputs = processor(images=[pil] * len(chunk), text=chunk, return_tensors="pt", padding=True).to(device)
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=self.max_new_tokens)
            answers += [str(text).strip() for text in processor.batch_decode(out, skip_special_tokens=True)]
        return answers
