"""Raster autoregressive decoding: one token per target forward, the reference every accelerated
decoder is compared with."""
from __future__ import annotations

from typing import Sequence

import torch

from harness.api import Condition, DecodeStats, Generation, ModelBundle, SamplingParams
from harness.sampling import sample
from harness.seeding import make_generators


class RasterDecoder:
    """Samples the rows x cols grid in raster order with a static KV cache."""

    def __init__(self, sampling: SamplingParams, name: str = "raster") -> None:
        self.name = name
        self.sampling = sampling

    @torch.inference_mode()
    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """cond of batch B, seeds [B] -> tokens [B, rows*cols]."""
        model = models.target
        b = cond.batch_size
        n = model.grid[0] * model.grid[1]
        gens = make_generators(seeds, "cpu")
        model.setup_cache(b)
        logits = model.prefill(cond)  # [B, V] for position 0
        tokens = torch.empty(b, n, dtype=torch.long, device=logits.device)
        positions = torch.arange(n, device=logits.device)  # sliced per step: no allocation in the loop
        for i in range(n):
            tokens[:, i] = sample(logits, self.sampling, gens).to(logits.device)
            if i + 1 < n:
                logits = model.forward(tokens[:, i : i + 1], positions[i : i + 1])[:, 0]
        stats = [DecodeStats(target_forwards=n, tokens=n, accepted_per_step=[1] * n) for _ in range(b)]
        return Generation(tokens=tokens, stats=stats)
