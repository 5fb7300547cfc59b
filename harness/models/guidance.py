"""Classifier-free guidance as a model wrapper: the batch is doubled (conditional rows, then
unconditional rows) and logits are mixed as u + s * (c - u). Decoders never see the doubling."""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api import ARImageModel, Condition
from harness.models import chunked_logits
from harness.models.chunked_logits import Finish
from harness.models.wrapper import ModelWrapper, forwarded


class Guided(ModelWrapper):
    """Wraps an ARImageModel; exposes the same contract at the caller's batch size.

    For draft trees and EAGLE heads (harness/models/image_model.py) it also doubles `slots` and
    `move_cache`'s rows, reports `hidden` in the model's rows [2B, T, dim] (conditional rows, then
    unconditional ones: an EAGLE head runs on both, as LANTERN's does), and mixes the logits of
    `head_logits` like the target's (`guide`)."""

    hidden = forwarded("model.hidden")
    positional = forwarded("model.positional")

    def __init__(self, model: ARImageModel, scale: float) -> None:
        if scale < 0:
            raise ValueError(f"cfg scale must be >= 0, got {scale}")
        super().__init__(model)
        self.scale = float(scale)

    def setup_cache(self, batch_size: int, scratch: int = 0) -> None:
        if scratch:
            self.model.setup_cache(2 * batch_size, scratch=scratch)  # type: ignore[call-arg]
        else:
            self.model.setup_cache(2 * batch_size)

    def _mix(self, logits: Tensor) -> Tensor:
        """logits [2B, ...] (any float dtype) -> float [B, ...]: u + s * (c - u). Wide forwards
        [2B, T, V] are mixed LOGITS_CHUNK positions at a time into one float output, so that only
        the model's own logits (bf16 for bf16 weights) and the mixed ones are whole: the float copy
        of both halves and the mix's temporaries exist one chunk at a time. The same element-wise
        operations on the same values: the tokens do not change. A model whose reference mixes in
        another dtype names it in `guidance_dtype` (transformers' Janus: the gen head's dtype, as its
        `ClassifierFreeGuidanceLogitsProcessor` mixes the scores): then s * (c - u) + u in that
        dtype, returned as float."""
        mix_dtype = getattr(self.model, "guidance_dtype", None)
        if mix_dtype is not None:
            cond, uncond = logits.to(mix_dtype).chunk(2, dim=0)
            return (self.scale * (cond - uncond) + uncond).float()
        cond, uncond = logits.chunk(2, dim=0)
        chunk = chunked_logits.LOGITS_CHUNK
        if logits.dim() < 3 or logits.shape[1] <= chunk:
            cond, uncond = cond.float(), uncond.float()
            return uncond + self.scale * (cond - uncond)
        out = torch.empty(cond.shape, dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[1], chunk):
            c = cond[:, start:start + chunk].float()
            u = uncond[:, start:start + chunk].float()
            out[:, start:start + chunk] = u + self.scale * (c - u)
        return out

    guide = _mix

    @staticmethod
    def model_rows(x: Tensor) -> Tensor:
        """Caller rows [B, ...] -> model rows [2B, ...] (the same values for both halves)."""
        return torch.cat([x, x])

    def head_logits(self, h: Tensor) -> Tensor:
        """Features h [2B, T, dim] -> mixed logits [B, T, V] through the model's output layer."""
        return self._mix(self.model.head_logits(h))  # type: ignore[attr-defined]

    def prefill(self, cond: Condition) -> Tensor:
        return self._mix(self.model.prefill(cond.with_null()))

    @property
    def selects_outputs(self) -> bool:
        """Whether `forward` takes select / finish (the model's, harness/models/chunked_logits.py)."""
        return bool(getattr(self.model, "selects_outputs", False))

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,
                slots: Tensor | None = None, select: Tensor | None = None,
                finish: Finish | None = None) -> Tensor:
        """Mixed float logits [B, T, V]; with select [B, J] / finish (a model that
        `selects_outputs`): finish(mixed logits) at the selected positions [B, J, V], the model
        projecting and mixing wide forwards a chunk of positions at a time."""
        tokens2 = torch.cat([tokens, tokens])
        pos2 = positions if positions.dim() == 1 else torch.cat([positions, positions])
        mask2 = None if mask is None else torch.cat([mask, mask])
        slots2 = {} if slots is None else {"slots": slots if slots.dim() == 1 else torch.cat([slots, slots])}
        if self.selects_outputs:
            select2 = None if select is None else torch.cat([select, select])
            return self.model.forward(tokens2, pos2, mask2, mix=self._mix, select=select2,  # type: ignore[call-arg]
                                      finish=finish, **slots2)
        if select is not None or finish is not None:
            raise TypeError(f"{type(self.model).__name__} does not select outputs: use chunked_logits.selected_outputs")
        raw = {"raw": True} if getattr(self.model, "raw_logits", False) else {}  # mixed to float here
        return self._mix(self.model.forward(tokens2, pos2, mask2, **slots2, **raw))  # type: ignore[call-arg]

    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        self.model.move_cache(torch.cat([src, src]), torch.cat([dst, dst]))  # type: ignore[attr-defined]
