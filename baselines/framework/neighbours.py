"""Codebook neighbour tables: for every code of a VQ tokenizer, its nearest *other* codes in the
tokenizer's latent space (L2 distance between code vectors), nearest first.

LANTERN's latent-proximity acceptance (baselines/framework/acceptance.py) and MuLo-SD's probability pooling
read these tables. A table is computed once per codebook and kept for the life of the process:
the cache key is a hash of the codebook's values (tokenizers often return a freshly computed
tensor, e.g. l2-normalised codes, so the tensor's address is no key), plus k and the device.
"""
from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict

import torch
from torch import Tensor

log = logging.getLogger(__name__)

_ROWS_PER_CHUNK = 1024  # distance rows computed at once: memory is chunk x V floats
_MAX_TABLES = 8  # least recently used tables beyond this are dropped
_TABLES: "OrderedDict[tuple[str, int, str], Tensor]" = OrderedDict()


def codebook_digest(codebook: Tensor) -> str:
    """A stable content hash of a codebook [V, D] (shape, dtype and values)."""
    values = codebook.detach().to("cpu", torch.float32).contiguous()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{tuple(codebook.shape)}:{codebook.dtype}".encode())
    h.update(values.numpy().tobytes())
    return h.hexdigest()


def compute_neighbours(codebook: Tensor, k: int) -> Tensor:
    """codebook [V, D] -> [V, k] int64: row v lists the k codes nearest to code v (excluding v
    itself) by L2 distance, nearest first; ties keep the lower index first (stable sort)."""
    v = codebook.shape[0]
    codes = codebook.detach().float()
    rows = []
    for lo in range(0, v, _ROWS_PER_CHUNK):
        hi = min(lo + _ROWS_PER_CHUNK, v)
        dist = torch.cdist(codes[lo:hi], codes)  # [chunk, V]
        own = torch.arange(lo, hi, device=codes.device)
        dist[own - lo, own] = float("inf")  # a code is not its own neighbour
        order = torch.sort(dist, dim=1, stable=True).indices[:, :k]
        rows.append(order)
    return torch.cat(rows)


def neighbour_table(codebook: Tensor, k: int) -> Tensor:
    """The cached neighbour table of `codebook` [V, D]: [V, min(k, V - 1)] int64 on its device
    (indexable as is; LlamaGen's 16384 codes at k = 1000 take 131 MB).

    Args:
        codebook: the tokenizer's code vectors (`ARImageModel.codebook`).
        k: neighbours per code (LANTERN's k); values above V - 1 are clamped to V - 1.
    """
    if k < 1:
        raise ValueError(f"neighbour count k must be >= 1, got {k}")
    if codebook.dim() != 2 or codebook.shape[0] < 2:
        raise ValueError(f"codebook must be [V >= 2, D], got shape {tuple(codebook.shape)}")
    k = min(k, codebook.shape[0] - 1)
    key = (codebook_digest(codebook), k, str(codebook.device))
    table = _TABLES.get(key)
    if table is None:
        log.debug("computing the %d-neighbour table of a %s codebook", k, tuple(codebook.shape))
        table = compute_neighbours(codebook, k)
        _TABLES[key] = table
        while len(_TABLES) > _MAX_TABLES:
            _TABLES.popitem(last=False)
    _TABLES.move_to_end(key)
    return table
