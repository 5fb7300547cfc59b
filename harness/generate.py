"""Timed generation into SampleSets: the only place in the project that measures time.

`generate_all` makes the pending samples of every decoder of a job (docs/methodology.md, "Timing"):

1. warm-up: each decoder decodes its first `warmup_batches` timed batches once, untimed and
   discarded, before any decoder's first timed decode;
2. timed pass: the first `timing.images` images of the job's plan (all of them when null), in
   batches of `timing.batch_size`, each batch decoded `timing.reps` times. With
   `timing.order: interleaved` the decoders take turns batch by batch and repetition by
   repetition (A B C, B C A, C A B, ...: the first decoder rotates), so load that comes and goes
   lands on every decoder alike; `sequential` times one decoder after the other (A A B B C C: the
   order before issue 31, kept for comparison);
3. untimed pass: the rest of the plan, decoder by decoder, in batches of `batch_size`, decoded once.

Before the timed pass, with `warmup_batches` > 0, each decoder that has untimed images decodes its
first untimed batch (written like any untimed batch), so that every batch size the job decodes at
is measured; the budget (harness/budget.py) is then printed.

A repetition runs condition -> decode -> tokens to pixels; the decode is the latency the speed
evaluator reports. Conditions come through the job's condition cache (harness/store/conditions.py):
Tar's LLM and LlamaGen's text encoder run once per (prompt, image seed) or per prompt, whichever
decoder, repetition or shard meets the image first, and `condition_s` is what computing the batch's
conditions cost when they were computed, the same for every decoder. When the timing batch is
smaller than `batch_size`, the timed images' entries are computed first, `batch_size` per call.

`Stopwatch` synchronises the device around each part and records wall time, the CPU time of the
decoding thread (CPU devices: a thread that other processes keep off the CPU shows wall time without
CPU time), on CUDA the time between two CUDA events, and, where the kernel reports it (Linux
`/proc/self/task/*/schedstat`), the time the process's threads ran and the time they were runnable
but waited for a CPU: waiting is what another process's load costs a decode, and it is about 0 on a
quiet machine whatever the decode's own variation (docs/methodology.md).

Stats rows (stats.csv, one per image; timing columns repeat over a batch's images):
    timed               true for timed images, false for the untimed pass
    batch_latency_s     median over the repetitions of the decode's wall time (null when untimed)
    latency_reps_s      every repetition's decode wall time, space-separated, in decode order
    cpu_reps_s          CPU devices: the decoding thread's CPU time of each repetition
    device_reps_s       CUDA: the CUDA-event time of each repetition's decode
    run_reps_s, wait_reps_s   where the kernel reports them: the seconds the process's threads
                        ran, and waited runnable for a CPU, during each repetition's decode (summed
                        over threads)
    condition_s         the recorded cost of computing the batch's conditions (the condition
                        cache's entries, each counted once per batch; harness/store/conditions.py)
                        plus the time of the rest of the condition call, median over repetitions
    image_decode_s      median over the repetitions
    peak_memory_bytes   CUDA: the allocator's peak during the batch's decodes; CPU: the process's
                        peak RSS so far
Images are the first repetition's. An image's draws depend only on (seed, prompt id, image index),
never on the order, the repetition or the batch it was decoded in (its tokens neither, on the CPU in
fp32; in bf16 on CUDA other kernels for other batches can move a logit's last bits).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import resource
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import torch

from harness.runtime import engine
from harness.api import ConfigValueError, Decoder, ModelBundle
from harness.budget import Conditioning, Cost, EvaluateCost, Work, estimate
from harness.progress import progress
from harness.store.conditions import ConditionCache, Ledger, cacheable
from harness.store.samples import SampleSet, SampleSpec

log = logging.getLogger(__name__)

ORDERS = ("interleaved", "sequential")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Timing:
    """How decoders are timed: the `timing` node of conf/config.yaml (documented there)."""

    reps: int = 2
    order: str = "interleaved"
    images: int | None = None
    batch_size: int | None = None
    noise_threshold: float = 0.1

    def __post_init__(self) -> None:
        def whole(value: Any, low: int) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= low

        if not whole(self.reps, 1):
            raise ConfigValueError(f"timing.reps must be an integer >= 1, got {self.reps!r}")
        if self.order not in ORDERS:
            raise ConfigValueError(f"timing.order must be one of {list(ORDERS)}, got {self.order!r}")
        if self.images is not None and not whole(self.images, 0):
            raise ConfigValueError(f"timing.images must be null (every image) or an integer >= 0, "
                                   f"got {self.images!r}")
        if self.batch_size is not None and not whole(self.batch_size, 1):
            raise ConfigValueError(f"timing.batch_size must be null (batch_size) or an integer >= 1, "
                                   f"got {self.batch_size!r}")
        threshold = self.noise_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold > 0 \
                or not math.isfinite(threshold):
            raise ConfigValueError(f"timing.noise_threshold must be a number > 0, got {threshold!r}")

    @classmethod
    def from_config(cls, node: Any) -> "Timing":
        """From the `timing` config node (a mapping; absent keys keep their defaults)."""
        values = dict(node or {})
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigValueError(f"unknown timing keys {unknown}; the keys are "
                                   f"{sorted(cls.__dataclass_fields__)} (conf/config.yaml)")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Job:
    """One decoder of a job: its name (the SampleSet's folder and the `decoder` column), the decoder,
    the models it decodes with (guided for its sampling) and its bound SampleSet."""

    name: str
    decoder: Decoder
    models: ModelBundle
    sample_set: SampleSet


@dataclass(frozen=True, slots=True)
class Measure:
    """One timed call: wall seconds; the calling thread's CPU seconds (CPU devices, else None); the
    CUDA-event seconds between its start and end (CUDA, else None); the seconds the process's
    threads ran and waited runnable for a CPU (None where the kernel does not say)."""

    wall_s: float
    cpu_s: float | None = None
    device_s: float | None = None
    run_s: float | None = None
    wait_s: float | None = None


SchedTimes = dict[int, tuple[int, int]]  # thread id -> (ns on a CPU, ns runnable but waiting)


def scheduler_times() -> SchedTimes | None:
    """The kernel's run and run-queue wait times of every thread of this process (ns), from
    `/proc/self/task/<tid>/schedstat`; None where the kernel does not provide them."""
    times: SchedTimes = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", encoding="ascii") as handle:
                fields = handle.read().split()
        except OSError:  # the thread ended meanwhile, or no schedstat on this kernel
            continue
        if len(fields) >= 2:
            times[int(tid)] = (int(fields[0]), int(fields[1]))
    return times or None


def _sched_delta(before: SchedTimes | None, after: SchedTimes | None) -> tuple[float | None, float | None]:
    """(run seconds, wait seconds) of the process's threads between two readings, summed over
    threads (a thread started in between counts from its start)."""
    if before is None or after is None:
        return None, None
    run = sum(r - before.get(tid, (0, 0))[0] for tid, (r, _) in after.items())
    wait = sum(w - before.get(tid, (0, 0))[1] for tid, (_, w) in after.items())
    return max(run, 0) / 1e9, max(wait, 0) / 1e9


class Stopwatch:
    """Times calls with the device synchronised before and after. `wall`, `cpu` and `sched` are the
    clocks (perf_counter, the calling thread's CPU time, the threads' scheduler times); tests pass
    doubles."""

    def __init__(self, device: torch.device, wall: Callable[[], float] = time.perf_counter,
                 cpu: Callable[[], float] = time.thread_time,
                 sched: Callable[[], SchedTimes | None] = scheduler_times) -> None:
        self.device = device
        self.wall = wall
        self.cpu = cpu
        self.sched = sched

    def time(self, fn: Callable[[], T], scheduler: bool = False) -> tuple[T, Measure]:
        """Run `fn` and return its result with the Measure of the call (with the threads' scheduler
        times when `scheduler`: the decode's, which the noise figure reads)."""
        cuda = self.device.type == "cuda"
        start = end = None
        _sync(self.device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0 = self.sched() if scheduler else None
        w0, c0 = self.wall(), self.cpu()
        if start is not None:
            start.record()
        out = fn()
        if end is not None:
            end.record()
        _sync(self.device)
        w1, c1 = self.wall(), self.cpu()
        run_s, wait_s = _sched_delta(s0, self.sched() if scheduler else None)
        device_s = start.elapsed_time(end) / 1000.0 if start is not None and end is not None else None
        return out, Measure(wall_s=w1 - w0, cpu_s=None if cuda else c1 - c0, device_s=device_s,
                            run_s=run_s, wait_s=wait_s)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: torch.device) -> int:
    """Peak bytes: CUDA allocator peak since the last reset on GPU, process max RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _batches(specs: Sequence[SampleSpec], size: int) -> list[list[SampleSpec]]:
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    return [list(specs[i : i + size]) for i in range(0, len(specs), size)]


def schedule(counts: dict[str, int], reps: int, order: str) -> list[tuple[str, int, int]]:
    """The timed decodes in the order they run: (decoder, batch index, repetition).

    counts: timed batches per decoder (in the job's decoder order). interleaved: for each batch
    index and repetition, every decoder that has that batch once, the first decoder rotating by
    one per turn; sequential: each decoder's batches and repetitions in turn.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {list(ORDERS)}, got {order!r}")
    names = list(counts)
    if order == "sequential":
        return [(n, b, r) for n in names for b in range(counts[n]) for r in range(reps)]
    out: list[tuple[str, int, int]] = []
    turn = 0
    for b in range(max(counts.values(), default=0)):
        for r in range(reps):
            active = [n for n in names if b < counts[n]]
            k = turn % len(active)
            out += [(n, b, r) for n in active[k:] + active[:k]]
            turn += 1
    return out


@dataclass(slots=True)
class _Batch:
    """The repetitions of one timed batch so far."""

    images: Any = None  # [B, H, W, 3] uint8 of the first repetition
    tokens: torch.Tensor | None = None
    stats: list | None = None
    decode: list[Measure] | None = None
    condition: list[float] | None = None
    image: list[float] | None = None
    peak: int = 0


def _decode(job: Job, batch: list[SampleSpec], watch: Stopwatch,
            conditions: ConditionCache) -> tuple[Any, Any, tuple[Measure, Measure, Measure]]:
    """Condition + decode + tokens->pixels for one batch: (pixels [B, H, W, 3] uint8, generation,
    measures). The condition's wall time is the charged one (`_charged`)."""
    texts, seeds = [s.prompt.text for s in batch], [s.seed for s in batch]
    before = conditions.ledger.copy()
    cond, m_cond = watch.time(lambda: conditions.condition(job.models, texts, seeds))
    m_cond = dataclasses.replace(m_cond, wall_s=_charged(m_cond.wall_s, before, conditions.ledger))
    gen, m_dec = watch.time(lambda: job.decoder.generate(job.models, cond, seeds), scheduler=True)
    images, m_img = watch.time(lambda: job.models.target.decode(gen.tokens))
    pixels = images.permute(0, 2, 3, 1).cpu().numpy()
    return pixels, gen, (m_cond, m_dec, m_img)


def _charged(wall_s: float, before: Ledger, after: Ledger) -> float:
    """The conditioning time of one condition call as every decoder is charged it: the call's wall
    time without the seconds its stage computed entries, plus the recorded cost of every entry it
    served (computed now, by an earlier decoder or repetition, or by an earlier run)."""
    return max(wall_s - (after.computed_s - before.computed_s), 0.0) + (after.charged_s - before.charged_s)


def _measured(job: Job, batch: list[SampleSpec], watch: Stopwatch, conditions: ConditionCache
              ) -> tuple[Any, Any, float, float]:
    """Decode a batch and measure it for the budget: (pixels, generation, seconds, compile seconds).
    seconds: decode + tokens to pixels (+ the condition call where the cache does not keep the
    conditioner's output); a decode that compiled graphs (engine=compiled) is decoded again for
    seconds, and the difference is its compile time."""
    def once() -> tuple[Any, Any, float]:
        pixels, gen, (m_cond, m_dec, m_img) = _decode(job, batch, watch, conditions)
        uncached = 0.0 if cacheable(job.models.conditioner) else m_cond.wall_s
        return pixels, gen, m_dec.wall_s + m_img.wall_s + uncached

    shapes = engine.compiled_shapes()
    pixels, gen, seconds = once()
    if engine.compiled_shapes() == shapes:
        return pixels, gen, seconds, 0.0
    _, _, warm = once()
    return pixels, gen, warm, max(seconds - warm, 0.0)


def _prefetch(jobs: Sequence[Job], timed: dict[str, list[list[SampleSpec]]], conditions: ConditionCache,
              size: int) -> tuple[int, float]:
    """Compute the condition entries of the timed images ahead, `size` entries per stage call
    (ConditionCache.prefetch), so a timing batch smaller than batch_size does not make the stage
    (Tar's LLM) run one image at a time; each entry keeps its share of its call as its cost.
    Returns the entries computed and the seconds they took."""
    start = conditions.ledger.copy()
    for job in jobs:
        specs = [s for b in timed[job.name] for s in b]
        before = conditions.ledger.copy()
        made = conditions.prefetch(job.models.conditioner, [s.prompt.text for s in specs], [s.seed for s in specs],
                                   size)
        if made:
            log.info("computed %d condition entries of the timed images ahead in %d call(s), %.1f s",
                     made, conditions.ledger.calls - before.calls, conditions.ledger.computed_s - before.computed_s)
    return conditions.ledger.computed - start.computed, conditions.ledger.computed_s - start.computed_s


def _to_condition(jobs: Sequence[Job], timed: dict[str, list[list[SampleSpec]]],
                  untimed: dict[str, list[list[SampleSpec]]], conditions: ConditionCache) -> tuple[int, int]:
    """The condition entries the job has to compute (neither in memory nor on disk), at the timing
    batch and at batch_size (an entry met in both is computed at the first)."""
    first: set[Any] = set()
    later: set[Any] = set()
    for job in jobs:
        conditioner = job.models.conditioner
        for batches, found in ((timed[job.name], first), (untimed[job.name], later)):
            specs = [s for b in batches for s in b]
            found |= {(id(conditioner), key) for key in conditions.missing(
                conditioner, [s.prompt.text for s in specs], [s.seed for s in specs])}
    return len(first), len(later - first)


def _reps(values: Sequence[float | None]) -> str | None:
    """Repetition values as a space-separated list (None when not measured)."""
    if any(v is None for v in values):
        return None
    return " ".join(f"{v:.9g}" for v in values)


def generate_all(jobs: Sequence[Job], specs: Sequence[SampleSpec], *, batch_size: int, warmup_batches: int,
                 timing: Timing, device: torch.device, stopwatch: Stopwatch | None = None,
                 conditions: ConditionCache | None = None, evaluate: Sequence[EvaluateCost] = ()) -> dict[str, int]:
    """Generate every pending sample of `specs` for every job (module docstring); return the number
    of samples made per decoder. Complete samples are skipped, so a killed job resumes. Conditions
    come through `conditions` (None: a cache in memory for this call)."""
    watch = stopwatch or Stopwatch(device)
    conditions = conditions if conditions is not None else ConditionCache(device=device)
    over_before = set(engine.over_budget())  # models of earlier jobs in this process are not this job's
    timed_ids = {s.sample_id for s in (specs if timing.images is None else specs[: timing.images])}
    timed_size = timing.batch_size or batch_size
    timed: dict[str, list[list[SampleSpec]]] = {}
    untimed: dict[str, list[list[SampleSpec]]] = {}
    for job in jobs:
        todo = job.sample_set.pending(specs)
        if not todo:
            log.info("[%s] all %d samples already complete in %s", job.name, len(specs), job.sample_set.root)
        timed[job.name] = _batches([s for s in todo if s.sample_id in timed_ids], timed_size)
        untimed[job.name] = _batches([s for s in todo if s.sample_id not in timed_ids], batch_size)
    by_name = {job.name: job for job in jobs}
    made = {job.name: 0 for job in jobs}
    run_token = uuid.uuid4().hex[:8]  # batch ids stay distinct across resumed runs
    steps = schedule({n: len(b) for n, b in timed.items()}, timing.reps, timing.order)
    if steps:
        log.info("timing %d batches of %d image(s) per decoder, %d repetition(s) each, order %s",
                 max(len(b) for b in timed.values()), timed_size, timing.reps, timing.order)
    ahead = (0, 0.0)
    if timed_size < batch_size:  # a prompt's images share one stage call, not one each at the timing batch
        ahead = _prefetch(jobs, timed, conditions, batch_size)
    probed: set[str] = set()  # decoders whose first untimed batch was decoded with the warm-up
    if warmup_batches > 0:
        _warm_up(jobs, timed, untimed, probed, watch, conditions, run_token, made, warmup_batches=warmup_batches,
                 reps=timing.reps, timed_size=timed_size, batch_size=batch_size, device=device, ahead=ahead,
                 evaluate=evaluate)
    shapes_before = engine.compiled_shapes()  # engine=compiled: graphs compiled so far (warm-up)
    compile_before = engine.compile_seconds()
    if engine.compiled_anywhere():  # compile time, reported apart: no timed decode includes it
        log.info("engine=compiled: %d graph(s) compiled and captured in %.1f s before timing (warm-up)",
                 shapes_before, compile_before)
    open_batches: dict[tuple[str, int], _Batch] = {}
    for name, b, r in progress(steps, desc="timed decodes", unit="decodes"):
        job, batch = by_name[name], timed[name][b]
        state = open_batches.setdefault((name, b), _Batch(decode=[], condition=[], image=[]))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        pixels, gen, (m_cond, m_dec, m_img) = _decode(job, batch, watch, conditions)
        state.peak = max(state.peak, _peak_memory(device))
        state.decode.append(m_dec)  # type: ignore[union-attr]
        state.condition.append(m_cond.wall_s)  # type: ignore[union-attr]
        state.image.append(m_img.wall_s)  # type: ignore[union-attr]
        tokens = gen.tokens.detach().cpu()
        if r == 0:
            state.images, state.tokens, state.stats = pixels, tokens, gen.stats
        elif state.tokens is not None and not torch.equal(tokens, state.tokens):
            log.warning("[%s] repetition %d of batch %d gave other tokens than the first (nondeterministic "
                        "kernels?); the first repetition's images are kept", name, r + 1, b)
        if r == timing.reps - 1:
            _write_timed(job, batch, open_batches.pop((name, b)), f"{run_token}-{b}")
            made[name] += len(batch)
    if steps and engine.compiled_shapes() > shapes_before:
        log.warning("engine=compiled: %d forward shape(s) were first compiled inside timed decodes (the "
                    "warm-up did not meet them); those decodes include compile time: raise warmup_batches",
                    engine.compiled_shapes() - shapes_before)
        log.warning("engine=compiled: %.1f s of first calls (compile, capture) inside timed decodes",
                    engine.compile_seconds() - compile_before)
    over = [name for name in engine.over_budget() if name not in over_before]  # this call's models only
    if over:
        log.warning("engine=compiled: %s met more forward shapes than their graph budget; the shapes past "
                    "it ran eager (docs/methodology.md, \"The decode engine\")", ", ".join(over))
    for job in jobs:
        start = 1 if job.name in probed else 0
        batches = list(enumerate(untimed[job.name]))[start:]
        for u, batch in progress(batches, desc=f"untimed {job.name}", unit="batches"):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            cond = conditions.condition(job.models, [s.prompt.text for s in batch], [s.seed for s in batch])
            gen = job.decoder.generate(job.models, cond, [s.seed for s in batch])
            pixels = job.models.target.decode(gen.tokens).permute(0, 2, 3, 1).cpu().numpy()
            _write_untimed(job, batch, pixels, gen, f"{run_token}-u{u}", _peak_memory(device))
            made[job.name] += len(batch)
    for job in jobs:
        if made[job.name]:
            log.info("[%s] generated %d samples into %s", job.name, made[job.name], job.sample_set.root)
    return made


def _warm_up(jobs: Sequence[Job], timed: dict[str, list[list[SampleSpec]]],
             untimed: dict[str, list[list[SampleSpec]]], probed: set[str], watch: Stopwatch,
             conditions: ConditionCache, run_token: str, made: dict[str, int], *, warmup_batches: int,
             reps: int, timed_size: int, batch_size: int, device: torch.device,
             ahead: tuple[int, float] = (0, 0.0),
             evaluate: Sequence[EvaluateCost] = ()) -> None:
    """The warm-up (module docstring), measured, and the budget it gives: every decoder decodes its
    first `warmup_batches` timed batches (discarded); one with untimed images not yet measured at
    batch_size decodes its first untimed batch, which is written (its name goes into `probed`)."""
    to_compute = _to_condition(jobs, timed, untimed, conditions)
    costs: dict[tuple[str, int], Cost] = {}
    rates: dict[int, list[float]] = {}  # batch size -> [entries computed, seconds]
    compile_s = 0.0

    def measure(job: Job, batch: list[SampleSpec], where: str, size: int) -> tuple[Any, Any]:
        nonlocal compile_s
        before = conditions.ledger.copy()
        pixels, gen, seconds, compiling = _measured(job, batch, watch, conditions)
        costs[(job.name, size)] = Cost(len(batch), seconds, where)
        compile_s += compiling
        rate = rates.setdefault(size, [0, 0.0])
        rate[0] += conditions.ledger.computed - before.computed
        rate[1] += conditions.ledger.computed_s - before.computed_s
        return pixels, gen

    for job in jobs:  # warm-up of every decoder before any timed decode: untimed, discarded
        for batch in timed[job.name][:warmup_batches]:
            measure(job, batch, "warm-up", timed_size)
    for job in jobs:
        if untimed[job.name] and (job.name, batch_size) not in costs:
            batch = untimed[job.name][0]
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            pixels, gen = measure(job, batch, "first untimed batch", batch_size)
            _write_untimed(job, batch, pixels, gen, f"{run_token}-u0", _peak_memory(device))
            made[job.name] += len(batch)
            probed.add(job.name)
    if not costs:
        return
    work = [Work(job.name, sum(len(b) for b in timed[job.name][:warmup_batches]),
                 sum(len(b) for b in timed[job.name]), sum(len(b) for b in untimed[job.name])) for job in jobs]
    per_entry = {size: seconds / entries for size, (entries, seconds) in rates.items() if entries}
    conditioning = Conditioning(to_compute[0], to_compute[1], per_entry.get(timed_size), per_entry.get(batch_size),
                                ahead=ahead[0], ahead_s=ahead[1])
    log.info("%s", estimate(work, costs, reps=reps, timed_size=timed_size, batch_size=batch_size,
                            conditioning=conditioning, compile_s=compile_s, device=device.type, evaluate=evaluate))


def _write_untimed(job: Job, batch: list[SampleSpec], pixels: Any, gen: Any, batch_id: str, peak: int) -> None:
    """Write the images of an untimed batch (decoded once; no timing columns)."""
    row = {"decoder": job.name, "batch_id": batch_id, "batch_size": len(batch), "timed": False,
           "batch_latency_s": None, "peak_memory_bytes": peak}
    for spec, img, st in zip(batch, pixels, gen.stats):
        job.sample_set.write(spec, img, {**row, **st.as_row()})


def _write_timed(job: Job, batch: list[SampleSpec], state: _Batch, batch_id: str) -> None:
    """Write the images of a timed batch with the medians and every repetition of its timings."""
    decode = state.decode or []
    row = {"decoder": job.name, "batch_id": batch_id, "batch_size": len(batch), "timed": True,
           "batch_latency_s": statistics.median(m.wall_s for m in decode),
           "latency_reps_s": _reps([m.wall_s for m in decode]),
           "cpu_reps_s": _reps([m.cpu_s for m in decode]),
           "device_reps_s": _reps([m.device_s for m in decode]),
           "run_reps_s": _reps([m.run_s for m in decode]),
           "wait_reps_s": _reps([m.wait_s for m in decode]),
           "condition_s": statistics.median(state.condition or [math.nan]),
           "image_decode_s": statistics.median(state.image or [math.nan]),
           "peak_memory_bytes": state.peak}
    for spec, img, st in zip(batch, state.images, state.stats or []):
        job.sample_set.write(spec, img, {**row, **st.as_row()})


def generate(decoder: Decoder, models: ModelBundle, sample_set: SampleSet, specs: Sequence[SampleSpec], *,
             batch_size: int, warmup_batches: int, device: torch.device, name: str,
             timing: Timing | None = None, conditions: ConditionCache | None = None) -> int:
    """One decoder's `generate_all` (every image timed at `batch_size` unless `timing` says otherwise);
    returns how many samples were made."""
    job = Job(name=name, decoder=decoder, models=models, sample_set=sample_set)
    return generate_all([job], specs, batch_size=batch_size, warmup_batches=warmup_batches,
                        timing=timing or Timing(), device=device, conditions=conditions)[name]
