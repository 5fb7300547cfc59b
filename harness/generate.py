"""Timed generation into a SampleSet: the only place that measures time.

Per batch: condition (timed), decode tokens (timed: device synchronised before and after; this is
the latency the speed evaluator reports), tokens -> images (timed separately). The first
`warmup_batches` batches are run once untimed and discarded before the measured pass."""
from __future__ import annotations

import logging
import resource
import time
import uuid
from typing import Sequence

import torch
from tqdm.auto import tqdm

from harness.api import Decoder, ModelBundle
from harness.samples import SampleSet, SampleSpec

log = logging.getLogger(__name__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: torch.device) -> int:
    """Peak bytes: CUDA allocator peak on GPU, process max RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _batches(specs: Sequence[SampleSpec], size: int) -> list[list[SampleSpec]]:
    if size < 1:
        raise ValueError(f"batch_size must be >= 1, got {size}")
    return [list(specs[i : i + size]) for i in range(0, len(specs), size)]


def _decode_batch(decoder: Decoder, models: ModelBundle, batch: list[SampleSpec],
                  device: torch.device) -> tuple[torch.Tensor, list, dict[str, float]]:
    """Condition + decode + tokens->images for one batch, with the three timings."""
    _sync(device)
    t0 = time.perf_counter()
    cond = models.condition([s.prompt.text for s in batch])
    _sync(device)
    t1 = time.perf_counter()
    gen = decoder.generate(models, cond, [s.seed for s in batch])
    _sync(device)
    t2 = time.perf_counter()
    images = models.target.decode(gen.tokens)
    _sync(device)
    t3 = time.perf_counter()
    return images, gen.stats, {"condition_s": t1 - t0, "batch_latency_s": t2 - t1, "image_decode_s": t3 - t2}


def generate(decoder: Decoder, models: ModelBundle, sample_set: SampleSet, specs: Sequence[SampleSpec],
             *, batch_size: int, warmup_batches: int, device: torch.device, name: str) -> int:
    """Generate every pending sample of `specs` into `sample_set`; returns how many were made.

    Already complete samples are skipped, so a killed job resumes where it stopped."""
    todo = sample_set.pending(specs)
    if not todo:
        log.info("[%s] all %d samples already complete in %s", name, len(specs), sample_set.root)
        return 0
    batches = _batches(todo, batch_size)
    for batch in batches[:warmup_batches]:
        _decode_batch(decoder, models, batch, device)  # warm-up: untimed, discarded
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run_token = uuid.uuid4().hex[:8]  # batch ids stay distinct across resumed runs
    done = 0
    bar = tqdm(batches, desc=f"generate {name}", unit="batch", disable=None)
    for batch_id, batch in enumerate(bar):
        images, stats, timing = _decode_batch(decoder, models, batch, device)
        peak = _peak_memory(device)
        pixels = images.permute(0, 2, 3, 1).cpu().numpy()
        for spec, img, st in zip(batch, pixels, stats):
            row = {"decoder": name, "batch_id": f"{run_token}-{batch_id}", "batch_size": len(batch), **timing,
                   "peak_memory_bytes": peak, **st.as_row()}
            sample_set.write(spec, img, row)
        done += len(batch)
        bar.set_postfix(latency=f"{timing['batch_latency_s']:.3f}s")
    log.info("[%s] generated %d samples into %s", name, done, sample_set.root)
    return done
