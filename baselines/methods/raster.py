"""Raster autoregressive decoding: one token per target forward, the reference every accelerated
decoder is compared with."""
from __future__ import annotations

from typing import Sequence

import torch

from harness.api import Condition, DecodeStats, Generation, ModelBundle, SamplingParams
from harness.runtime.sampling import sample
from harness.runtime.randomness import ImageStreams
from harness.runtime.seeding import reseeded


class RasterDecoder:
    """Samples the rows x cols grid in raster order with a static KV cache. `draw` >= 1 decodes
    every image from another independent draw of its seed (harness/seeding.reseeded): raster
    against itself at the same prompts and N, the noise band of a quality metric."""

    def __init__(self, sampling: SamplingParams, name: str = "raster", draw: int = 0) -> None:
        if int(draw) != draw or draw < 0:
            raise ValueError(f"decoder raster draw must be an integer >= 0, got {draw!r}")
        self.name = name
        self.sampling = sampling
        self.draw = int(draw)

    @torch.inference_mode()
    def generate(self, models: ModelBundle, cond: Condition, seeds: Sequence[int]) -> Generation:
        """cond of batch B, seeds [B] -> tokens [B, rows*cols]."""
        model = models.target
        b = cond.batch_size
        n = model.grid[0] * model.grid[1]
        model.setup_cache(b)
        logits = model.prefill(cond)[:, None]  # [B, 1, V] for position 0
        streams = ImageStreams([reseeded(s, self.draw) for s in seeds], logits.device)
        positions = torch.arange(n, device=logits.device).split(1)  # [1] views, made once
        columns = []  # tokens [B, 1] of each position
        for i in range(n):
            columns.append(sample(logits, self.sampling, streams))
            if i + 1 < n:
                logits = model.forward(columns[-1], positions[i])  # [B, 1, V] for position i + 1
        tokens = torch.cat(columns, 1)
        stats = [DecodeStats(target_forwards=n, tokens=n, accepted_per_step=[1] * n) for _ in range(b)]
        return Generation(tokens=tokens, stats=stats)
