"""Attention masks over KV-cache slots, built one way for the GPT and every decoder.

A mask is bool [..., T, S] (True = attend) for T queries on cache slots `query` [..., T] over S
key slots. The base is slot-causal: a query sees every slot at or before its own (whatever the
slot holds). Decoders then hide slots that are not written yet (ZipAR rows, MuLo-SD's pending
resample positions), the GPT hides padded caption slots (LlamaGen's `emb_masks`) and training
hides parallel-decoding gaps. `own=True` keeps a query's own slot visible whatever is hidden.
"""
from __future__ import annotations

import torch
from torch import Tensor


def hide(mask: Tensor, query: Tensor, hidden: Tensor, own: bool = True) -> Tensor:
    """mask [..., T, S] without the `hidden` keys: hidden [S] (hidden from every query), [..., S]
    (per row) or [..., T, S] (per query); with `own`, a query on slot s still sees slot s.
    query [..., T] are the queries' cache slots."""
    if hidden.dim() <= query.dim():
        hidden = hidden.unsqueeze(-2)  # the same keys for every query of a row
    if own:
        key = torch.arange(mask.shape[-1], device=mask.device)
        hidden = hidden & (key != query[..., None])
    return mask & ~hidden


def attention_mask(query: Tensor, slots: int, hidden: Tensor | None = None, own: bool = True) -> Tensor:
    """query [..., T] cache slots -> [..., T, S=slots] bool: slot-causal (key <= query), minus the
    `hidden` keys (see `hide`)."""
    mask = query[..., None] >= torch.arange(slots, device=query.device)
    return mask if hidden is None else hide(mask, query, hidden, own)
