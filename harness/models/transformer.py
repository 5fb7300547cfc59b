"""LlamaGen's transformer blocks (`autoregressive/models/gpt.py`): RMSNorm, the SwiGLU feed-forward,
2-D rotary position tables, a static per-slot KV cache, grouped-query attention and the pre-norm
block. Parameter names follow LlamaGen (`attention.wqkv`, `attention.wo`, `feed_forward.w1/w2/w3`,
`attention_norm`, `ffn_norm`); harness/models/gpt.py assembles them into the GPT.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.models.gpt_config import GPTConfig

log = logging.getLogger(__name__)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); hidden width 8/3 dim (times ffn_dim_multiplier), rounded up to
    a multiple of `multiple_of`."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        hidden = int(2 * 4 * cfg.dim / 3)
        if cfg.ffn_dim_multiplier is not None:
            hidden = int(cfg.ffn_dim_multiplier * hidden)
        hidden = -(-hidden // cfg.multiple_of) * cfg.multiple_of  # round up to a multiple
        self.w1 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, cfg.dim, bias=False)
        self.ffn_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def rope_2d_table(grid: tuple[int, int], head_dim: int, base: float, prefix_len: int,
                  prefix: str = "identity") -> Tensor:
    """Rotation table [prefix_len + rows*cols, head_dim/2, 2] (cos, sin), LlamaGen's 2-D layout:
    half of the dimension pairs encode the row, half the column. Prefix slots get no rotation
    (`prefix="identity"`) or LlamaGen's zero table (`prefix="zero"`)."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # [half/2]
    rows = torch.outer(torch.arange(grid[0]).float(), freqs)  # [R, half/2]
    cols = torch.outer(torch.arange(grid[1]).float(), freqs)  # [C, half/2]
    angles = torch.cat(
        [rows[:, None, :].expand(-1, grid[1], -1), cols[None, :, :].expand(grid[0], -1, -1)], dim=-1
    ).flatten(0, 1)  # [R*C, half]
    table = torch.stack([angles.cos(), angles.sin()], dim=-1)
    cos0 = torch.zeros(prefix_len, half) if prefix == "zero" else torch.ones(prefix_len, half)
    return torch.cat([torch.stack([cos0, torch.zeros(prefix_len, half)], dim=-1), table])


def rope_1d_table(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotary positions [B, T] and frequencies inv_freq [hd/2] -> a 1-D rotation table
    [B, T, hd/2, 2] (cos, sin) in float32 for `apply_rope`: pair j turns by position * inv_freq[j].
    The position code an EAGLE head borrows from a 1-D rotary backbone (Lumina-mGPT, Janus-Pro,
    Emu3), whose own layers rotate the same angles in the rotate-half pairing."""
    angles = positions.float()[..., None] * inv_freq.float().to(positions.device)  # [B, T, hd/2]
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """x [B, T, H, hd], table [B, T, hd/2, 2] -> x rotated pairwise (x0, x1) by (cos, sin), in
    float32 and cast back to x's dtype (LlamaGen's `apply_rotary_emb`; the GPT keeps its table
    float32 whatever its dtype)."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    table = table.float()
    cos, sin = table[:, :, None, :, 0], table[:, :, None, :, 1]
    out = torch.stack([xs[..., 0] * cos - xs[..., 1] * sin, xs[..., 1] * cos + xs[..., 0] * sin], -1)
    return out.flatten(3).type_as(x)


