"""How much of a decode step is the method, and how much is Python, launches and the host.

    python benchmarks/engine.py [--device auto] [--steps 32] [--decoders raster,sjd,sjd_pac,scd,gsd,eagle2,lantern_pp,zipar,mulo_sd]

Three tables, all measured in this one run:

1. Per decoder, on the shapes world at batch 1: aten operators dispatched per target forward
   outside the models (the decode loop's own tensor work: sampling, acceptance, bookkeeping), and
   inside them; host reads per decode step on the accelerator path (`harness/runtime/hostsync.py` told that
   reads are not free, values read with bool/int/item/tolist/torch.equal counted: each is a host
   synchronisation on a GPU; the loop's one bounded "any row left" check included, the statistics
   read once at the end of a decode not); on CUDA also
   the synchronisations torch itself reports (sync debug mode). A decode loop that is to be timed on
   a GPU wants few of the first and at most one or two of the others per step.
2. Raster per-step latency of one architecture at batch 1 and 16 with CFG, against the memory
   floor (bytes a step must read: the target GPT's weights and the KV cache it attends over, over
   the device bandwidth measured here with a large copy; the VQ decoder, the conditioner and an
   EAGLE head are not read by a raster step), eager and with the harness's `engine=compiled`
   (harness/runtime/engine.py: torch.compile, CUDA graphs on CUDA), with the compile time apart.
   On CUDA: the full-size LlamaGen-XL 512, Tar-1.5B 512 and Tar-7B 1024 AR-DTok architectures
   (conf/model, random weights, bf16) with stand-in conditioners of the right width (`stand_ins`:
   a seeded random caption encoder of FLAN-T5-XL's 2048 x 120 features, a random emitter of Tar's
   729 TA-Tok codes): no download, no transformers. On a CPU: the tiny stand-ins at fp32 (a small
   scale), or the full-size ones with `--full-size` (`--layers` reduces their depth).
3. One target forward at each decoder's width (raster 1, ZipAR one token per grid row, SJD L + 1,
   EAGLE-2's tree 59, MuLo-SD's whole image N), eager, on the same architectures.
4. `--memory MODEL`: peak memory per decoder at the protocol's batch (`--batch`, 16), counted on
   the meta device at full width and `--layers` layers (no memory, no compute) and scaled to the
   full depth (`memory_table`), with the conditioner on the same GPU beside it.
5. `--head-share`: the EAGLE head's share of an eagle2 decode's forward time (shapes world).

This is a microbenchmark of single steps, not a timing of decoders (those come from the harness
pipeline, harness/generate.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import weakref
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from baselines.framework.recorder import StatsRecorder  # noqa: E402
from benchmarks.common import compose_config  # noqa: E402
from benchmarks.conditioner_memory import conditioner_bytes  # noqa: E402
from harness.models.chunked_logits import selected_outputs  # noqa: E402
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
        log.info("dispatch row: %s", " | ".join(rows[-1]))  # printed as it finishes: a cut run keeps it
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


def stand_ins(model: Any) -> None:
    """Replace a real model config's conditioner by a seeded random stand-in of the same output
    width (no download, no transformers): LlamaGen's FLAN-T5-XL by a random caption encoder of
    `arch.caption_dim` x `arch.prefix_len` features, Tar's LLM stage by a random emitter of
    `arch.prefix_len` TA-Tok codes (the TA-Tok code embedding stays, with random weights)."""
    from omegaconf import OmegaConf

    from harness.models.tar.tatok import TATokConfig

    if "text_encoder" in model:
        model.text_encoder = OmegaConf.create({
            "_target_": "harness.models.llamagen.t5_captions.TinyTextEncoder",
            "dim": int(model.arch.caption_dim), "max_length": int(model.arch.prefix_len), "seed": int(model.seed)})
    if "llm" in model:
        codes = int((model.get("tatok") or {}).get("codebook_size", TATokConfig().codebook_size))
        model.llm = OmegaConf.create({
            "_target_": "harness.models.tar.llm.TinyCodeLM", "codebook_size": codes,
            "seq_len": int(model.arch.prefix_len), "seed": int(model.seed)})


def model_config(name: str, overrides: list[str], layers: int | None = None) -> Any:
    """The `model=name` config with random weights and stand-in conditioners; `layers`: every GPT
    (target, drafters) at that depth (full width)."""
    depth = [f"model.arch.n_layer={layers}"] if layers else []
    cfg = compose_config([f"model={name}", "model.random_init=true", *depth, *overrides], name)
    stand_ins(cfg.model)
    return cfg


def _target(name: str, overrides: list[str], device: torch.device, layers: int | None = None) -> tuple[Any, Any]:
    """(bundle, CFG-wrapped target) of model `name` with random weights and stand-in conditioners."""
    cfg = model_config(name, overrides, layers)
    bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
    target = guided(bundle, _build(cfg.sampling, drop=())).target
    return bundle, target


def floor_bytes(bundle: Any, slots: float | None = None) -> int:
    """Bytes one raster step must read: the target GPT's weights and the KV cache its attention reads
    (set up by the caller; `slots`: only that many slots of it, the filled prefix), not the VQ
    decoder, the conditioner or an EAGLE head."""
    gpt = bundle.target.gpt
    weights = sum(p.numel() * p.element_size() for p in gpt.parameters())
    cache = 0.0
    for layer in gpt.layers:
        kv = layer.attention.kv_cache
        if kv is None:
            continue
        store = 2 * kv.k_cache.numel() * kv.k_cache.element_size()
        cache += store if slots is None else store * min(slots / kv.k_cache.shape[2], 1.0)
    return int(weights + cache)


STEP_COLUMNS = ["model", "batch", "engine", "ms/step", "compile s", "cudagraph skips", "floor ms/step",
                "filled floor ms/step", "/ floor", "/ filled floor"]


def step_table(models: dict[str, list[str]], device: torch.device, steps: int, compiled: bool,
               batches: tuple[int, ...] = (1,), layers: int | None = None) -> list[list[str]]:
    """Rows (STEP_COLUMNS): per model, its eager row at every batch first, then its compiled rows,
    each logged as soon as it is measured (a run cut while compiling keeps its eager rows).
    floor: the target GPT's weights + its whole KV cache store over the measured bandwidth (what
    the static-shape attention reads); filled floor: weights + the KV of the slots the timed steps
    have filled (prefix + image positions so far: what attention over the filled prefix alone would
    read). Compiled, the prefill stays eager (`GPT.eager_prefill`), so a batch compiles one graph,
    the T = 1 step; cudagraph skips: the CUDA-graph captures inductor skipped during the row (the
    step then ran without a CUDA graph; "-" off CUDA)."""
    rate = bandwidth(device)
    rows = []
    for name, overrides in models.items():
        for engine_name in ("eager", "compiled") if compiled else ("eager",):
            for batch in batches:
                rows.append(_step_row(name, overrides, device, steps, batch, engine_name, rate, layers))
                log.info("step row: %s", " | ".join(rows[-1]))
    return rows


def _step_row(name: str, overrides: list[str], device: torch.device, steps: int, batch: int, engine_name: str,
              rate: float, layers: int | None) -> list[str]:
    """One row of the step table (STEP_COLUMNS) on a freshly built model."""
    bundle, target = _target(name, overrides, device, layers)
    compile_s, skips = "-", "-"
    if engine_name == "compiled":
        engine.apply(bundle, "compiled", device)
        bundle.target.gpt.eager_prefill = True
        engine.reserve(bundle, [], batch)  # the trash slot: allocated before any graph is captured
        before, skipped = engine.compile_seconds(), cudagraph_skips()
    ms, filled_slots = _ms_per_step(bundle, target, steps, device, batch=batch)
    if engine_name == "compiled":
        compile_s = f"{engine.compile_seconds() - before:.1f}"
        skips = f"{cudagraph_skips() - skipped}" if device.type == "cuda" else "-"
    floor = floor_bytes(bundle) / rate * 1000
    filled = floor_bytes(bundle, filled_slots) / rate * 1000
    return [name, str(batch), engine_name, f"{ms:.2f}", compile_s, skips, f"{floor:.3f}", f"{filled:.3f}",
            f"{ms / floor:.1f}", f"{ms / filled:.1f}"]


def cudagraph_skips() -> int:
    """CUDA-graph captures inductor has skipped in this process (a mutated input, a CPU tensor, ...)."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])


