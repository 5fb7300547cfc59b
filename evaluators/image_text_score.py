"""Cosine image-text scoring of a SampleSet with an open_clip model: the shared loop of HPSv2 and
CLIP score (batched, progress bar, device, fp16 autocast on CUDA as the official scripts do)."""
from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from typing import Callable

import numpy as np
import pandas as pd
import torch

from harness.api import metric_rows
from harness.progress import Meter
from harness.store.samples import SampleSet

log = logging.getLogger(__name__)

PER_SAMPLE_COLUMNS = ("sample_id", "prompt_id", "score")


def cosine_scores(model: torch.nn.Module, tokenizer: Callable, images: torch.Tensor, texts: list[str],
                  device: torch.device) -> torch.Tensor:
    """100 x cos(image_i, text_i): images float [B, 3, S, S] (preprocessed), texts B strings -> [B] float32."""
    tokens = tokenizer(texts).to(device)
    autocast = torch.autocast("cuda", dtype=torch.float16) if device.type == "cuda" else nullcontext()
    with torch.no_grad(), autocast:
        img = model.encode_image(images.to(device)).float()
        txt = model.encode_text(tokens).float()
    img = torch.nn.functional.normalize(img, dim=-1)
    txt = torch.nn.functional.normalize(txt, dim=-1)
    return (100 * (img * txt).sum(dim=-1)).cpu()


def score_samples(samples: SampleSet, model: torch.nn.Module, tokenizer: Callable,
                  preprocess: Callable[[np.ndarray], torch.Tensor], device: torch.device, batch_size: int,
                  desc: str, show_progress: bool) -> pd.DataFrame:
    """Per-sample frame (PER_SAMPLE_COLUMNS) of 100 x cosine for every complete sample.

    Missing or unreadable images raise (naming the sample); none is skipped.
    """
    records = samples.records()
    if records.empty:
        raise ValueError(f"{samples} has no complete samples; run the generate stage first")
    ids, prompts = records["sample_id"].tolist(), records["prompt"].tolist()
    scores: list[float] = []
    with Meter(len(ids), desc, "images", enabled=show_progress) as bar:
        for start in range(0, len(ids), batch_size):
            stop = min(start + batch_size, len(ids))
            batch = torch.stack([preprocess(samples.load_image(i)) for i in ids[start:stop]])
            scores += cosine_scores(model, tokenizer, batch, prompts[start:stop], device).tolist()
            bar.update(stop - start)
    return pd.DataFrame({"sample_id": ids, "prompt_id": records["prompt_id"].tolist(), "score": scores},
                        columns=list(PER_SAMPLE_COLUMNS))


def mean_rows(metric: str, per_sample: pd.DataFrame, subset_column: str | None = None,
              clamp_zero: bool = False) -> pd.DataFrame:
    """Summary: mean score (stderr over samples) for "all" and per `subset_column` value."""
    rows = [_row(metric, "all", per_sample["score"], clamp_zero)]
    if subset_column is not None and subset_column in per_sample.columns:
        for subset, values in per_sample.groupby(subset_column, sort=True)["score"]:
            rows.append(_row(metric, str(subset), values, clamp_zero))
    return metric_rows(rows)


def _row(metric: str, subset: str, values: pd.Series, clamp_zero: bool) -> dict:
    n = len(values)
    mean = float(values.mean())
    return {"metric": metric, "subset": subset, "value": max(mean, 0.0) if clamp_zero else mean,
            "stderr": float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"), "n": n,
            "higher_is_better": True}
