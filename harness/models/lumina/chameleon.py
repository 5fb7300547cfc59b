"""The Chameleon decoder-only LM (Lumina-mGPT's backbone) with a static, slot-indexed KV cache.

Parameter names follow transformers' Chameleon as Lumina-mGPT saves it (`model.embed_tokens`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm.{weight,bias}`,
`input_layernorm`, `post_attention_layernorm`, `mlp.{gate,up,down}_proj`, `model.norm`,
`lm_head`), so the released safetensors load strictly.

Architecture (Lumina-mGPT `lumina_mgpt/model/chameleon/modeling_chameleon.py`, commit 104abe4):
pre-norm blocks with RMSNorm (eps 1e-5), SwiGLU MLP, no biases, 1-D rotary embeddings in the
rotate-half convention (the conversion permuted q/k weights for it) applied after the query/key
norms. The query/key norm is Chameleon's per-head LayerNorm: statistics over each head's
`head_dim` features (eps 1e-5, no affine inside), then an affine (weight, bias) [shards, head_dim]
shared by the heads of one model-parallel shard (`model_parallel_size`, 1 for the 7B models),
repeated head-wise. Transformers' mainline stores one affine per head ([heads, head_dim]); both are
`qk_norm_shards` here (1 or `num_attention_heads`). `swin_norm` (post-norm blocks) is off for 7B
and refused.

Precision (Lumina-mGPT's inference runs bf16 weights under CUDA autocast): the query/key norm and
the rotation compute in float32 whatever the weights' dtype, as autocast runs them there (`layer_norm`
is one of its float32 ops; its output, times the bf16 affine and with the cos / sin tables cast to
the model's dtype, promotes to float32); queries and keys are cast to the model's dtype for
attention, as autocast casts them. In float32 nothing changes.

Cached forwards take explicit cache slots, rotary positions and a boolean mask [B, T, S]; the
layout of the sequence in the slots is the caller's (harness/models/lumina/image_model.py).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.api import ConfigValueError
from harness.models.transformer import KVCache, RMSNorm


@dataclass(frozen=True, slots=True, kw_only=True)
class ChameleonArch:
    """Sizes of a Chameleon LM (defaults: the 7B models, transformers' ChameleonConfig names)."""

    vocab_size: int = 65536
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    qk_norm_shards: int = 1  # model_parallel_size: heads sharing one q/k-norm affine

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], where: str) -> "ChameleonArch":
        """The sizes in a transformers `config.json` of a Chameleon checkpoint; options this model
        does not implement are refused with the file named."""
        unsupported = {"swin_norm": False, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
                       "hidden_act": "silu"}
        wrong = [f"{k}={config[k]!r} (supported: {v!r})" for k, v in unsupported.items()
                 if k in config and config[k] != v]
        if wrong:
            raise ConfigValueError(f"{where}: this Chameleon implementation does not support {', '.join(wrong)}")
        names = {f.name for f in fields(cls)} - {"qk_norm_shards"}
        sizes = {k: config[k] for k in names if k in config}
        sizes["qk_norm_shards"] = int(config.get("model_parallel_size", 1))
        return cls(**sizes)


class HeadNorm(nn.Module):
    """Chameleon's query/key LayerNorm: normalise each head's features, then the affine of the
    head's shard. x [B, T, H, hd] -> [B, T, H, hd]."""

    def __init__(self, shards: int, heads: int, head_dim: int) -> None:
        super().__init__()
        if heads % shards:
            raise ConfigValueError(f"{heads} heads do not split into {shards} q/k-norm shards")
        self.per_shard = heads // shards
        self.weight = nn.Parameter(torch.ones(shards, head_dim))
        self.bias = nn.Parameter(torch.zeros(shards, head_dim))

    def forward(self, x: Tensor) -> Tensor:
        """In float32 (the returned dtype), as Lumina-mGPT's bf16 run under autocast computes it."""
        x = F.layer_norm(x.float(), x.shape[-1:], None, None, eps=1e-5)
        weight, bias = self.weight.float(), self.bias.float()
        return x * weight.repeat_interleave(self.per_shard, 0) + bias.repeat_interleave(self.per_shard, 0)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions [B, T] -> cos, sin [B, T, hd] (frequencies repeated over both halves), computed in
    float32 and cast to `dtype` as transformers does."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    angles = positions.float()[..., None] * inv  # [B, T, hd/2]
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, H, T, hd] rotated in the rotate-half convention: x cos + (-x2, x1) sin, in the wider of
    x's and the tables' dtypes (float32 for the normed queries and keys)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + turned * sin[:, None]


