"""The rows an image model runs when nothing wraps it: the caller's own. Guidance
(harness/models/guidance.py) doubles them and mixes them back; an unwrapped model's EAGLE head reads
and writes the caller's rows as they are."""
from __future__ import annotations

from torch import Tensor


class OwnRows:
    """Mixin of an image model (GPT, Lumina-mGPT, Janus-Pro, Emu3): `model_rows` and `guide`, the
    identities that `Guided` replaces."""

    @staticmethod
    def model_rows(x: Tensor) -> Tensor:
        """Caller rows [B, ...] -> the rows the model runs (the same rows: no guidance)."""
        return x

    @staticmethod
    def guide(logits: Tensor) -> Tensor:
        """Logits in model rows -> caller rows (the identity: no guidance)."""
        return logits