@torch.inference_mode()
def _ms_per_step(bundle: Any, target: Any, steps: int, device: torch.device, width: int = 1,
                 batch: int = 1) -> tuple[float, float]:
    """(milliseconds per forward of `width` tokens at `batch` images, averaged over `steps`
    positions after 3 warm-up forwards (which compile and capture under engine=compiled: their
    time is the compile time, engine.compile_seconds); the mean KV slots those forwards' queries
    attend to: the prefix and the image positions up to theirs)."""
    n = target.grid[0] * target.grid[1]
    target.setup_cache(batch)
    logits = target.prefill(bundle.condition(["a photo of a cat"] * batch))
    tokens = logits.argmax(-1, keepdim=True).expand(-1, width).contiguous()
    positions = torch.arange(n + width, device=tokens.device).clamp(max=n - 1)
    for i in range(3):
        target.forward(tokens, positions[i : i + width])
    _sync(device)
    start = time.perf_counter()
    ats = []
    for i in range(3, 3 + steps):
        at = i % max(n - width, 1)
        ats.append(at)
        target.forward(tokens, positions[at : at + width])
    _sync(device)
    prefix = bundle.target.gpt.cfg.prefix_len
    filled = prefix + sum(min(at + width, n) for at in ats) / len(ats)
    return (time.perf_counter() - start) / steps * 1000, filled


