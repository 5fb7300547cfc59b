"""When a decoder reads the device from the host.

Reading a tensor's value on the host (`bool(t)`, `int(t)`, `t.item()`, `t.tolist()`) waits for every
queued kernel. On the CPU that costs nothing: the values already exist. On an accelerator it drains
the launch queue, so the host's Python time adds to the device's instead of hiding behind it, and a
captured CUDA graph cannot contain it. Decoders therefore ask these functions instead of reading:

- `width(value, static)`: a data-dependent width (widest sibling set, largest resample set) is read
  on the CPU, where the narrow shape saves work, and is the static bound elsewhere (masked work,
  one shape per decoder, compiled once);
- `anything(flag)`: optional work (a re-encoding forward, a down-sampling) is skipped when no row
  needs it on the CPU, and done, masked, elsewhere;
- `Running`: the loop's "is any row unfinished" check, exact on the CPU; on an accelerator the
  answer of the previous step is copied asynchronously and read one step late, so the device always
  has a step queued, at the price of at most one extra step in which finished rows ride along.
"""
from __future__ import annotations

import torch
from torch import Tensor


def reads_are_free(device: torch.device) -> bool:
    """Whether reading device values on the host costs no synchronisation (the CPU)."""
    return device.type == "cpu"


def width(value: Tensor, static: int) -> int:
    """A 0-d integer tensor (<= static) as a Python int on the CPU; `static` elsewhere."""
    return int(value) if reads_are_free(value.device) else int(static)


def anything(flag: Tensor) -> bool:
    """Whether any element of `flag` is set, read on the CPU; True elsewhere (do the work)."""
    return bool(flag.any()) if reads_are_free(flag.device) else True


class Running:
    """`while running(active):` over active [B] bool (see the module docstring). Where reads are
    free the answer is exact; elsewhere it is the previous call's answer (on CUDA copied to pinned
    memory without blocking), so the loop runs one step past the last row's end."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pending: tuple[Tensor, torch.cuda.Event | None] | None = None

    def __call__(self, active: Tensor) -> bool:
        if reads_are_free(self.device):
            return bool(active.any())
        flag, event = active.any(), None
        if self.device.type == "cuda":
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            host.copy_(flag, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            flag = host
        previous, self._pending = self._pending, (flag, event)
        if previous is None:  # the first step: rows start unfinished
            return True
        if previous[1] is not None:
            previous[1].synchronize()  # the step before the last one: already done, or nearly
        return bool(previous[0])
