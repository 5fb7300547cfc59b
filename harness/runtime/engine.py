"""The decode engine (`engine` config key): how model forwards run.

    eager     every forward runs op by op (PyTorch eager; the default).
    compiled  every GPT of the bundle (target, drafter, small drafter) compiles its cached forward
              with `torch.compile`, one graph per input shape (dynamic=False); on CUDA with
              mode "reduce-overhead", so each shape is also captured as a CUDA graph and a decode
              step is one graph launch. Forward widths are padded to powers of two and each model
              has a budget of graphs of its own (harness/runtime/graphs.py); the KV caches are
              allocated once at the job's largest batch and draft tree (`reserve`). The harness's
              warm-up batch compiles and captures the shapes a decoder uses before anything is
              timed; a shape first met while timing is compiled there and counted
              (`compiled_shapes` in the log); `compile_seconds` is the time first calls took.

Decoders do not change: the same loop calls the compiled forward. Compilation needs a C++ compiler
on the CPU and Triton with a GPU of compute capability >= 7.0 on CUDA; where it cannot work the run
stops before generation, naming the cause and `engine=eager`.
"""
from __future__ import annotations

import logging
from typing import Iterable, Iterator

import torch
from torch import nn

from harness.api import ConfigValueError, ModelBundle
from harness.runtime.graphs import GRAPH_BUDGET, GraphBudget

log = logging.getLogger(__name__)

ENGINES = ("eager", "compiled")
RECOMPILE_LIMIT = GRAPH_BUDGET  # graphs per compiled model (each has a code object of its own)
_COMPILED = [0]  # models compiled by `apply` in this process
_BUDGETS: list[GraphBudget] = []  # their graph budgets (shapes met, compile seconds)


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
    setattr(config, key, max(getattr(config, key), RECOMPILE_LIMIT))  # per code object: per model
    if hasattr(config, "accumulated_recompile_limit"):  # all models together
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 8 * RECOMPILE_LIMIT)
    count = 0
    for role, gpt in _gpts(bundle):
        if not gpt.compiled:
            gpt.compile_cached(mode(device), name=f"{bundle.name}.{role}", budget=RECOMPILE_LIMIT)
            _BUDGETS.append(gpt.budget)
            count += 1
    _COMPILED[0] += count
    log.info("engine=compiled: %d model(s) compile their cached forward (mode %s)", count, mode(device))
    compiled_roles = {role for role, _ in _gpts(bundle)}
    eager = [role for role in ("target", "drafter", "small_drafter")
             if getattr(bundle, role) is not None and role not in compiled_roles]
    if eager:  # e.g. Lumina-mGPT's Chameleon LM, which has no compiled path
        log.warning("engine=compiled: model %s has no compilable cached forward for its %s; eager there",
                    bundle.name, " and ".join(eager))
    return count


def compiled_anywhere() -> bool:
    """Whether `apply` compiled a model in this process (decoders then keep input shapes few:
    resampler widths are bucketed, baselines/methods/resampling.py)."""
    return _COMPILED[0] > 0


def reserve(bundle: ModelBundle, decoders: Iterable[object], batch_size: int) -> None:
    """Allocate every GPT's KV cache once at its largest shape before a job decodes: 2 x
    `batch_size` rows (the job's largest batch, doubled by guidance) and, compiled, on the target
    the largest draft tree of `decoders` (their `cache_scratch`) plus the trash slot; decodes then
    view the store (KVCache.reuse), so captured graphs keep their buffers. Eager caches get the rows
    only: a view narrower than its store is strided, which eager attention pays for."""
    scratch = max((int(getattr(d, "cache_scratch", 0)) for d in decoders), default=0)
    for role, gpt in _gpts(bundle):
        gpt.reserve(2 * batch_size, scratch if role == "target" and gpt.compiled else 0)


def compile_seconds() -> float:
    """Seconds the models compiled in this process spent in the first call of each of their shapes
    (compiling, capturing a CUDA graph, one run): the compile time, reported apart from decodes."""
    return sum(b.compile_s for b in _BUDGETS)


def over_budget() -> list[str]:
    """Names of the models compiled in this process that met more shapes than their graph budget."""
    return [b.name for b in _BUDGETS if b.over]


def compiled_shapes() -> int:
    """Graphs compiled so far in this process (torch.compile's frame counter)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def _gpts(bundle: ModelBundle) -> Iterator[tuple[str, nn.Module]]:
    """(role, GPT) for the GPTs (modules with a cached forward that can `compile`) inside the
    bundle's models: target, drafter, small_drafter."""
    seen: set[int] = set()
    for role in ("target", "drafter", "small_drafter"):
        model = getattr(bundle, role)
        if not isinstance(model, nn.Module):
            continue
        for module in model.modules():
            if hasattr(module, "_run_layers") and id(module) not in seen:
                seen.add(id(module))
                yield role, module