def width_table(models: dict[str, list[str]], device: torch.device, steps: int,
                layers: int | None = None) -> list[list[str]]:
    """Rows: model, then eager ms per target forward at each decoder's width (class docstring)."""
    rows = []
    for name, overrides in models.items():
        bundle, target = _target(name, overrides, device, layers)
        rows_, cols = target.grid
        widths = {"raster": 1, "zipar": rows_, "sjd": 17, "eagle2": 59, "mulo_sd": rows_ * cols}
        cells = [f"{_ms_per_step(bundle, target, max(steps // 4, 2), device, w)[0]:.2f}" for w in widths.values()]
        rows.append([name, *cells])
        del bundle, target
    return rows


class _LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages created while the mode is on and still alive; `peak` is the most
    at once. Storages are followed through their Python objects (kept one per storage by torch):
    an output sharing an input's storage (a view, an in-place result) adds nothing, and the bytes
    go when the last tensor of a storage goes."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = {id(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:  # views and in-place results share an input's storage: not new
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in given:
                self._follow(t.untyped_storage())
        return out

    def _follow(self, storage: Any) -> None:
        if id(storage) in self._seen:
            return
        size = storage.nbytes()
        self._seen.add(id(storage))
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, id(storage), size)

    def _free(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size


def _efficient_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
                         is_causal: bool = False) -> torch.Tensor:
    """What CUDA's memory-efficient attention allocates (no [T, S] score matrix): the additive mask
    in the query's dtype and the output. Used only while memory is counted on the meta device."""
    if attn_mask is not None:
        torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~attn_mask, float("-inf"))
    return torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)


