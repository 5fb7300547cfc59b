"""How much of a decode step is the method, and how much is Python, launches and the host.

    python benchmarks/engine.py [--device auto] [--steps 32] [--decoders raster,sjd,eagle2,zipar,mulo_sd]

Three tables, all measured in this one run:

1. Per decoder, on the shapes world at batch 1: aten operators dispatched per target forward
   outside the models (the decode loop's own tensor work: sampling, acceptance, bookkeeping), and
   inside them; host reads per decode step on the accelerator path (`harness/runtime/hostsync.py` told that
   reads are not free, values read with bool/int/item/tolist/torch.equal counted: each is a host
   synchronisation on a GPU; the loop's one bounded "any row left" check included, the statistics
   read once at the end of a decode not); on CUDA also
   the synchronisations torch itself reports (sync debug mode). A decode loop that is to be timed on
   a GPU wants few of the first and at most one or two of the others per step.
2. Raster per-step latency of one architecture at batch 1 with CFG, against the memory floor
   (bytes a step must read, weights and KV cache, over the device bandwidth measured here with a
   large copy), eager and with the harness's `engine=compiled` (harness/runtime/engine.py: torch.compile,
   CUDA graphs on CUDA). On CUDA: the full-size LlamaGen-XL 512, Tar-1.5B 512 and Tar-7B 1024
   AR-DTok architectures (conf/model, random weights, bf16). On a CPU: the tiny stand-ins at fp32
   (a small scale).
3. One target forward at each decoder's width (raster 1, ZipAR one token per grid row, SJD L + 1,
   EAGLE-2's tree 59, MuLo-SD's whole image N), eager, on the same architectures.

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

from baselines.framework.recorder import StatsRecorder  # noqa: E402
from benchmarks.common import compose_config  # noqa: E402
from harness.runtime import engine, hostsync  # noqa: E402
from harness.store.summary import _markdown  # noqa: E402
from harness.run import _build, guided  # noqa: E402

log = logging.getLogger("benchmarks.engine")
FULL_SIZE = {"llamagen_xl_512": [], "tar_1.5b_512": [], "tar_7b_1024": []}
TINY = {"llamagen_tiny": [], "tar_tiny": []}
# head_logits: the EAGLE head's output layer (the target's, CFG-mixed) is part of the head's forward
_MODEL_CALLS = ("prefill", "forward", "decode", "encode", "head_logits")


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
        original = getattr(model, name, None)
        if original is None:  # e.g. an EAGLE head has only `forward`
            continue

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


class _count_reads:  # noqa: N801 (a context manager used like a function)
    """Counts host reads of tensor values (each a synchronisation on a GPU) while the decoders take
    the accelerator path (hostsync.reads_are_free answers False)."""

    READERS = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist")

    def __enter__(self) -> "_count_reads":
        self.count, self.paused = 0, False
        self._saved = {name: getattr(torch.Tensor, name) for name in self.READERS}
        self._equal, self._free = torch.equal, hostsync.reads_are_free
        self._finish = StatsRecorder.finish
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, self._counted(original))
        torch.equal = self._counted(self._equal)  # type: ignore[assignment]
        hostsync.reads_are_free = lambda device: False  # type: ignore[assignment]
        StatsRecorder.finish = self._uncounted(self._finish)  # type: ignore[method-assign]
        return self

    def _counted(self, original: Any) -> Any:
        def read(*args: Any, **kwargs: Any) -> Any:
            self.count += not self.paused
            return original(*args, **kwargs)
        return read

    def _uncounted(self, original: Any) -> Any:
        """The statistics read once at the end of a decode, not per step: not counted."""
        def finish(*args: Any, **kwargs: Any) -> Any:
            self.paused = True
            try:
                return original(*args, **kwargs)
            finally:
                self.paused = False
        return finish

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        torch.equal, hostsync.reads_are_free = self._equal, self._free  # type: ignore[assignment]
        StatsRecorder.finish = self._finish  # type: ignore[method-assign]


def _steps(stats: Any) -> int:
    """Decode steps of one image: verification rounds, or forwards for one-token-per-step loops."""
    return max(len(stats.accepted_per_step) or stats.target_forwards, 1)


def dispatch_table(decoders: list[str], device: torch.device) -> list[list[str]]:
    """Rows: decoder, target forwards, steps, loop ops / forward, model ops / forward, host reads /
    step and per image (accelerator path, batch 1), CUDA syncs / step."""
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
        if getattr(bundle.target, "eagle_head", None) is not None:  # EAGLE-2 / LANTERN's drafter
            _instrument(bundle.target.eagle_head, counter)
        syncs = _count_syncs(device)
        with counter, syncs:
            gen = decoder.generate(models, models.condition(cond_text), [1])
        with _count_reads() as reads:
            steps = _steps(decoder.generate(models, models.condition(cond_text), [1]).stats[0])
        forwards = max(gen.stats[0].target_forwards, 1)
        rows.append(
            [
                name,
                f"{forwards}",
                f"{steps}",
                f"{counter.loop_ops / forwards:.1f}",
                f"{counter.model_ops / forwards:.1f}",
                f"{reads.count / steps:.2f}",
                f"{reads.count}",
                "-" if syncs.count is None else f"{syncs.count / _steps(gen.stats[0]):.2f}",
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


def _target(name: str, overrides: list[str], device: torch.device) -> tuple[Any, Any]:
    """(bundle, CFG-wrapped target) of model `name` with random weights, cache set up at batch 1."""
    cfg = compose_config([f"model={name}", "model.random_init=true", *overrides], name)
    bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
    target = guided(bundle, _build(cfg.sampling, drop=())).target
    return bundle, target


def step_table(
    models: dict[str, list[str]], device: torch.device, steps: int, compiled: bool
) -> list[list[str]]:
    """Rows: model, eager ms/step, compiled ms/step, floor ms/step (weights + KV cache / bandwidth),
    eager / floor, compiled / floor."""
    rate = bandwidth(device)
    rows = []
    for name, overrides in models.items():
        bundle, target = _target(name, overrides, device)
        eager = _ms_per_step(bundle, target, steps, device)
        weight_bytes = sum(p.numel() * p.element_size() for p in bundle.target.parameters())
        cache_bytes = sum(b.numel() * b.element_size() for b in bundle.target.buffers())
        floor = (weight_bytes + cache_bytes) / rate * 1000
        fast, ratio = "-", "-"
        if compiled:
            engine.apply(bundle, "compiled", device)
            ms = _ms_per_step(bundle, target, steps, device)
            fast, ratio = f"{ms:.2f}", f"{ms / floor:.1f}"
        rows.append([name, f"{eager:.2f}", fast, f"{floor:.3f}", f"{eager / floor:.1f}", ratio])
        del bundle, target
    return rows


@torch.inference_mode()
def _ms_per_step(bundle: Any, target: Any, steps: int, device: torch.device, width: int = 1) -> float:
    """Milliseconds per forward of `width` tokens, averaged over `steps` positions after 3 warm-up
    forwards (which compile and capture under engine=compiled)."""
    n = target.grid[0] * target.grid[1]
    target.setup_cache(1)
    logits = target.prefill(bundle.condition(["a photo of a cat"]))
    tokens = logits.argmax(-1, keepdim=True).expand(-1, width).contiguous()
    positions = torch.arange(n + width, device=tokens.device).clamp(max=n - 1)
    for i in range(3):
        target.forward(tokens, positions[i : i + width])
    _sync(device)
    start = time.perf_counter()
    for i in range(3, 3 + steps):
        at = i % max(n - width, 1)
        target.forward(tokens, positions[at : at + width])
    _sync(device)
    return (time.perf_counter() - start) / steps * 1000


def width_table(models: dict[str, list[str]], device: torch.device, steps: int) -> list[list[str]]:
    """Rows: model, then eager ms per target forward at each decoder's width (class docstring)."""
    rows = []
    for name, overrides in models.items():
        bundle, target = _target(name, overrides, device)
        rows_, cols = target.grid
        widths = {"raster": 1, "zipar": rows_, "sjd": 17, "eagle2": 59, "mulo_sd": rows_ * cols}
        cells = [f"{_ms_per_step(bundle, target, max(steps // 4, 2), device, w):.2f}" for w in widths.values()]
        rows.append([name, *cells])
        del bundle, target
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/engine.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--steps", type=int, default=32, help="timed single-token steps per model")
    ap.add_argument("--decoders", default="raster,sjd,eagle2,lantern,zipar,mulo_sd",
                    help="decoders of the dispatch table")
    ap.add_argument("--no-compile", action="store_true", help="skip the engine=compiled column")
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
    print(_markdown(["decoder", "target fwd", "steps", "loop ops / fwd", "model ops / fwd",
                     "host reads / step", "host reads / image", "CUDA syncs / step"], rows, 1))
    cuda = device.type == "cuda"
    models = {k: ["model.dtype=bf16"] for k in FULL_SIZE} if cuda else TINY
    compiled = not a.no_compile and engine.unavailable(device) is None
    rows = step_table(models, device, a.steps, compiled=compiled)
    print(_markdown(["model", "eager ms/step", "compiled ms/step", "floor ms/step", "eager / floor",
                     "compiled / floor"], rows, 1))
    rows = width_table(models, device, a.steps)
    print(_markdown(["model (ms / forward at width)", "raster 1", "zipar rows", "sjd 17", "eagle2 59",
                     "mulo_sd N"], rows, 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