class KVCache(nn.Module):
    """Static cache [B, H_kv, S, hd]; `write` puts keys/values at per-row slots [B, T]. Allocate
    with `KVCache.reuse`: the cache is a view of a store allocated at the largest (rows, slots) met
    so far (or reserved up front, GPT.reserve), so a smaller batch or fewer slots zero and reuse the
    same memory; the store is reallocated only when a larger shape is asked for. The view starts at
    the store's first element, so the tensors keep their addresses, which captured CUDA graphs rely
    on."""

    def __init__(self, batch: int, n_kv_head: int, slots: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        shape = (batch, n_kv_head, slots, head_dim)
        self.k_store = torch.zeros(shape, dtype=dtype, device=device)  # not buffers: `k_cache` is
        self.v_store = torch.zeros(shape, dtype=dtype, device=device)  # (one tensor, counted once)
        self.register_buffer("k_cache", self.k_store, persistent=False)
        self.register_buffer("v_cache", self.v_store, persistent=False)

    @classmethod
    def reuse(cls, old: "KVCache | None", batch: int, n_kv_head: int, slots: int, head_dim: int,
              dtype: torch.dtype, device: torch.device) -> "KVCache":
        """A zeroed cache of `batch` rows and `slots` slots: `old` viewed at that shape when its store
        is large enough (same heads, dtype and device), else `old` (or a new cache) with a store of
        the larger of both shapes. Outside inference mode, so that the cache is an ordinary tensor
        that compiled code may update."""
        with torch.inference_mode(False), torch.no_grad():
            cache = old
            store = None if old is None else old.k_store
            if store is None or store.shape[1] != n_kv_head or store.shape[3] != head_dim \
                    or store.dtype != dtype or store.device != torch.device(device) or store.is_inference():
                cache = cls(batch, n_kv_head, slots, head_dim, dtype, device)
            elif store.shape[0] < batch or store.shape[2] < slots:
                rows, width = max(store.shape[0], batch), max(store.shape[2], slots)
                log.info("KV cache store grows from %s to %s rows x slots (reserve the largest shape up "
                         "front: GPT.reserve)", tuple(store.shape[::2]), (rows, width))
                cache.k_store = torch.zeros(rows, n_kv_head, width, head_dim, dtype=dtype, device=device)
                cache.v_store = torch.zeros_like(cache.k_store)
            assert cache is not None
            cache.k_cache = cache.k_store[:batch, :, :slots]  # a contiguous view when slots is the store's
            cache.v_cache = cache.v_store[:batch, :, :slots]
            cache.k_cache.zero_()
            cache.v_cache.zero_()
            return cache

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, slots) of the store: the largest cache this one holds without reallocating."""
        return int(self.k_store.shape[0]), int(self.k_store.shape[2])

    def write(self, slots: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """slots [B, T]; k, v [B, H_kv, T, hd]. Returns the full caches (views, not copies)."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(slots)
        # Index the slot axis through a transposed view so each batch row writes its own slots.
        self.k_cache.transpose(1, 2)[rows, slots] = k.transpose(1, 2).to(self.k_cache.dtype)
        self.v_cache.transpose(1, 2)[rows, slots] = v.transpose(1, 2).to(self.v_cache.dtype)
        return self.k_cache, self.v_cache

    def move(self, src: Tensor, dst: Tensor, rows: Tensor | None = None) -> None:
        """Copy the entries of slots src [B, A] to slots dst [B, A] of each row (the gather copies,
        so overlapping sets copy the old values); rows: arange(B)[:, None], made once by a caller
        that moves several caches."""
        if rows is None:
            rows = torch.arange(src.shape[0], device=src.device)[:, None]
        for cache in (self.k_cache, self.v_cache):  # [B, H, S, hd]: index [B, A] pairs of (row, slot)
            cache[rows, :, dst] = cache[rows, :, src]


def attend(q: Tensor, k: Tensor, v: Tensor, rope: Tensor | None, mask: Tensor | None,
           slots: Tensor | None, cache: "KVCache | None") -> Tensor:
    """Attention after the projections, shared by the GPT and the EAGLE head: q [B, T, H, hd],
    k and v [B, T, Hkv, hd] -> [B, T, H * hd]. Rotary `rope` [B, T, hd/2, 2] or None; with `slots`
    [B, T] the keys and values are written to `cache` and the queries read all of it through
    `mask` [B, 1, T, S] (None: causal over T, no cache: training); grouped heads are repeated."""
    b, t, n_head, _ = q.shape
    if rope is not None:
        q, k = apply_rope(q, rope), apply_rope(k, rope)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if slots is not None:
        if cache is None:
            raise RuntimeError("KV cache is not set up: call setup_cache(batch_size) first")
        k, v = cache.write(slots, k, v)
        k, v = k.to(q.dtype), v.to(q.dtype)
    if k.shape[1] != n_head:
        k = k.repeat_interleave(n_head // k.shape[1], dim=1)
        v = v.repeat_interleave(n_head // v.shape[1], dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    return out.transpose(1, 2).reshape(b, t, -1)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head or cfg.n_head, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, rope: Tensor | None, mask: Tensor | None, slots: Tensor | None) -> Tensor:
        """x [B, T, dim]; rope [B, T, hd/2, 2] or None; mask [B, 1, T, S] bool or None (causal,
        no cache); slots [B, T] cache slots to write, or None (training: no cache)."""
        b, t, _ = x.shape
        kv = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv, kv], dim=-1)
        q = q.view(b, t, self.n_head, self.head_dim)
        k, v = k.view(b, t, self.n_kv_head, self.head_dim), v.view(b, t, self.n_kv_head, self.head_dim)
        return self.resid_dropout(self.wo(attend(q, k, v, rope, mask, slots, self.kv_cache)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: Tensor, rope: Tensor | None, mask: Tensor | None, slots: Tensor | None) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope, mask, slots)
        return h + self.feed_forward(self.ffn_norm(h))
