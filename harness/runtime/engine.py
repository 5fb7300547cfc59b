"""The decode engine (`engine` config key): how model forwards run.

    eager     every forward runs op by op (PyTorch eager; the default).
    compiled  every GPT of the bundle (target, drafter, small drafter) compiles its cached forward
              with `torch.compile`, one graph per input shape (dynamic=False); on CUDA with
              mode "reduce-overhead", so each shape is also captured as a CUDA graph and a decode
              step is one graph launch. The harness's warm-up batch compiles and captures the
              shapes a decoder uses before anything is timed; a shape first met while timing is
              compiled there and counted (`compiled_shapes` in the log).

Decoders do not change: the same loop calls the compiled forward. Compilation needs a C++ compiler
on the CPU and Triton with a GPU of compute capability >= 7.0 on CUDA; where it cannot work the run
stops before generation, naming the cause and `engine=eager`.
"""
from __future__ import annotations

import logging
from typing import Iterator

import torch
from torch import nn

from harness.api import ConfigValueError, ModelBundle

log = logging.getLogger(__name__)

ENGINES = ("eager", "compiled")
RECOMPILE_LIMIT = 64  # graphs per compiled forward (draft widths, resampler buckets, prefill)
_COMPILED = [0]  # models compiled by `apply` in this process


def check(engine: str, device: torch.device) -> None:
    """Stop with a ConfigValueError when `engine` is unknown or cannot work on `device`."""
    if engine not in ENGINES:
        raise ConfigValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "eager":
        return
    cause = unavailable(device)
    if cause:
        raise ConfigValueError(f"engine=compiled cannot run here: {cause}; use engine=eager")


def unavailable(device: torch.device) -> str | None:
    """Why compiled forwards cannot run on `device`, or None when they can."""
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile on CUDA needs Triton, which is not installed (pip install triton)"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 7:
            return f"the GPU has compute capability {major}.{minor}; Triton needs 7.0 or newer"
        return None
    if device.type == "cpu":
        try:
            from torch._inductor import cpp_builder
            cpp_builder.get_cpp_compiler()
        except Exception as err:  # noqa: BLE001 (any failure means no usable compiler)
            return f"torch.compile on the CPU needs a C++ compiler (g++ or clang++), none works: {err}"
        return None
    return f"torch.compile is not supported by this harness on device type {device.type!r}"


def mode(device: torch.device) -> str | None:
    """torch.compile mode: CUDA graphs on CUDA, inductor's default elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else None


def apply(bundle: ModelBundle, engine: str, device: torch.device) -> int:
    """Compile every GPT of the bundle's models under `engine` ("eager": nothing); returns how many
    were compiled."""
    if engine == "eager":
        return 0
    config = torch._dynamo.config
    key = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(config, key, max(getattr(config, key), RECOMPILE_LIMIT))
    count = 0
    for gpt in _gpts(bundle):
        if not gpt.compiled:
            gpt.compile_cached(mode(device))
            count += 1
    _COMPILED[0] += count
    log.info("engine=compiled: %d model(s) compile their cached forward (mode %s)", count, mode(device))
    return count


def compiled_anywhere() -> bool:
    """Whether `apply` compiled a model in this process (decoders then keep input shapes few:
    resampler widths are bucketed, baselines/methods/resampling.py)."""
    return _COMPILED[0] > 0


def compiled_shapes() -> int:
    """Graphs compiled so far in this process (torch.compile's frame counter)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def _gpts(bundle: ModelBundle) -> Iterator[nn.Module]:
    """The GPTs (modules with a cached forward that can `compile`) inside the bundle's models."""
    seen: set[int] = set()
    for model in (bundle.target, bundle.drafter, bundle.small_drafter):
        if not isinstance(model, nn.Module):
            continue
        for module in model.modules():
            if hasattr(module, "_run_layers") and id(module) not in seen:
                seen.add(id(module))
                yield module
