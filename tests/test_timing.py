"""Timing (issue 31): interleaved, repeated decodes that change no image, speed-ups with confidence
intervals, and a noise figure that notices a disturbed machine.

The disturbance tests run on a virtual clock (a test double of the Stopwatch's clocks): fake
decoders spend a fixed CPU time per image, and a slowdown stretches the wall time of the calls it
hits (a decode that gets a third of the CPU takes three times as long; its thread's CPU time does
not change). They are exact, so they do not depend on how busy the test machine is.
"""
from __future__ import annotations

import io
import logging
import math
import time
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf, open_dict

from evaluators.speed import SpeedEvaluator, timing_noise_of
from harness.api import ConfigValueError, DecodeStats, Generation, ModelBundle, SamplingParams
from harness.comparisons import speedup_interval, warn_noisy_timing, with_comparisons
from harness.datasets.prompts import shapes
from harness.generate import Job, Stopwatch, Timing, _sched_delta, generate_all, schedule, scheduler_times
from harness.run import run
from harness.store.samples import SampleSet, plan
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

TIMING_METRICS = {"speedup_e2e_vs_raster", "latency_s", "latency_p90_s", "throughput_img_s", "condition_s", "peak_memory_mb",
                  "timing_noise", "timing_spread", "speedup_vs_raster", "image_decode_s", "end_to_end_s"}
TOLERANCE = 0.05  # interleaved speed-ups under a disturbance stay within 5% of the undisturbed ones
SLOWDOWN = 3.0  # a disturbed decode gets a third of the CPU


# --- the schedule ---------------------------------------------------------------------------------

def test_interleaved_schedule_rotates_decoders_per_batch_and_repetition() -> None:
    steps = schedule({"a": 2, "b": 2, "c": 1}, reps=2, order="interleaved")
    assert steps == [("a", 0, 0), ("b", 0, 0), ("c", 0, 0),
                     ("b", 0, 1), ("c", 0, 1), ("a", 0, 1),
                     ("a", 1, 0), ("b", 1, 0),  # c has one batch only; turns 2, 3 rotate a, b
                     ("b", 1, 1), ("a", 1, 1)]
    assert schedule({"a": 2, "b": 1}, reps=2, order="sequential") == [
        ("a", 0, 0), ("a", 0, 1), ("a", 1, 0), ("a", 1, 1), ("b", 0, 0), ("b", 0, 1)]
    assert schedule({}, reps=2, order="interleaved") == []


def test_timing_config_is_checked() -> None:
    assert Timing.from_config({"reps": 3, "order": "sequential"}) == Timing(reps=3, order="sequential")
    for bad, message in (({"reps": 0}, "timing.reps"), ({"order": "random"}, "timing.order"),
                         ({"images": -1}, "timing.images"), ({"batch_size": 0}, "timing.batch_size"),
                         ({"noise_threshold": 0}, "noise_threshold"), ({"rep": 2}, "unknown timing keys")):
        with pytest.raises(ConfigValueError, match=message):
            Timing.from_config(bad)
    with pytest.raises(ConfigValueError, match="timing.reps"):
        run(compose_cfg(["+experiment=smoke", "timing.reps=0"]), Path("/nonexistent/never/written"))


# --- interleaving changes no image --------------------------------------------------------------

def _files(root: Path, pattern: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob(pattern))}


