"""Per-image seeds: every image gets its own seed, which keys its random stream
(harness/runtime/randomness.py).

A seed is a stable hash of (global seed, prompt id, image index), so an image never depends on the
batch size, the shard layout, the process (no `hash()`, whose salt changes per process) or on what
ran before it.
"""
from __future__ import annotations

import hashlib
import numbers

SEED_BITS = 63  # non-negative and fits int64 (pandas / CSV columns)
_SEED_MASK = (1 << SEED_BITS) - 1
_PERSON = b"mulo-seed"  # blake2b personalisation: domain-separates these hashes from any other


def image_seed(global_seed: int, prompt_id: str, image_index: int) -> int:
    """Return the seed of image `image_index` of prompt `prompt_id` under run seed `global_seed`.

    Args:
        global_seed: the run's `seed` config value (any int).
        prompt_id: the prompt's stable id, e.g. "geneval/00042".
        image_index: which image of the prompt, >= 0.

    Returns:
        A non-negative 63-bit integer, identical in every process, platform and Python version.
    """
    if not _is_int(global_seed):
        raise TypeError(f"global_seed must be an int, got {global_seed!r}")
    if not isinstance(prompt_id, str) or not prompt_id:
        raise ValueError(f"prompt_id must be a non-empty string, got {prompt_id!r}")
    if not _is_int(image_index) or image_index < 0:
        raise ValueError(f"image_index must be an int >= 0, got {image_index!r}")
    # The prompt id goes last: the two integers cannot contain ":", so the key is unambiguous.
    key = f"{int(global_seed)}:{int(image_index)}:{prompt_id}".encode("utf-8")
    digest = hashlib.blake2b(key, digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") & _SEED_MASK


def reseeded(seed: int, draw: int) -> int:
    """Image seed `seed` of another independent draw `draw` >= 1 (draw 0 is the seed itself): the
    same prompts and images, other random numbers, e.g. raster against itself at the same N."""
    if not _is_int(draw) or draw < 0:
        raise ValueError(f"draw must be an int >= 0, got {draw!r}")
    if draw == 0:
        return int(seed)
    digest = hashlib.blake2b(f"{int(seed)}:{int(draw)}".encode(), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") & _SEED_MASK


def _is_int(value: object) -> bool:
    """True for Python and NumPy integers (seeds often come back from pandas), False for bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
