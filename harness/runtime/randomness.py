"""Per-image random streams computed on the device: counter-based uniforms, no host round trip.

Every image has one stream of uniforms in [0, 1). Element g of the stream of an image with seed s
(harness/seeding.image_seed) is a pure function of (s, g): Philox-4x32-10 (Salmon et al., SC 2011;
the generator behind torch's CUDA RNG) keyed by the seed's two 32-bit halves, counter (g // 4, 0,
0, 0), output word g % 4, of which the top 24 bits make a float32. So:

- an image never depends on its batch, its shard, the order of the batch or what ran before it
  (the stream is keyed per image, and every draw of a decoder takes the same count for every
  image, so element g is the same draw of the same step whatever the batch);
- the same seed gives the same uniforms on every device (integer arithmetic only);
- a draw is a slice of a block computed ahead on the device: the host only counts (how far the
  stream has been read is a Python int, known without looking at the device), so sampling needs
  no host synchronisation and costs one view op per draw; a block of `block` elements per
  image is computed when the read position passes the end of the previous one.

Arithmetic: int64 tensors hold 32-bit words; a 32 x 32-bit product is split into 16-bit halves
so that nothing overflows int64 (exact on every backend, no reliance on wrap-around).
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch
from torch import Tensor

from harness.runtime.seeding import SEED_BITS

WORD = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key schedule (Weyl) increments
ROUNDS = 10
DEFAULT_BLOCK = 4096  # elements per image computed at a time


def _mulhilo(a: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """a [...] int64 in [0, 2^32), m a 32-bit constant -> (high, low) 32-bit words of a * m."""
    lo_part = a * (m & 0xFFFF)  # < 2^48
    hi_part = a * (m >> 16)  # < 2^48; a * m = hi_part * 2^16 + lo_part
    middle = ((hi_part & 0xFFFF) << 16) + lo_part  # < 2^49
    return (hi_part >> 16) + (middle >> 32), middle & WORD


def philox4x32(counter: Sequence[Tensor], key: Sequence[Tensor], rounds: int = ROUNDS) -> tuple[Tensor, ...]:
    """Philox-4x32: four counter words and two key words (int64 tensors of 32-bit values that
    broadcast together) -> four output words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W[0]) & WORD, (k1 + PHILOX_W[1]) & WORD
        hi0, lo0 = _mulhilo(c0, PHILOX_M[0])
        hi1, lo1 = _mulhilo(c2, PHILOX_M[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def stream_uniforms(keys: Tensor, start: int, count: int) -> Tensor:
    """keys [B, 2] int64 (seed low, high words) -> elements start .. start + count - 1 of every
    image's stream, float32 [B, count] in [0, 1) (multiples of 2^-24)."""
    first, last = start // 4, (start + count - 1) // 4
    blocks = torch.arange(first, last + 1, device=keys.device, dtype=torch.int64)[None]  # [1, n]
    zero = torch.zeros_like(blocks)
    words = philox4x32((blocks & WORD, blocks >> 32, zero, zero), (keys[:, :1], keys[:, 1:]))
    flat = torch.stack(torch.broadcast_tensors(*words), -1).flatten(1)  # [B, 4n]: element order
    skip = start - 4 * first
    return (flat[:, skip:skip + count] >> 8).float() * (1.0 / (1 << 24))


class ImageStreams:
    """One uniform stream per image (module docstring). `draw(shape)` -> [B, *shape] float32 on
    `device`: the next prod(shape) elements of every image's stream.

    Args:
        seeds: per-image seeds [B] (ints in [0, 2^63), harness/seeding.image_seed).
        device: where the uniforms are computed and returned.
        block: elements per image computed ahead (memory: B x block x 4 bytes).
    """

    def __init__(self, seeds: Sequence[int], device: torch.device | str = "cpu",
                 block: int = DEFAULT_BLOCK) -> None:
        for seed in seeds:
            if not _is_int(seed) or not 0 <= seed < 1 << SEED_BITS:
                raise ValueError(f"seed must be an int in [0, 2**{SEED_BITS}), got {seed!r}; "
                                 "use harness.runtime.seeding.image_seed()")
        if int(block) != block or block < 1:
            raise ValueError(f"block must be an integer >= 1, got {block!r}")
        if not seeds:
            raise ValueError("ImageStreams needs at least one seed")
        self.device = torch.device(device)
        self.keys = torch.tensor([[int(s) & WORD, int(s) >> 32] for s in seeds], dtype=torch.int64,
                                 device=self.device)
        self.block = int(block)
        self.position = 0  # elements read so far (the same for every image)
        self._ahead = torch.empty(len(seeds), 0, device=self.device)  # elements from _start on
        self._start = 0

    @property
    def batch(self) -> int:
        return int(self.keys.shape[0])

    def draw(self, shape: tuple[int, ...]) -> Tensor:
        """The next prod(shape) uniforms of every image -> [B, *shape] float32."""
        count = math.prod(shape)
        end = self.position + count
        if end > self._start + self._ahead.shape[1]:  # computed ahead from the read position
            self._start = self.position
            self._ahead = stream_uniforms(self.keys, self._start, max(self.block, count))
        offset = self._ahead.storage_offset() + self.position - self._start
        self.position = end
        # every row's next `count` elements (a block's rows are dense) seen as [B, *shape]: one view
        inner = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))  # row-major strides
        return self._ahead.as_strided((self.batch, *shape), (self._ahead.stride(0), *inner), offset)


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
