"""Raster decoding with an annealed temperature: a new method written against the harness's
contracts only (harness.api, harness.runtime.sampling, harness.runtime.seeding), run by `python -m harness`
through a Hydra `_target_` (docs/extending.md)."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from harness.api import Condition, DecodeStats, Generation, ModelBundle, SamplingParams
from harness.runtime.sampling import sample
from harness.runtime.randomness import ImageStreams


class AnnealedRaster:
    """Raster order, one token per target forward; the temperature moves linearly from
    `start_temperature` at the first token to the run's `sampling.temperature` at the last (early
    tokens set the layout, late ones the detail). With start_temperature equal to the run's
    temperature it is raster decoding, token for token."""

    def __init__(self, sampling: SamplingParams, start_temperature: float = 1.5,
                 name: str = "annealed_raster") -> None:
        if start_temperature < 0:
            raise ValueError(f"start_temperature must be >= 0, got {start_temperature}")
        self.name = name
        self.sampling = sampling  # the harness wraps the models in CFG with sampling.cfg_scale
        self.start_temperature = start_temperature

    def _params(self, step: int, steps: int) -> SamplingParams:
        """Sampling parameters of token `step` of `steps`."""
        mix = step / max(steps - 1, 1)
        temperature = (1 - mix) * self.start_temperature + mix * self.sampling.temperature
        return dataclasses.replace(self.sampling, temperature=temperature)

    @torch.inference_mode()
    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """cond of batch B, seeds [B] (one per image) -> tokens [B, rows*cols]."""
        model = models.target
        batch, steps = cond.batch_size, model.grid[0] * model.grid[1]
        model.setup_cache(batch)
        logits = model.prefill(cond)  # [B, V]: the distribution of position 0
        streams = ImageStreams(seeds, logits.device)  # each image's randomness comes from its seed
        tokens = torch.empty(batch, steps, dtype=torch.long, device=logits.device)
        positions = torch.arange(steps, device=logits.device)
        for step in range(steps):
            tokens[:, step] = sample(logits, self._params(step, steps), streams)
            if step + 1 < steps:
                logits = model.forward(tokens[:, step:step + 1], positions[step:step + 1])[:, 0]
        stats = [DecodeStats(target_forwards=steps, tokens=steps, accepted_per_step=[1] * steps)
                 for _ in range(batch)]
        return Generation(tokens=tokens, stats=stats)
