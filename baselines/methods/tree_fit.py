"""Whether a draft tree fits a model before anything is bound or generated (harness/run.py): the
candidates drawn per node must be distinct image codes, and every tree node off the committed chain
is a scratch cache slot whose distribution over the codes is held for each of a verification's rows.
Float32 probabilities alone give a lower bound of what the tree needs."""
from __future__ import annotations

from harness.api import ModelBundle


def tree_misfit(models: ModelBundle, rows: int, memory: int, *, width: int, width_option: str,
                slots: int, size_option: str, size_hint: str) -> tuple[str, str] | None:
    """(option, why) when a tree drawing `width` candidates per node, with `slots` scratch cache slots,
    cannot fit `models` in a verification of `rows` rows within `memory` bytes; None when it fits.
    `size_hint` ends the message of a tree too large (what to lower)."""
    vocab = int(getattr(models.target, "vocab_size", 0) or 0)
    if vocab and width > vocab:
        return width_option, (f"= {width} candidates per tree node, but model {models.name!r} has {vocab} image "
                              f"codes to draw them from; set {width_option} <= {vocab}")
    need = rows * slots * max(vocab, 1) * 4  # [rows, slots, vocab] float32 probabilities
    if need > memory:
        return size_option, (f"makes a tree of {slots} scratch cache slots, whose probabilities alone need "
                             f"{need / 2**30:.3g} GiB of the device's {memory / 2**30:.3g} GiB; {size_hint}")
    return None