class ChameleonAttention(nn.Module):
    def __init__(self, arch: ChameleonArch) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
        d = arch.hidden_size
        self.q_proj = nn.Linear(d, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.q_norm = HeadNorm(arch.qk_norm_shards, self.heads, self.head_dim)
        # mainline's per-head affine (shards = heads) has one affine per key head
        self.k_norm = HeadNorm(min(arch.qk_norm_shards, self.kv_heads), self.kv_heads, self.head_dim)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, slots: Tensor | None) -> Tensor:
        """x [B, T, D]; cos, sin [B, T, hd]; mask [B, 1, T, S] bool (None: causal over T, no cache);
        slots [B, T] cache slots written (None: no cache) -> [B, T, D]."""
        b, t, _ = x.shape
        q, k = self.rotated_qk(x, cos, sin)
        q, k = q.to(x.dtype), k.to(x.dtype)  # attention in the model's dtype (autocast's cast)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if slots is not None:
            if self.kv_cache is None:
                raise RuntimeError("KV cache is not set up: call setup_cache first")
            k, v = self.kv_cache.write(slots, k, v)
            k, v = k.to(q.dtype), v.to(q.dtype)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


    def rotated_qk(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, T, D] -> normed and rotated queries [B, H, T, hd] and keys [B, Hkv, T, hd], float32."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        return rotate(q, cos, sin), rotate(k, cos, sin)


class ChameleonMLP(nn.Module):
    """SwiGLU: down(silu(gate x) * up x)."""

    def __init__(self, arch: ChameleonArch) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(arch.hidden_size, arch.intermediate_size, bias=False)
        self.up_proj = nn.Linear(arch.hidden_size, arch.intermediate_size, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ChameleonLayer(nn.Module):
    def __init__(self, arch: ChameleonArch) -> None:
        super().__init__()
        self.self_attn = ChameleonAttention(arch)
        self.mlp = ChameleonMLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, slots: Tensor | None) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, slots)
        return h + self.mlp(self.post_attention_layernorm(h))


class ChameleonBody(nn.Module):
    """`model.*` of the checkpoint: token embedding, layers, final norm."""

    def __init__(self, arch: ChameleonArch) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(ChameleonLayer(arch) for _ in range(arch.num_hidden_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)


class ChameleonLM(nn.Module):
    """Chameleon with its LM head. `hidden` runs the layers (cached or not) and returns the final
    normed hidden states; callers project them on the vocabulary rows they need (`logits`)."""

    def __init__(self, arch: ChameleonArch) -> None:
        super().__init__()
        self.arch = arch
        self.model = ChameleonBody(arch)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def setup_cache(self, batch_size: int, slots: int) -> None:
        """A zeroed static cache of `slots` slots for `batch_size` rows (reused across calls)."""
        for layer in self.model.layers:
            att = layer.self_attn
            att.kv_cache = KVCache.reuse(att.kv_cache, batch_size, att.kv_heads, slots, att.head_dim,
                                         self.dtype, self.device)

    def move_cache(self, src: Tensor, dst: Tensor) -> None:
        """Copy the keys and values of cache slots src [B, A] to slots dst [B, A] in every layer."""
        rows = torch.arange(src.shape[0], device=src.device)[:, None]
        for layer in self.model.layers:
            cache = layer.self_attn.kv_cache
            if cache is None:
                raise RuntimeError("KV cache is not set up: call setup_cache first")
            cache.move(src, dst, rows)

    def hidden(self, ids: Tensor, positions: Tensor, mask: Tensor | None = None,
               slots: Tensor | None = None) -> Tensor:
        """ids [B, T] at rotary positions [B, T]; mask [B, T, S] bool (True = attend) with cache
        slots [B, T] to write, or both None (causal over T, no cache) -> hidden [B, T, D] after the
        final norm."""
        h = self.model.embed_tokens(ids)
        cos, sin = rope_cos_sin(positions, self.arch.head_dim, self.arch.rope_theta, h.dtype)
        mask = None if mask is None else mask[:, None]
        for layer in self.model.layers:
            h = layer(h, cos, sin, mask, slots)
        return self.model.norm(h)

    def logits(self, hidden: Tensor, rows: Tensor | None = None) -> Tensor:
        """hidden [B, T, D] -> float logits [B, T, V] over the vocabulary ids `rows` [V] (None: all).
        The head's rows are gathered once per (rows, weights) and kept: a decode step reads them, not
        a fresh copy."""
        if rows is None:
            return F.linear(hidden, self.lm_head.weight).float()
        weight = self.lm_head.weight
        version = 0 if weight.is_inference() else weight._version  # in-place edits of trained weights
        key = (rows.data_ptr(), rows.numel(), weight.data_ptr(), version, weight.dtype, weight.device)
        if getattr(self, "_rows_key", None) != key:
            self._rows_key, self._rows_weight = key, weight[rows].detach()
        return F.linear(hidden, self._rows_weight).float()
