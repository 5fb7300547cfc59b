"""From logits to tokens. p is always computed the same way, for every decoder and drafter:
(CFG-mixed) logits -> temperature -> top-k -> top-p -> softmax (`sampling.filter_order:
top_k_first`, LlamaGen's order; `top_p_first` swaps the two filters, LANTERN's order). Randomness
comes only from the per-image streams (harness/runtime/randomness.py), so an image never depends on
its batch."""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api import SamplingParams
from harness.runtime.randomness import ImageStreams


def filter_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> temperature-scaled logits with top-k / top-p exclusions set to -inf, the
    two filters in `params.filter_order`."""
    x = logits if logits.dtype == torch.float32 else logits.float()
    if params.greedy:
        return x
    if params.temperature != 1.0:
        x = x / params.temperature
    if params.filter_order == "top_p_first":
        return _top_k(_top_p(x, params.top_p), params.top_k)
    return _top_p(_top_k(x, params.top_k), params.top_p)


def _top_k(x: Tensor, k: int | None) -> Tensor:
    """Logits outside the k largest set to -inf (ties with the k-th kept); None: unchanged."""
    if k is None or k >= x.shape[-1]:
        return x
    kth = torch.topk(x, k, dim=-1).values[..., -1:]
    return x.masked_fill(x < kth, float("-inf"))


def _top_p(x: Tensor, top_p: float) -> Tensor:
    """Nucleus filter: a token is dropped when the mass strictly before it (descending order)
    already reaches top_p, so at least one token is kept; 1.0: unchanged."""
    if top_p >= 1.0:
        return x
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    mass = sorted_x.softmax(-1)
    drop_sorted = (mass.cumsum(-1) - mass) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return x.masked_fill(drop, float("-inf"))


def probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [..., V] -> p [..., V]. In greedy mode p is one-hot on the argmax."""
    if params.greedy:
        idx = logits.argmax(-1, keepdim=True)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, idx, 1.0)
    return filter_logits(logits, params).softmax(-1)


def inverse_cdf(p: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sampling with given uniforms: p [..., V], u [...] in [0, 1) -> tokens [...]
    int64: the first token whose cumulative mass exceeds u (scaled to the row total, which guards
    against rounding; the clamp keeps u * total == total on the last token)."""
    return _inverse_cdf(p, u[..., None])


def _inverse_cdf(p: Tensor, u: Tensor) -> Tensor:
    """`inverse_cdf` with the uniforms as a column: p [..., V], u [..., 1] -> tokens [...]."""
    cdf = p.cumsum(-1)
    return torch.searchsorted(cdf, u * cdf[..., -1:], right=True).squeeze(-1).clamp_max(p.shape[-1] - 1)


def sample_from(p: Tensor, streams: ImageStreams) -> Tensor:
    """p [B, T, V] (or [B, V]) -> tokens [B, T] (or [B]) by inverse-CDF with T uniforms per image."""
    u = streams.draw((*p.shape[1:-1], 1))  # [B, 1] or [B, T, 1]
    return _inverse_cdf(p, u if u.device == p.device else u.to(p.device))


def sample(logits: Tensor, params: SamplingParams, streams: ImageStreams) -> Tensor:
    """logits [B, V] or [B, T, V] -> tokens, greedy when temperature is 0 (no uniforms drawn)."""
    if params.greedy:
        return logits.argmax(-1)
    return sample_from(probs(logits, params), streams)