def memory_table(names: list[str], batch: int, layers: int) -> list[list[str]]:
    """Rows: model, decoder, widest target forward (tokens), GPT weights GB, KV cache GB, transient
    GB, peak GB: the decoder's peak memory at `batch` images under guidance, at full depth.

    Counted, not timed: each model is built at full width and `layers` layers (random weights,
    stand-in conditioners), moved to the meta device, and the decoder's widest target forward runs
    there with its guidance mix and the float softmax the decoder takes of the mixed logits, under a
    counter of live tensor bytes (`_LiveBytes`; attention counted as CUDA's memory-efficient kernel
    allocates, `_efficient_attention`). Scaling to the model's full depth L: weights = outside-layer
    weights + L x one layer's; KV cache = L x one layer's (at the decoder's rows and slots); the
    transient (activations, logits, mix, softmax) does not grow with depth, as eager forwards free
    each layer's activations before the next. MuLo-SD adds its drafter's weights and KV cache
    (same family, full depth), EAGLE-2 / LANTERN their head. Then the conditioner on the same GPU
    (FLAN-T5-XL's encoder; Tar's LLM and the KV cache of its batched generate:
    benchmarks/conditioner_memory.py) and the peak with it; the VQ decoder is not counted."""
    from harness.models import transformer

    rows = []
    for name in names:
        full = int(compose_config([f"model={name}"], name).model.arch.n_layer)
        conditioner = conditioner_bytes(name, rows=batch)  # on the same GPU (benchmarks/conditioner_memory.py)
        bundle, target = _target(name, ["model.dtype=bf16"], torch.device("cpu"), layers)
        bundle.to("meta")
        gpt, grid = bundle.target.gpt, bundle.target.grid
        n = grid[0] * grid[1]
        widths = {"raster": 1, "zipar": grid[0], "lantern": 59, "mulo_sd": n}
        per_layer = sum(p.numel() * p.element_size() for p in gpt.layers[0].parameters())
        outside = sum(p.numel() * p.element_size() for p in gpt.parameters()) - layers * per_layer
        for decoder, width in widths.items():
            target.setup_cache(batch, scratch=59 if decoder == "lantern" else 0)
            kv = gpt.layers[0].attention.kv_cache
            kv_layer = 2 * kv.k_cache.numel() * kv.k_cache.element_size()
            tokens = torch.zeros(batch, width, dtype=torch.long, device="meta")
            with torch.inference_mode(), _patched(transformer.F, "scaled_dot_product_attention",
                                                  _efficient_attention), _LiveBytes() as live:
                positions = torch.arange(width, device="meta")
                if decoder == "mulo_sd":  # the verification's p at N + 1 inputs, as _verify reads it
                    select = torch.arange(width + 1, device="meta").clamp(max=width - 1).expand(batch, -1)
                    probs = selected_outputs(target, tokens, positions, select, partial(torch.softmax, dim=-1))
                else:
                    logits = target.forward(tokens, positions)
                    probs = torch.softmax(logits, -1)
                    del logits
                del probs
            weights, cache = outside + full * per_layer, full * kv_layer
            if decoder == "mulo_sd" and bundle.drafter is not None:
                small = bundle.drafter.gpt
                layer_d = sum(p.numel() * p.element_size() for p in small.layers[0].parameters())
                weights += sum(p.numel() * p.element_size() for p in small.parameters()) + (full - layers) * layer_d
                att = small.layers[0].attention  # k and v, 2B rows under guidance, bf16
                cache += full * 2 * 2 * batch * att.n_kv_head * small.slots * att.head_dim * 2
            head = getattr(bundle.target, "eagle_head", None)
            if decoder == "lantern" and head is not None:
                weights += sum(p.numel() * p.element_size() for p in head.parameters())
            peak = weights + cache + live.peak
            gb = [x / 1e9 for x in (weights, cache, live.peak, peak, conditioner, peak + conditioner)]
            rows.append([name, decoder, str(width), *(f"{x:.2f}" for x in gb)])
            log.info("memory row: %s", " | ".join(rows[-1]))
        del bundle, target
    return rows


class _patched:  # noqa: N801 (a context manager used like a function)
    """Set `owner.name` to `value` while the block runs."""

    def __init__(self, owner: Any, name: str, value: Any) -> None:
        self.owner, self.name, self.value = owner, name, value

    def __enter__(self) -> None:
        self.saved = getattr(self.owner, self.name)
        setattr(self.owner, self.name, self.value)

    def __exit__(self, *exc: Any) -> None:
        setattr(self.owner, self.name, self.saved)


