"""Token arrays in one CSV-safe text cell: little-endian int32, zlib-compressed, base64 (ASCII
letters, digits, "+", "/", "="), behind the tag "zi4:". A 32 x 32 draft of a 16,384-code tokenizer
takes about 2.5 kB of text, a 16 x 16 shapes draft a few hundred bytes; `unpack_tokens` inverts
`pack_tokens` exactly."""
from __future__ import annotations

import base64
import binascii
import zlib

import numpy as np

TAG = "zi4:"


def pack_tokens(tokens: np.ndarray) -> str:
    """tokens [N] integers in int32 range -> "zi4:<base64>"."""
    flat = np.asarray(tokens).reshape(-1)
    if flat.size and (flat.min() < np.iinfo(np.int32).min or flat.max() > np.iinfo(np.int32).max):
        raise ValueError("token ids must fit in int32 to be packed")
    raw = flat.astype("<i4").tobytes()
    return TAG + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def unpack_tokens(text: str) -> np.ndarray:
    """"zi4:<base64>" (pack_tokens) -> [N] int64; ValueError naming the problem otherwise."""
    if not isinstance(text, str) or not text.startswith(TAG):
        raise ValueError(f"a packed token column must start with {TAG!r}, got {str(text)[:20]!r}")
    try:
        raw = zlib.decompress(base64.b64decode(text[len(TAG):], validate=True))
    except (binascii.Error, zlib.error) as exc:
        raise ValueError(f"a packed token column is corrupt ({exc})") from exc
    if len(raw) % 4:
        raise ValueError(f"a packed token column holds {len(raw)} bytes, not a whole number of int32")
    return np.frombuffer(raw, dtype="<i4").astype(np.int64)