def test_interleaving_changes_no_image_and_no_non_timing_metric(tmp_path: Path) -> None:
    """Every decoder of the default line-up on the random model, interleaved and sequential: the
    PNG bytes, the per-image counters and every summary row but the timings are the same."""
    base = ["+experiment=smoke", "evaluator=[speed,geneval_shapes]",
            "evaluator.geneval_shapes.show_progress=false", "timing.reps=2"]
    summaries = {}
    for order in ("interleaved", "sequential"):
        summaries[order] = run(compose_cfg([*base, f"timing.order={order}"]), tmp_path / order)
    images = {o: _files(tmp_path / o / "samples", "*.png") for o in summaries}
    assert len(images["interleaved"]) == 6 * 4  # six decoders, four prompts
    assert images["interleaved"] == images["sequential"]
    counters = ["sample_id", "target_forwards", "drafter_forwards", "tokens", "proposed", "accepted",
                "resampled", "accepted_per_step"]
    for decoder in ("raster", "sjd", "eagle2", "lantern", "zipar", "mulo_sd"):
        a, b = (pd.read_csv(tmp_path / o / "samples" / decoder / "stats.csv") for o in summaries)
        pd.testing.assert_frame_equal(a[counters], b[counters])
        assert (a["timed"]).all() and (a["latency_reps_s"].str.split().str.len() == 2).all()

    def rows(frame: pd.DataFrame) -> pd.DataFrame:
        kept = frame[~frame.metric.isin(TIMING_METRICS)].drop(columns=["ci_low", "ci_high"])
        return kept.sort_values(["decoder", "evaluator", "metric", "subset"]).reset_index(drop=True)

    assert len(rows(summaries["interleaved"])) > 6 * 10
    pd.testing.assert_frame_equal(rows(summaries["interleaved"]), rows(summaries["sequential"]))
    assert set(summaries["interleaved"].metric) >= TIMING_METRICS


def test_timed_images_and_untimed_quality_images_come_from_one_plan(tmp_path: Path) -> None:
    """timing.images: the first N images are timed at timing.batch_size, the rest decoded once at
    batch_size; the images equal those of a run that times them all, and only timed rows count
    for latency."""
    base = ["+experiment=smoke", "decoder=[raster,zipar]", "evaluator=[speed]", "dataset_limit=5"]
    split = run(compose_cfg([*base, "batch_size=4", "timing.images=2", "timing.batch_size=1"]), tmp_path / "split")
    whole = run(compose_cfg([*base, "batch_size=1", "timing.reps=1"]), tmp_path / "whole")
    assert _files(tmp_path / "split" / "samples", "*.png") == _files(tmp_path / "whole" / "samples", "*.png")
    stats = pd.read_csv(tmp_path / "split" / "samples" / "raster" / "stats.csv")
    assert stats["timed"].tolist() == [True, True, False, False, False]
    assert stats["batch_size"].tolist() == [1, 1, 3, 3, 3]
    assert stats["batch_latency_s"].isna().tolist() == [False, False, True, True, True]
    latency = split[(split.metric == "latency_s") & (split.decoder == "raster")]
    assert int(latency.n.iloc[0]) == 2
    forwards = split[(split.metric == "target_forwards") & (split.decoder == "raster")]
    assert int(forwards.n.iloc[0]) == 5, "counters come from every image"
    assert int(whole[(whole.metric == "latency_s") & (whole.decoder == "raster")].n.iloc[0]) == 5


def test_a_resumed_run_times_only_the_missing_images(tmp_path: Path) -> None:
    """Binding and resume keep working: a rerun into the same folder finds every sample complete,
    and after deleting one record only that image is timed again."""
    cfg = compose_cfg(["+experiment=smoke", "decoder=[raster,zipar]", "evaluator=[speed]", "batch_size=1"])
    run(cfg, tmp_path / "run")
    before = _files(tmp_path / "run" / "samples", "*.png")
    (tmp_path / "run" / "samples" / "zipar" / "records" / "shapes-00002_00.json").unlink()
    summary = run(cfg, tmp_path / "run")
    assert _files(tmp_path / "run" / "samples", "*.png") == before
    stats = pd.read_csv(tmp_path / "run" / "samples" / "zipar" / "stats.csv")
    assert stats["batch_id"].nunique() == 4 and len(set(stats["batch_id"].str.split("-").str[0])) == 2
    assert summary[summary.metric == "speedup_vs_raster"].ci_low.notna().all()


# --- disturbances on a virtual clock ---------------------------------------------------------------

