"""The cached forward of a transformers Llama-style decoder stack (Janus-Pro's and Emu3's language
models): the layers' own weights (norms, q/k/v/o projections, MLP) run over the harness's static
KV cache (harness/models/transformer.py `attend`), so that writes at arbitrary slots, explicit
masks and draft-tree scratch slots work as for the project's GPT."""
from __future__ import annotations

from typing import Any, Sequence

from torch import Tensor, nn

from harness.models.transformer import KVCache, attend


def rotary(family: str) -> Any:
    """The family's rotate-half rotary embedding (transformers' `apply_rotary_pos_emb`)."""
    if family == "emu3":
        from transformers.models.emu3.modeling_emu3 import apply_rotary_pos_emb
    else:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    return apply_rotary_pos_emb


def run_layers(layers: nn.ModuleList, caches: Sequence[KVCache | None], x: Tensor, cos: Tensor, sin: Tensor,
               mask: Tensor, write: Tensor, heads: tuple[int, int, int], rope: Any) -> Tensor:
    """x [B, T, dim] through every layer, keys/values written to cache slots write [B, T]; cos / sin
    [B, T, hd] of the inputs' rotary positions; mask [B, T, S] bool; heads = (query heads, key/value
    heads, head width) -> [B, T, dim] before the final norm."""
    mask4 = mask[:, None]  # [B, 1, T, S]: every head
    h = x
    for layer, cache in zip(layers, caches):
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), cos, sin, mask4, write, cache, heads, rope)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return h


def _attention(att: Any, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, write: Tensor,
               cache: KVCache | None, heads: tuple[int, int, int], rope: Any) -> Tensor:
    """One Llama attention over the cache: x [B, T, dim] -> [B, T, dim]."""
    n_head, n_kv_head, head_dim = heads
    b, t, _ = x.shape
    q = att.q_proj(x).view(b, t, n_head, head_dim)
    k = att.k_proj(x).view(b, t, n_kv_head, head_dim)
    v = att.v_proj(x).view(b, t, n_kv_head, head_dim)
    q, k = rope(q, k, cos, sin, unsqueeze_dim=2)  # cos / sin [B, T, hd]; heads are dim 2 here
    return att.o_proj(attend(q, k, v, None, mask, write, cache))
