"""An oracle drafter for MuLo-SD as a decoder the harness runs, and the rows of the diagnosis of
MuLo-SD's quality loss that use it (benchmarks/mulo.py --diagnose).

`OracleDraft` decodes each batch with raster first (the same seeds: the images raster makes for
those samples), then runs MuLo-SD with its drafter replaced by a ReplayModel that drafts D_r(the
raster sample), the low-resolution view through MuLo-SD's own down-sampler: a drafter that makes no
layout mistakes. What MuLo-SD then loses to raster is the cost of verification and resampling alone.
Its forwards count MuLo-SD's decode only; the raster reference is not counted (and the diagnosis
is not timed).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from baselines.framework.canvas import Context
from benchmarks.common import variant
from harness.api import Condition, Generation, ModelBundle
from harness.models.replay import ReplayModel
from harness.run import _build

ALONE = ["accept.k=1", "accept.tau=1.0"]
DIAGNOSES = {  # config name -> (row label, overrides of MuLo-SD, oracle drafter)
    "drafter": ("drafter", [], False), "oracle_draft": ("oracle draft", [], True),
    "resampler_alone": ("k=1 tau=1 (resampler alone)", ALONE, False),
    "serial_drafter": ("serial: drafter", ["resampler.schedule=serial"], False),
    "serial_oracle": ("serial: oracle draft", ["resampler.schedule=serial"], True),
    "serial_alone": ("serial: k=1 tau=1", ["resampler.schedule=serial", *ALONE], False),
    "window4_drafter": ("window 4: drafter", ["resampler.window=4"], False),
    "window4_alone": ("window 4: k=1 tau=1", ["resampler.window=4", *ALONE], False)}


def low_view(decoder: Any, models: ModelBundle, high: torch.Tensor) -> torch.Tensor:
    """D_r with the decoder's own down-sampler: high-res tokens [B, N] -> low-res [B, n_low]."""
    draft = decoder.draft.bind(models)
    ctx = Context(models=models, cond=None, sampling=decoder.sampling, streams=None,
                  device=high.device)
    return draft.upsampler.down(high.view(-1, *models.target.grid), ctx).flatten(1)


class OracleDraft:
    """MuLo-SD (`inner`) drafting from D_r of `reference`'s tokens (a raster decoder's) per batch.
    Both are decoders or their config nodes (built here like the pipeline builds a decoder, so
    informational keys such as `requires` are dropped; the config sets `_recursive_: false`)."""

    def __init__(self, inner: Any, reference: Any) -> None:
        self.inner = inner if hasattr(inner, "generate") else _build(inner)
        self.reference = reference if hasattr(reference, "generate") else _build(reference)
        self.sampling = self.inner.sampling

    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """tokens [B, N] and stats of MuLo-SD with the replayed draft."""
        reference = self.reference.generate(models, cond, seeds).tokens
        replay = ReplayModel(models.drafter).replay(low_view(self.inner, models, reference))  # type: ignore[arg-type]
        oracle = ModelBundle(name=f"{models.name}+oracle", target=models.target, conditioner=models.conditioner,
                             drafter=replay)  # type: ignore[arg-type]
        return self.inner.generate(oracle, cond, seeds)


def diagnose_rows() -> tuple[list[str], list[str]]:
    """Overrides adding the DIAGNOSES rows, and the paths of their MuLo-SD configs."""
    out, paths = [], []
    for name, (_, extra, oracle) in DIAGNOSES.items():
        path = f"{name}.inner" if oracle else name
        out += variant(path, "mulo_sd", extra)
        if oracle:
            out += [*variant(f"{name}.reference", "raster", []), f"+decoder.{name}._recursive_=false",
                    f"+decoder.{name}._target_=benchmarks.oracle.OracleDraft"]
        paths.append(path)
    return out, paths