class VirtualClock:
    """Wall and CPU clocks that advance only when a fake decoder works; `load(decoder)` -> the
    factor by which the current call's wall time is stretched."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu_now = 0.0
        self.calls = 0  # generate() calls so far, warm-up included
        self.hits: tuple[set[str], range] = (set(), range(0))  # (decoders, calls) a slowdown hits

    def wall(self) -> float:
        return self.now

    def cpu(self) -> float:
        return self.cpu_now

    def sched(self) -> dict[int, tuple[int, int]]:
        """The one decoding thread's scheduler times (ns): it ran for its CPU time and, when slowed,
        waited runnable for the rest (another process held the CPU)."""
        return {1: (round(self.cpu_now * 1e9), round((self.now - self.cpu_now) * 1e9))}

    def work(self, decoder: str, seconds: float) -> None:
        names, calls = self.hits
        factor = SLOWDOWN if decoder in names and self.calls in calls else 1.0
        self.calls += 1
        self.cpu_now += seconds
        self.now += seconds * factor


class FakeDecoder:
    """Spends `cost` CPU seconds per image on the virtual clock; tokens follow the seeds."""

    def __init__(self, name: str, cost: float, clock: VirtualClock) -> None:
        self.name, self.cost, self.clock = name, cost, clock
        self.sampling = SamplingParams()

    def generate(self, models: Any, cond: Any, seeds: Sequence[int]) -> Generation:
        self.clock.work(self.name, self.cost * len(seeds))
        tokens = torch.tensor([[s % 7, s % 5] for s in seeds])
        return Generation(tokens=tokens, stats=[DecodeStats(target_forwards=4, tokens=2) for _ in seeds])


class FakeTarget:
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens[:, :, None, None].expand(-1, -1, 2, 2)[:, :1].repeat(1, 3, 1, 1) * 30).to(torch.uint8)


COSTS = {"raster": 1.0, "fast": 0.25, "mid": 0.5}  # undisturbed speed-ups: 4 and 2


def _timed_run(tmp_path: Path, order: str, hit: set[str], calls: range) -> pd.DataFrame:
    """Twelve images at batch 1, two repetitions, the three fake decoders; a slowdown hits the
    calls `calls` (counted over the run, after one warm-up call per decoder) of the decoders `hit`.
    Returns the job's summary with speed-ups, as the pipeline derives it."""
    clock = VirtualClock()
    clock.hits = (hit, range(calls.start + 3, calls.stop + 3))
    models = ModelBundle(name="fake", target=FakeTarget(), conditioner=lambda texts: None)  # type: ignore[arg-type]
    jobs = [Job(name=n, decoder=FakeDecoder(n, c, clock), models=models, sample_set=SampleSet(tmp_path / order / n))
            for n, c in COSTS.items()]
    specs = plan(shapes(12), images_per_prompt=1, global_seed=0)
    watch = Stopwatch(torch.device("cpu"), wall=clock.wall, cpu=clock.cpu, sched=clock.sched)
    generate_all(jobs, specs, batch_size=1, warmup_batches=1, timing=Timing(reps=2, order=order),
                 device=torch.device("cpu"), stopwatch=watch)
    frames, verdicts = [], {}
    for job in jobs:
        result = SpeedEvaluator().evaluate(job.sample_set)
        frames.append(result.summary.assign(decoder=job.name, evaluator="speed"))
        verdicts[(job.name, "speed")] = result.per_sample
    return with_comparisons(pd.concat(frames, ignore_index=True), verdicts)


def _metric(summary: pd.DataFrame, metric: str) -> dict[str, float]:
    rows = summary[summary.metric == metric]
    return dict(zip(rows.decoder, rows.value.astype(float)))


MIDDLE_THIRD = range(24, 48)  # of the 72 timed calls (3 decoders x 12 images x 2 repetitions)


@pytest.mark.parametrize("hit", [{"fast"}, {"raster", "fast", "mid"}],
                         ids=["one decoder's calls", "every decoder's calls (machine-wide load)"])
