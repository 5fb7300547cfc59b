"""`TokenImageModel`: a GPT plus an image tokenizer, exposed through the ARImageModel contract."""
from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from harness.models.chunked_logits import Finish, Mix, Outputs
from harness.models.condition import TextCondition
from harness.models.gpt import GPT
from harness.models.wrapper import forwarded
from harness.models.own_rows import OwnRows


class ImageTokenizer(Protocol):
    """A vector-quantised image tokenizer (VQ-VAE / VQGAN)."""

    @property
    def codebook(self) -> Tensor: ...  # [V, D]

    def encode(self, images: Tensor) -> Tensor: ...  # uint8 [B, 3, H, W] -> int64 [B, h, w]

    def decode(self, tokens: Tensor) -> Tensor: ...  # int64 [B, h, w] -> uint8 [B, 3, H, W]


class TokenImageModel(OwnRows, nn.Module):
    """ARImageModel over `gpt.cfg.grid` tokens; images are produced by `tokenizer`.

    The KV cache lives in the GPT; `forward` is the cached forward of the contract.

    Draft trees and EAGLE heads (baselines/methods/tree_decoding.py, baselines/methods/eagle.py) read a little more:
    `setup_cache(batch, scratch)`, `forward(..., slots=)` and `move_cache` (see GPT), `hidden` (the
    last forward's hidden states after the final norm, in the rows the model ran), `model_rows` /
    `guide` (the identity here; harness/models/guidance.py doubles and mixes the rows), `positional`
    and `head_logits` (the GPT's position code and output layer), `raw_codebook` (the tokenizer's
    code vectors before any normalisation), `token_embeddings` (the GPT's input embedding of every
    code [V, dim]: GSD's token groups, baselines/methods/grouped.py) and `eagle_head`: the EAGLE head trained on this
    model's features (harness/models/eagle_head.py), or None. The head is a submodule, so it moves
    and casts with the model."""

    device = forwarded("gpt.output.weight.device")
    codebook = forwarded("tokenizer.codebook")
    cache_len = forwarded("gpt.slots")
    prefix_len = forwarded("gpt.cfg.prefix_len")
    hidden = forwarded("gpt.last_hidden")
    positional = forwarded("gpt.positional")
    token_embeddings = forwarded("gpt.tok_embeddings.weight")  # [V, dim]: the GPT's input embedding

    def __init__(self, gpt: GPT, tokenizer: ImageTokenizer, image_size: int | None = None) -> None:
        super().__init__()
        self.gpt = gpt
        self.tokenizer = tokenizer
        self.grid = gpt.cfg.grid
        self.vocab_size = gpt.cfg.vocab_size
        self.image_size = image_size
        self.eagle_head: nn.Module | None = None

    @property
    def raw_codebook(self) -> Tensor:
        """[V, D] code vectors as the tokenizer stores them (LlamaGen's VQ-16 and the shapes
        tokenizer match l2-normalised codes, `codebook`; LANTERN's neighbour table reads these)."""
        raw = getattr(self.tokenizer, "raw_codebook", None)
        return self.tokenizer.codebook if raw is None else raw

    @torch.inference_mode()
    def setup_cache(self, batch_size: int, scratch: int = 0) -> None:
        self.gpt.setup_cache(batch_size, scratch=scratch)



    def head_logits(self, h: Tensor) -> Tensor:
        """Features h [R, T, dim] in model rows -> float logits [B, T, V] in caller rows, through the
        GPT's output layer (an EAGLE head shares it)."""
        return self.guide(self.gpt.output(h.to(self.gpt.output.weight.dtype)).float())

    @torch.inference_mode()
    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        """Copy cache slots src [B, A] to dst [B, A] (GPT.move_cache)."""
        self.gpt.move_cache(src.to(self.device), dst.to(self.device))

    @torch.inference_mode()
    def prefill(self, cond: TextCondition) -> Tensor:
        return self.gpt.prefill(cond.to(self.device))

    raw_logits = True  # `forward(..., raw=True)` returns logits in the weights' dtype (guidance.py)
    selects_outputs = True  # `forward(..., select=, finish=, mix=)`: harness/models/chunked_logits.py

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,  # type: ignore[override]
                slots: Tensor | None = None, raw: bool = False, mix: Mix | None = None,
                select: Tensor | None = None, finish: Finish | None = None) -> Tensor:
        """Float logits [B, T, V] (the weights' dtype when `raw`); with any of mix / select [B, J] /
        finish: finish(mix(logits)) at the selected positions [B', J, V], wide ones computed a chunk
        of positions at a time (harness/models/chunked_logits.py)."""
        out = None
        if mix is not None or select is not None or finish is not None:
            out = Outputs(mix=mix or Tensor.float, select=None if select is None else select.to(self.device),
                          finish=finish)
        return self.gpt.forward_cached(tokens.to(self.device), positions.to(self.device),
                                       None if mask is None else mask.to(self.device),
                                       None if slots is None else slots.to(self.device), raw=raw, out=out)

    @torch.inference_mode()
    def decode(self, tokens: Tensor) -> Tensor:
        rows, cols = self.grid
        return self.tokenizer.decode(tokens.reshape(tokens.shape[0], rows, cols))

    @torch.inference_mode()
    def encode(self, images: Tensor) -> Tensor:
        tokens = self.tokenizer.encode(images)
        if tuple(tokens.shape[1:]) != self.grid:
            raise ValueError(f"images of size {tuple(images.shape[2:])} give a {tuple(tokens.shape[1:])} "
                             f"token grid; this model needs {self.grid}")
        return tokens.flatten(1)
