"""How much of a decode step is the method, and how much is Python, launches and the host.

    python benchmarks/engine.py [--device auto] [--steps 32] [--decoders raster,sjd,zipar,mulo_sd]

Two tables, both measured in this one run:

1. Per decoder, on the shapes world at batch 1: aten operators dispatched per target forward
   outside the models (the decode loop's own tensor work: sampling, acceptance, bookkeeping), and
   inside them; on CUDA also host synchronisations per target forward (torch.cuda sync debug mode).
   A decode loop that is to be timed on a GPU wants few of the first and none of the last.
2. Raster per-step latency of one architecture at batch 1 with CFG, against the memory floor
   (bytes a step must read, weights and KV cache, over the device bandwidth measured here with a
   large copy). On CUDA: the full-size LlamaGen-XL 512, Tar-1.5B 512 and Tar-7B 1024 AR-DTok
   architectures (conf/model, random weights, bf16), eager and `torch.compile`d. On a CPU: the
   tiny stand-ins at fp32 (a small scale), eager only.

This is a microbenchmark of single steps, not a timing of decoders (those come from the harness
pipeline, harness/generate.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import compose_config  # noqa: E402
from harness.results import _markdown  # noqa: E402
from harness.run import _build, guided  # noqa: E402

log = logging.getLogger("benchmarks.engine")
FULL_SIZE = {"llamagen_xl_512": [], "tar_1.5b_512": [], "tar_7b_1024": []}
TINY = {"llamagen_tiny": [], "tar_tiny": []}
_MODEL_CALLS = ("prefill", "forward", "decode", "encode")


class _Counter(TorchDispatchMode):
    """Counts aten operators, split by whether a model call is running."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = 0
        self.model_ops = 0
        self.loop_ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if self.inside:
            self.model_ops += 1
        else:
            self.loop_ops += 1
        return func(*args, **(kwargs or {}))


def _instrument(model: Any, counter: _Counter) -> None:
    """Wrap the model calls of `model` (an ARImageModel) so the counter knows when they run."""
    for name in _MODEL_CALLS:
        original = getattr(model, name)

        def call(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            counter.inside += 1
            try:
                return _original(*args, **kwargs)
            finally:
                counter.inside -= 1

        try:
            setattr(model, name, call)
        except AttributeError:  # a wrapper's forwarded attribute: the wrapped model is instrumented
            pass


def dispatch_table(decoders: list[str], device: torch.device) -> list[list[str]]:
    """Rows: decoder, loop ops / target forward, model ops / target forward, host syncs / forward."""
    cfg = compose_config([f"decoder=[{','.join(decoders)}]", "model=shapes"], "shapes")
    cond_text = ["a photo of a red circle"]
    rows = []
    for name in decoders:
        bundle = _build(cfg.model, drop=("name", "sampling")).to(device)  # fresh: instrumented below
        decoder = _build(cfg.decoder[name])
        models = guided(bundle, decoder.sampling)
        decoder.generate(models, models.condition(cond_text), [0])  # warm-up: caches, tables
        counter = _Counter()
        for model in (
            models.target,
            models.drafter,
            models.small_drafter,  # CFG wrappers
            bundle.target,
            bundle.drafter,
            bundle.small_drafter,
        ):  # and what they wrap
            if model is not None:
                _instrument(model, counter)
        syncs = _count_syncs(device)
        with counter, syncs:
            gen = decoder.generate(models, models.condition(cond_text), [1])
        forwards = max(gen.stats[0].target_forwards, 1)
        rows.append(
            [
                name,
                f"{forwards}",
                f"{counter.loop_ops / forwards:.1f}",
                f"{counter.model_ops / forwards:.1f}",
                "-" if syncs.count is None else f"{syncs.count / forwards:.2f}",
            ]
        )
    return rows


class _count_syncs:  # noqa: N801 (a context manager used like a function)
    """Counts host synchronisations on CUDA (sync debug mode warnings); None elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.count: int | None = None

    def __enter__(self) -> "_count_syncs":
        if self.cuda:
            import warnings

            self._catch = warnings.catch_warnings(record=True)
            self._seen = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self.count = sum("synchroniz" in str(w.message) for w in self._seen)
            self._catch.__exit__(*exc)


def bandwidth(device: torch.device, megabytes: int = 512) -> float:
    """Bytes per second of a device-to-device copy of `megabytes` (read + write counted)."""
    src = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    _sync(device)
    return 2 * src.numel() * 5 / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_table(
    models: dict[str, list[str]], device: torch.device, steps: int, compiled: bool
) -> list[list[str]]:
    """Rows: model, eager ms/step, compiled ms/step, floor ms/step (weights + KV cache / bandwidth)."""
    rate = bandwidth(device)
    rows = []
    for name, overrides in models.items():
        cfg = compose_config([f"model={name}", "model.random_init=true", *overrides], name)
        bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
        target = guided(bundle, _build(cfg.sampling, drop=())).target
        n = target.grid[0] * target.grid[1]
        target.setup_cache(1)
        logits = target.prefill(bundle.condition(["a photo of a cat"]))
        token = logits.argmax(-1, keepdim=True)
        weight_bytes = sum(p.numel() * p.element_size() for p in bundle.target.parameters())
        cache_bytes = sum(b.numel() * b.element_size() for b in bundle.target.buffers())
        eager = _ms_per_step(target.forward, token, steps, n, device)
        fast = "-"
        if compiled:
            forward = torch.compile(
                target.forward, mode="reduce-overhead" if device.type == "cuda" else "default"
            )
            fast = f"{_ms_per_step(forward, token, steps, n, device):.2f}"
        floor = (weight_bytes + cache_bytes) / rate * 1000
        rows.append([name, f"{eager:.2f}", fast, f"{floor:.3f}", f"{eager / floor:.1f}"])
    return rows


@torch.inference_mode()
def _ms_per_step(forward: Any, token: torch.Tensor, steps: int, n: int, device: torch.device) -> float:
    """Milliseconds per single-token forward, averaged over `steps` positions after 3 warm-up steps."""
    positions = torch.arange(n, device=token.device)
    for i in range(3):
        forward(token, positions[i : i + 1])
    _sync(device)
    start = time.perf_counter()
    for i in range(3, 3 + steps):
        forward(token, positions[i % n : i % n + 1])
    _sync(device)
    return (time.perf_counter() - start) / steps * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/engine.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--steps", type=int, default=32, help="timed single-token steps per model")
    ap.add_argument("--decoders", default="raster,sjd,zipar,mulo_sd", help="decoders of the dispatch table")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(
        "cuda"
        if a.device == "auto" and torch.cuda.is_available()
        else ("cpu" if a.device == "auto" else a.device)
    )
    rows = dispatch_table(a.decoders.split(","), device)
    print(_markdown(["decoder", "target fwd", "loop ops / fwd", "model ops / fwd", "syncs / fwd"], rows, 1))
    cuda = device.type == "cuda"
    models = {k: ["model.dtype=bf16"] for k in FULL_SIZE} if cuda else TINY
    rows = step_table(models, device, a.steps, compiled=cuda)
    print(
        _markdown(["model", "eager ms/step", "compiled ms/step", "floor ms/step", "eager / floor"], rows, 1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
