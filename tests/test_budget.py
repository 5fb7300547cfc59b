"""The budget (issue 41): per-image costs measured at the batch sizes the job decodes at, plus the
condition entries it computes, summed over the plan; compile time apart. On a virtual clock the
printed budget is exactly the time the job takes."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from harness.api import DecodeStats, Generation, ModelBundle, Prompt, SamplingParams
from harness.budget import Budget, Conditioning, Cost, Work, estimate
from harness.generate import Job, Stopwatch, Timing, generate_all
from harness.store.conditions import ConditionCache
from harness.store.samples import SampleSet, plan


class Clock:
    """A wall clock that moves only when the fakes below work."""

    def __init__(self) -> None:
        self.now = 0.0

    def wall(self) -> float:
        return self.now


class BatchDecoder:
    """Spends `per_batch + per_image x B` seconds on a batch of B: a batch of 4 costs less per image
    than four batches of 1, as on a GPU."""

    def __init__(self, clock: Clock, per_batch: float, per_image: float) -> None:
        self.clock, self.per_batch, self.per_image = clock, per_batch, per_image
        self.sampling = SamplingParams()

    def generate(self, models: Any, cond: Any, seeds: Sequence[int]) -> Generation:
        self.clock.now += self.per_batch + self.per_image * len(seeds)
        tokens = torch.tensor([[s % 7, s % 5] for s in seeds])
        return Generation(tokens=tokens, stats=[DecodeStats(target_forwards=2, tokens=2) for _ in seeds])


class Target:
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens[:, :, None, None].expand(-1, -1, 2, 2)[:, :1].repeat(1, 3, 1, 1) * 30).to(torch.uint8)


class LLM:
    """A per-image conditioner stage costing `per_call + per_row x rows`; counts its rows."""

    def __init__(self, clock: Clock, per_call: float, per_row: float) -> None:
        self.clock, self.per_call, self.per_row, self.rows = clock, per_call, per_row, 0

    def __call__(self, prompts: Sequence[str], seeds: Sequence[int] | None = None) -> torch.Tensor:
        self.clock.now += self.per_call + self.per_row * len(prompts)
        self.rows += len(prompts)
        return torch.tensor([[len(p), int(s) % 1000] for p, s in zip(prompts, seeds or [0] * len(prompts))])


class Conditioner:
    per_image = True

    def __init__(self, stage: LLM) -> None:
        self.stage = stage

    def finish(self, codes: torch.Tensor) -> torch.Tensor:
        return codes


DECODERS = {"raster": (0.5, 2.0), "fast": (0.5, 0.5)}  # (per batch, per image) seconds
LLM_COST = (1.0, 3.0)  # (per call, per row)


def _job(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[Budget, float, LLM, list[Job]]:
    """Five prompts x 4 images; 4 timed at batch 1 (2 repetitions), 16 untimed at batch 4, one
    warm-up batch: (the budget printed, the job's time on the clock, the LLM, the jobs)."""
    clock = Clock()
    llm = LLM(clock, *LLM_COST)
    models = ModelBundle(name="fake", target=Target(), conditioner=Conditioner(llm))  # type: ignore[arg-type]
    jobs = [Job(name=n, decoder=BatchDecoder(clock, *c), models=models,  # type: ignore[arg-type]
                sample_set=SampleSet(tmp_path / n)) for n, c in DECODERS.items()]
    specs = plan([Prompt(id=f"p{i}", text=f"prompt number {i}") for i in range(5)], images_per_prompt=4, global_seed=0)
    watch = Stopwatch(torch.device("cpu"), wall=clock.wall, cpu=lambda: 0.0, sched=lambda: None)
    with caplog.at_level(logging.INFO, logger="harness.generate"):
        generate_all(jobs, specs, batch_size=4, warmup_batches=1, timing=Timing(reps=2, images=4, batch_size=1),
                     device=torch.device("cpu"), stopwatch=watch, conditions=ConditionCache(clock=clock.wall))
    budgets = [r.args[0] for r in caplog.records if isinstance(r.args, tuple) and r.args
               and isinstance(r.args[0], Budget)]
    assert len(budgets) == 1
    return budgets[0], clock.now, llm, jobs


def test_budget_is_the_jobs_time_on_a_virtual_clock(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    budget, elapsed, llm, _ = _job(tmp_path, caplog)
    # raster: (1 warm-up + 2 x 4 timed) x 2.5 s at batch 1 + 16 untimed x (0.5 + 4 x 2) / 4 s at batch 4
    assert budget.decode_s["raster"] == pytest.approx(9 * 2.5 + 16 * 8.5 / 4)
    assert budget.decode_s["fast"] == pytest.approx(9 * 1.0 + 16 * 2.5 / 4)
    # the LLM: the 4 timed entries computed ahead in one call of 4 (13 s, measured), 16 in calls of 4
    # (13 / 4 s each), none one at a time at the timing batch
    assert budget.condition_s == pytest.approx(13.0 + 16 * 13.0 / 4)
    assert "4 entries of the timed images computed ahead in calls of 4: 13 s" in str(budget)
    assert llm.rows == 20  # once per image, for both decoders and both repetitions
    assert budget.seconds == pytest.approx(elapsed)  # the job took exactly what was predicted
    text = str(budget)
    assert "a batch of 1, warm-up" in text and "a batch of 4, first untimed batch" in text
    assert "CPU-hours" in text and "compile" in text


def test_budget_charges_every_decoder_the_conditioning_of_its_images(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """condition_s of a timed image is what computing its entry cost (its share of the call of 4 that
    computed the timed entries ahead: 13 / 4 s), for every decoder that read it from the cache."""
    _, _, _, jobs = _job(tmp_path, caplog)
    for job in jobs:
        stats = job.sample_set.stats()
        timed = stats[stats["timed"].astype(str) == "True"]
        assert len(timed) == 4 and timed["condition_s"].astype(float).tolist() == pytest.approx([13.0 / 4] * 4)
        decode = (DECODERS[job.name][0] + DECODERS[job.name][1])
        assert timed["batch_latency_s"].astype(float).tolist() == pytest.approx([decode] * 4)  # without conditioning


def test_budget_arithmetic_and_fallbacks() -> None:
    work = [Work("raster", warmup=1, timed=16, untimed=2196), Work("mulo_sd", warmup=1, timed=16, untimed=2196)]
    costs = {("raster", 1): Cost(1, 20.0, "warm-up"), ("raster", 16): Cost(16, 48.0, "first untimed batch"),
             ("mulo_sd", 1): Cost(1, 8.0, "warm-up")}  # mulo_sd not measured at 16: its batch-1 cost is used
    conditioning = Conditioning(timed=16, untimed=2196, timed_s=15.0, untimed_s=None)
    budget = estimate(work, costs, reps=2, timed_size=1, batch_size=16, conditioning=conditioning,
                      compile_s=120.0, device="cuda")
    assert budget.decode_s == pytest.approx({"raster": 33 * 20.0 + 2196 * 3.0, "mulo_sd": (33 + 2196) * 8.0})
    assert budget.condition_s == pytest.approx((16 + 2196) * 15.0)
    assert budget.seconds == pytest.approx(33 * 20 + 2196 * 3 + 2229 * 8 + 2212 * 15)  # compile not in it
    text = str(budget)
    assert "GPU-hours" in text and "120.0 s" in text and "not measured at batch 16" in text
    with pytest.raises(ValueError, match="no decode of zipar"):
        estimate([Work("zipar", 1, 1, 0)], costs, reps=2, timed_size=1, batch_size=16, conditioning=Conditioning())