def test_interleaved_speedups_survive_a_slowdown_and_the_warning_names_the_hit_decoders(
        tmp_path: Path, hit: set[str], caplog: pytest.LogCaptureFixture) -> None:
    quiet = _timed_run(tmp_path / "quiet", "interleaved", set(), range(0))
    assert _metric(quiet, "speedup_vs_raster") == pytest.approx({"raster": 1.0, "fast": 4.0, "mid": 2.0})
    assert max(_metric(quiet, "timing_noise").values()) == 0.0
    with caplog.at_level(logging.WARNING, logger="harness.comparisons"):
        assert warn_noisy_timing(quiet, Timing().noise_threshold) == []
    assert not caplog.records

    disturbed = _timed_run(tmp_path / "disturbed", "interleaved", hit, MIDDLE_THIRD)
    speedups = _metric(disturbed, "speedup_vs_raster")
    for name, expected in {"fast": 4.0, "mid": 2.0}.items():
        assert speedups[name] == pytest.approx(expected, rel=TOLERANCE), name
        row = disturbed[(disturbed.metric == "speedup_vs_raster") & (disturbed.decoder == name)].iloc[0]
        assert row.ci_low <= expected <= row.ci_high, (name, row.ci_low, row.ci_high)
    noise = _metric(disturbed, "timing_noise")
    assert all(noise[n] == pytest.approx(1 - 1 / SLOWDOWN) for n in hit)
    assert all(noise[n] == 0.0 for n in set(COSTS) - hit)
    with caplog.at_level(logging.WARNING, logger="harness.comparisons"):
        named = warn_noisy_timing(disturbed, Timing().noise_threshold)
    assert set(named) == hit
    assert "timing unreliable for" in caplog.text and all(n in caplog.text for n in hit)

    # the same slowdown on the sequential order lands on fast's run alone: its speed-up is off
    sequential = _timed_run(tmp_path / "sequential", "sequential", hit, MIDDLE_THIRD)
    assert _metric(sequential, "speedup_vs_raster")["fast"] == pytest.approx(4.0 / SLOWDOWN)


def test_a_slowdown_of_one_repetition_shows_as_spread() -> None:
    assert timing_noise_of([1.0, 1.0], [1.0, 1.0], []) == 0.0
    assert timing_noise_of([1.0, 1.3], [], []) == pytest.approx(0.3)  # CUDA-less, CPU time unknown
    assert timing_noise_of([1.0, 1.0], [], [0.5, 0.6]) == pytest.approx(0.2)  # CUDA events disagree
    assert timing_noise_of([2.0, 2.0], [1.0, 2.0], []) == pytest.approx(0.5)  # half the wall time off the CPU
    assert timing_noise_of([1.0, 1.3], [1.0, 1.3], [], [1.0, 1.3], [0.0, 0.0]) == 0.0  # spread, nothing lost
    assert timing_noise_of([1.0, 1.0], [0.8, 1.0], [], [0.8, 1.0], [0.2, 0.0]) == pytest.approx(0.2)  # waited
    assert math.isnan(timing_noise_of([1.0], [], []))


# --- the confidence interval ---------------------------------------------------------------------

