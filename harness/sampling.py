"""From logits to tokens. p is always computed the same way, for every decoder and drafter:
(CFG-mixed) logits -> temperature -> top-k -> top-p -> softmax. Randomness comes only from the
per-image generators, so an image never depends on its batch."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from harness.api import SamplingParams


def filter_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> temperature-scaled logits with top-k / top-p exclusions set to -inf."""
    x = logits.float()
    if params.greedy:
        return x
    x = x / params.temperature
    if params.top_k is not None and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = sorted_x.softmax(-1).cumsum(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        drop_sorted = (cum - sorted_x.softmax(-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> p [..., V]. In greedy mode p is one-hot on the argmax."""
    if params.greedy:
        idx = logits.argmax(-1, keepdim=True)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, idx, 1.0)
    return filter_logits(logits, params).softmax(-1)


def uniforms(generators: Sequence[torch.Generator], shape: tuple[int, ...], device: torch.device) -> Tensor:
    """One draw of `shape` uniforms per image -> [B, *shape], each row from its own generator."""
    rows = [torch.rand(shape, generator=g, device=g.device) for g in generators]
    return torch.stack(rows).to(device)


def inverse_cdf(p: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sampling with given uniforms: p [..., V], u [...] in [0, 1) -> tokens [...]
    int64: the first token whose cumulative mass exceeds u (scaled to the row total, which guards
    against rounding; the clamp keeps u * total == total on the last token)."""
    cdf = p.cumsum(-1)
    scaled = (u * cdf[..., -1]).contiguous()[..., None]
    return torch.searchsorted(cdf, scaled, right=True).squeeze(-1).clamp_max(p.shape[-1] - 1)


def sample_from(p: Tensor, generators: Sequence[torch.Generator]) -> Tensor:
    """p [B, T, V] (or [B, V]) -> tokens [B, T] (or [B]) by inverse-CDF with per-row uniforms."""
    squeeze = p.dim() == 2
    p3 = p[:, None] if squeeze else p
    tok = inverse_cdf(p3, uniforms(generators, (p3.shape[1],), p3.device))  # [B, T]
    return tok[:, 0] if squeeze else tok


def sample(logits: Tensor, params: SamplingParams, generators: Sequence[torch.Generator]) -> Tensor:
    """logits [B, V] or [B, T, V] -> tokens, greedy when temperature is 0."""
    if params.greedy:
        return logits.argmax(-1)
    return sample_from(probs(logits, params), generators)