def head_share(device: torch.device, prompts: int = 2) -> list[list[str]]:
    """Rows: decoder, ms in target forwards, ms in EAGLE-head calls (its forward and the output
    layer it borrows), head share of the two: eagle2 and lantern on the shapes world at batch 1,
    eager (the head is not compiled under engine=compiled; docs/methodology.md)."""
    cfg = compose_config(["decoder=[eagle2,lantern]", "model=shapes"], "shapes")
    rows = []
    for name in ("eagle2", "lantern"):
        bundle = _build(cfg.model, drop=("name", "sampling")).to(device)
        decoder = _build(cfg.decoder[name])
        models = guided(bundle, decoder.sampling)
        decoder.generate(models, models.condition(["a photo of a red circle"]), [0])  # warm-up
        spent = {"target": 0.0, "head": 0.0}
        _time_calls(bundle.target.gpt, "forward_cached", spent, "target", device)
        _time_calls(bundle.target.gpt, "prefill", spent, "target", device)
        _time_calls(bundle.target.eagle_head, "forward", spent, "head", device)
        _time_calls(bundle.target, "head_logits", spent, "head", device)
        for seed in range(prompts):
            decoder.generate(models, models.condition(["a photo of a red circle and a blue square"]), [seed])
        share = spent["head"] / max(spent["head"] + spent["target"], 1e-9)
        rows.append([name, f"{spent['target'] * 1000:.1f}", f"{spent['head'] * 1000:.1f}", f"{share:.1%}"])
        log.info("head row: %s", " | ".join(rows[-1]))
    return rows


def _time_calls(owner: Any, name: str, spent: dict[str, float], key: str, device: torch.device) -> None:
    """Add the wall time of every call of `owner.name` to spent[key] (synchronised on CUDA)."""
    original = getattr(owner, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        _sync(device)
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            _sync(device)
            spent[key] += time.perf_counter() - start

    setattr(owner, name, call)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/engine.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--steps", type=int, default=32, help="timed single-token steps per model")
    ap.add_argument("--decoders", default="raster,sjd,sjd_pac,scd,gsd,eagle2,lantern,lantern_pp,zipar,mulo_sd",
                    help="decoders of the dispatch table")
    ap.add_argument("--no-compile", action="store_true", help="skip the engine=compiled column")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tables", default="dispatch,steps,widths",
                    help="tables to print: dispatch, steps, widths, memory, head (comma-separated)")
    ap.add_argument("--full-size", action="store_true", help="the full-size models also off CUDA")
    ap.add_argument("--models", default=None, help="models of the step and width tables (comma-separated)")
    ap.add_argument("--layers", type=int, default=None, help="GPT depth of the built models (full width)")
    ap.add_argument("--batches", default="1", help="batch sizes of the step table (comma-separated)")
    ap.add_argument("--batch", type=int, default=16, help="the protocol's batch of the memory table")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = _device(a.device)
    tables = set(a.tables.split(","))
    cuda = device.type == "cuda"
    names = a.models.split(",") if a.models else list(FULL_SIZE if cuda or a.full_size else TINY)
    models = {k: ["model.dtype=bf16"] if k in FULL_SIZE else [] for k in names}
    if "dispatch" in tables:
        rows = dispatch_table(a.decoders.split(","), device)
        print(_markdown(["decoder", "target fwd", "steps", "loop ops / fwd", "model ops / fwd",
                         "host reads / step", "host reads / image", "CUDA syncs / step"], rows, 1), flush=True)
    if "steps" in tables:
        compiled = not a.no_compile and engine.unavailable(device) is None
        batches = tuple(int(b) for b in a.batches.split(","))
        rows = step_table(models, device, a.steps, compiled=compiled, batches=batches, layers=a.layers)
        print(_markdown(STEP_COLUMNS, rows, 1), flush=True)
    if "widths" in tables:
        rows = width_table(models, device, a.steps, layers=a.layers)
        print(_markdown(["model (ms / forward at width)", "raster 1", "zipar rows", "sjd 17", "eagle2 59",
                         "mulo_sd N"], rows, 1), flush=True)
    if "memory" in tables:
        rows = memory_table([n for n in names if n in FULL_SIZE] or list(FULL_SIZE), a.batch, a.layers or 2)
        print(_markdown(["model", "decoder", "widest forward", "GPT weights GB", "KV cache GB", "transient GB",
                         "peak GB", "conditioner GB", "peak with conditioner GB"], rows, 2), flush=True)
    if "head" in tables:
        rows = head_share(device)
        print(_markdown(["decoder", "target forward ms", "EAGLE head ms", "head share"], rows, 1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