def _per_sample(latencies: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame({"sample_id": list(latencies), "batch_id": [f"b{i}" for i in range(len(latencies))],
                         "timed": True, "latency_s": [sorted(v)[len(v) // 2] if len(v) % 2 else sum(v) / 2
                                                      for v in latencies.values()],
                         "latency_reps_s": [" ".join(map(str, v)) for v in latencies.values()]})


def test_speedup_interval_is_paired_and_narrows_with_steadier_timings() -> None:
    ref = _per_sample({f"s{i}": [1.0 + 0.1 * i, 1.02 + 0.1 * i] for i in range(8)})
    point, stderr, low, high = speedup_interval(ref, ref)
    assert (point, stderr, low, high) == (1.0, 0.0, 1.0, 1.0), "a decoder against itself: exactly 1"
    # per-image latencies that vary together with raster's (the image is harder for both): paired,
    # the ratio is steady although the latencies spread widely
    half = _per_sample({f"s{i}": [(1.0 + 0.1 * i) / 2, (1.02 + 0.1 * i) / 2] for i in range(8)})
    point, stderr, low, high = speedup_interval(half, ref)
    assert point == pytest.approx(2.0) and low == pytest.approx(2.0, rel=0.02) and high == pytest.approx(2.0, rel=0.02)
    noisy = _per_sample({f"s{i}": [(1.0 + 0.1 * i) / 2, (1.4 + 0.1 * i) / 2] for i in range(8)})
    _, noisy_se, noisy_low, noisy_high = speedup_interval(noisy, ref)
    assert noisy_se > stderr and noisy_high - noisy_low > high - low
    assert noisy_low < 2.0 * 1.02 / 1.2 < noisy_high  # covers the speed-up of the repetitions' means
    assert speedup_interval(half, ref) == speedup_interval(half, ref), "seeded"


# --- a real slowdown through the whole pipeline ------------------------------------------------

class Sleepy:
    """Raster that sleeps (off the CPU) in its calls `calls`: a process that lost the CPU."""

    def __init__(self, sampling: SamplingParams, calls: Sequence[int], sleep_s: float) -> None:
        from baselines.methods.raster import RasterDecoder

        self.inner = RasterDecoder(sampling)
        self.sampling = sampling
        self.calls, self.sleep_s, self.count = set(calls), sleep_s, 0

    def generate(self, models: Any, cond: Any, seeds: Sequence[int]) -> Generation:
        if self.count in self.calls:
            time.sleep(self.sleep_s)
        self.count += 1
        return self.inner.generate(models, cond, seeds)


def test_the_pipeline_warns_about_a_decoder_that_slept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = compose_cfg(["+experiment=smoke", "decoder=[raster]", "evaluator=[speed]", "batch_size=1"])
    with open_dict(cfg):
        cfg.decoder.sleepy = OmegaConf.create({"_target_": "tests.test_timing.Sleepy", "sampling": cfg.sampling,
                                               "calls": [3, 4, 5], "sleep_s": 0.3})
    with caplog.at_level(logging.WARNING, logger="harness.comparisons"):
        summary = run(cfg, tmp_path / "run")
    noise = _metric(summary, "timing_noise")
    assert noise["sleepy"] > Timing().noise_threshold
    assert "timing unreliable for" in caplog.text and "sleepy" in caplog.text.split("timing unreliable for")[1]
    stats = pd.read_csv(tmp_path / "run" / "samples" / "sleepy" / "stats.csv")
    assert stats["cpu_reps_s"].notna().all() and stats["latency_reps_s"].notna().all()
    assert _files(tmp_path / "run" / "samples" / "sleepy", "*.png").keys() == \
        _files(tmp_path / "run" / "samples" / "raster", "*.png").keys()
    raster, sleepy = (_files(tmp_path / "run" / "samples" / d, "*.png") for d in ("raster", "sleepy"))
    assert list(raster.values()) == list(sleepy.values()), "the same decoder makes the same images"


# --- error bars in every table that shows a speed-up ------------------------------------------------

def _store() -> pd.DataFrame:
    rows = []
    for decoder, (speed, low, high) in {"raster": (1.0, 1.0, 1.0), "mulo_sd": (2.79, 2.61, 2.95)}.items():
        base = {"experiment": "main", "model": "shapes", "decoder": decoder, "dataset": "shapes",
                "evaluator": "speed", "evaluator_version": "1", "subset": "all", "n": 8, "run_dir": "r1"}
        rows += [{**base, "metric": "speedup_vs_raster", "value": speed, "stderr": 0.08, "ci_low": low,
                  "ci_high": high, "higher_is_better": True},
                 {**base, "metric": "latency_s", "value": 4.0 / speed, "stderr": float("nan"),
                  "ci_low": float("nan"), "ci_high": float("nan"), "higher_is_better": False}]
    return pd.DataFrame(rows)


def test_speedups_show_their_interval_in_every_rendered_table() -> None:
    from harness.report.build import build_table
    from harness.report.paper_reference import load_paper_numbers
    from harness.report.render import to_csv, to_html, to_latex, to_markdown, to_sources_csv
    from harness.report.specs import TABLES
    from harness.store.summary import format_table

    table = build_table(_store(), TABLES["main"], load_paper_numbers())
    assert "2.79× [2.61, 2.95]" in to_markdown(table) and "95% confidence interval" in to_markdown(table)
    assert r"2.79$\times$ [2.61, 2.95]" in to_latex(table) and "2.79× [2.61, 2.95]" in to_html(table)
    flat = pd.read_csv(io.StringIO(to_csv(table)))
    mulo = flat[(flat.decoder == "mulo_sd") & (flat.model == "shapes")].iloc[0]
    assert (mulo.speedup, mulo.speedup_ci_low, mulo.speedup_ci_high) == (2.79, 2.61, 2.95)
    sources = pd.read_csv(io.StringIO(to_sources_csv(table)))
    ours = sources[(sources.decoder == "mulo_sd") & (sources.metric == "speedup") & (sources.model == "shapes")]
    assert ours.ours_ci_low.iloc[0] == 2.61
    printed = format_table(_store())
    assert "2.790 [2.610, 2.950]" in printed and "ci_low" not in printed, "intervals are not swept keys"


def test_speed_quality_figures_draw_the_interval(tmp_path: Path) -> None:
    from harness.report.figures import Point, speed_quality

    drawn = []

    class Axis:  # records what speed_quality draws
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: drawn.append((name, args, kwargs)) or [type("L", (), {
                "get_color": lambda self: "C0"})()]

    from harness.report import figures

    figures._plot_points(Axis(), [Point(label="mulo", speedup=2.0, quality=0.5, speedup_ci=(1.8, 2.3)),
                                  Point(label="raster", speedup=1.0, quality=0.6)])
    bars = [call for call in drawn if call[0] == "errorbar"]
    assert len(bars) == 1 and bars[0][2]["xerr"] == [[pytest.approx(0.2)], [pytest.approx(0.3)]]
    paths = speed_quality({"geneval": [Point(label="mulo", speedup=2.0, quality=0.5, speedup_ci=(1.8, 2.3))]},
                          "t", tmp_path / "f")
    assert all(p.is_file() for p in paths)


def test_on_cuda_the_stopwatch_records_cuda_event_time_instead_of_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch without a GPU: events and synchronisation are doubles; a decode's device time
    is the time between its two events, and no CPU time is recorded."""
    synced = []

    class Event:
        clock = iter([10.0, 35.0])  # milliseconds at which the two events are recorded

        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = 0.0

        def record(self) -> None:
            self.at = next(Event.clock)

        def elapsed_time(self, end: "Event") -> float:
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: synced.append(device))
    clock = iter([1.0, 1.5])
    watch = Stopwatch(torch.device("cuda"), wall=lambda: next(clock), cpu=lambda: 0.0, sched=lambda: None)
    out, measure = watch.time(lambda: "done")
    assert out == "done" and len(synced) == 2
    assert measure.wall_s == 0.5 and measure.cpu_s is None and measure.device_s == pytest.approx(0.025)


def test_scheduler_times_count_the_threads_run_time() -> None:
    """The kernel's schedstat, read for real: a busy loop's run time shows in this thread's entry."""
    before = scheduler_times()
    if before is None:
        pytest.skip("this kernel reports no /proc/self/task/*/schedstat")
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:
        pass
    run, wait = _sched_delta(before, scheduler_times())
    assert run is not None and wait is not None
    assert run >= 0.1 and wait >= 0.0


def test_scheduler_deltas_sum_threads_and_count_a_new_thread_from_its_start() -> None:
    before = {1: (10_000_000_000, 5_000_000_000)}
    after = {1: (10_500_000_000, 5_100_000_000), 2: (200_000_000, 300_000_000)}  # thread 2 started between
    assert _sched_delta(before, after) == pytest.approx((0.7, 0.4))
    assert _sched_delta(None, after) == (None, None)
