"""Speed evaluator: every metric on fabricated stats against values computed by hand."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluators.speed import SpeedEvaluator, _noise_per_batch, speed_result
from harness.api import METRIC_COLUMNS, Prompt
from harness.report.rejections import rejection_heatmap
from harness.store.samples import SampleSet, plan


class _FakeSamples:
    """Anything with `stats()` is enough for the speed evaluator."""

    def __init__(self, stats: pd.DataFrame) -> None:
        self._stats = stats

    def stats(self) -> pd.DataFrame:
        return self._stats


def _stats() -> pd.DataFrame:
    """Five images in three batches: {a, b} 2 s, {c} 5 s, {d, e} 3 s."""
    return pd.DataFrame({
        "sample_id": ["a", "b", "c", "d", "e"],
        "decoder": "mulo_sd",
        "batch_id": ["r-0", "r-0", "r-1", "r-2", "r-2"],
        "batch_size": [2, 2, 1, 2, 2],
        "batch_latency_s": [2.0, 2.0, 5.0, 3.0, 3.0],
        "condition_s": [0.2, 0.2, 0.5, 0.3, 0.3],
        "peak_memory_bytes": [100e6, 100e6, 500e6, 300e6, 300e6],
        "target_forwards": [10, 20, 30, 40, 50],
        "drafter_forwards": [4, 4, 4, 4, 4],
        "tokens": [60, 60, 60, 60, 60],
        "proposed": [0, 20, 30, 10, 40],
        "accepted": [0, 10, 15, 10, 5],
        "resampled": [0, 1, 2, 3, 4],
        "accepted_per_step": ["", "1 3", "2", "4 0 1", ""],
        "rejection_map": ["0 1 2 3", "2 1 0 1", "", "", ""],
    })


def _summary(stats: pd.DataFrame) -> pd.DataFrame:
    return SpeedEvaluator().evaluate(_FakeSamples(stats)).summary.set_index("metric")


def test_metrics_equal_hand_computed_values() -> None:
    summary = _summary(_stats())
    r = 11 / 6  # accepted per step: (1 + 3 + 2 + 4 + 0 + 1) / 6 steps
    expected = {  # metric: (value, stderr, n, higher_is_better)
        "latency_s": (3.0, math.nan, 5, False),  # median of 2, 2, 5, 3, 3
        "latency_p90_s": (4.2, math.nan, 5, False),  # 3 + 0.6 * (5 - 3)
        "throughput_img_s": (0.5, math.nan, 3, True),  # 5 images / (2 + 5 + 3) s
        "condition_s": (0.3, math.nan, 5, False),
        "peak_memory_mb": (500.0, math.nan, 3, False),
        "target_forwards": (30.0, math.sqrt(50), 5, False),  # sd sqrt(250) / sqrt(5)
        "drafter_forwards": (4.0, 0.0, 5, False),
        "step_compression": (2.0, math.sqrt(4000 / 20) / 30, 5, True),  # 300 tokens / 150 forwards
        "acceptance_rate": (0.4, math.sqrt(170 / 12) / 25, 4, True),  # 40 / 100; a proposed nothing
        "accepted_per_step_mean": (
            r, math.sqrt(((4 - 2 * r) ** 2 + (2 - r) ** 2 + (5 - 3 * r) ** 2) / 6) / 2, 3, True),
        "accepted_per_step_max": (4.0, math.nan, 3, True),
        "resampled": (2.0, math.sqrt(0.5), 5, False),
    }
    assert list(summary.index) == list(expected)
    assert (summary["subset"] == "all").all()
    for metric, (value, stderr, n, higher) in expected.items():
        row = summary.loc[metric]
        assert row["value"] == pytest.approx(value), metric
        if math.isnan(stderr):
            assert math.isnan(row["stderr"]), metric
        else:
            assert row["stderr"] == pytest.approx(stderr), metric
        assert (row["n"], bool(row["higher_is_better"])) == (n, higher), metric


def test_per_sample_table() -> None:
    result = SpeedEvaluator().evaluate(_FakeSamples(_stats()))
    per_sample = result.per_sample.set_index("sample_id")
    assert list(per_sample.index) == ["a", "b", "c", "d", "e"]
    assert per_sample["step_compression"].tolist() == [6.0, 3.0, 2.0, 1.5, 1.2]
    assert math.isnan(per_sample.loc["a", "acceptance_rate"])
    assert per_sample.loc["d", "acceptance_rate"] == 1.0
    assert per_sample["steps"].tolist() == [0, 2, 1, 3, 0]


def test_raster_decoder_has_no_acceptance_rows() -> None:
    stats = _stats().assign(proposed=0, accepted=0, accepted_per_step="", target_forwards=60)
    summary = _summary(stats)
    assert "acceptance_rate" not in summary.index
    assert "accepted_per_step_mean" not in summary.index
    assert summary.loc["step_compression", "value"] == 1.0


def test_warmup_batches_are_excluded_from_timing() -> None:
    stats = _stats().assign(warmup=[False, False, False, True, True])
    summary = _summary(stats)
    assert summary.loc["latency_s", "value"] == 2.0  # median of 2, 2, 5
    assert summary.loc["throughput_img_s", "value"] == pytest.approx(3 / 7)
    assert summary.loc["peak_memory_mb", "value"] == 500.0
    assert summary.loc["target_forwards", "n"] == 5  # counters use every image


def test_reused_batch_ids_are_refused_unless_sharded() -> None:
    stats = _stats().assign(batch_id="0")
    with pytest.raises(ValueError, match="unique"):
        _summary(stats)
    stats["shard"] = [0, 0, 1, 2, 2]
    assert _summary(stats).loc["throughput_img_s", "value"] == 0.5


@pytest.mark.parametrize(("change", "message"), [
    (lambda s: s.drop(columns="batch_latency_s"), "batch_latency_s"),
    (lambda s: s.assign(decoder=["x", "x", "y", "y", "y"]), "several decoders"),
    (lambda s: s.iloc[:0], "no complete samples"),
])
def test_bad_stats_give_clear_errors(change, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _summary(change(_stats()))


def test_rejection_heatmap() -> None:
    heatmap = rejection_heatmap(_FakeSamples(_stats()))
    np.testing.assert_array_equal(heatmap, [[1.0, 1.0], [1.0, 2.0]])
    wide = _stats().assign(rejection_map=["0 1 2 3 4 5", "", "", "", ""])
    with pytest.raises(ValueError, match="grid"):
        rejection_heatmap(_FakeSamples(wide))
    assert rejection_heatmap(_FakeSamples(wide), grid=(2, 3)).tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="no rejection maps"):
        rejection_heatmap(_FakeSamples(_stats().drop(columns="rejection_map")))


def test_evaluates_a_real_sample_set(tmp_path: Path) -> None:
    stats = _stats()
    prompts = [Prompt(id=f"toy/{i}", text=f"prompt {i}") for i in range(len(stats))]
    samples = SampleSet(tmp_path)
    for spec, (_, row) in zip(plan(prompts, 1, 0), stats.iterrows()):
        samples.write(spec, np.zeros((4, 4, 3), np.uint8), row.drop("sample_id").to_dict())
    result = SpeedEvaluator().evaluate(samples)
    assert list(result.summary.columns) == list(METRIC_COLUMNS)
    pd.testing.assert_frame_equal(result.summary, speed_result(stats).summary)


def test_untimed_rows_count_for_counters_not_for_timings() -> None:
    """Rows of the untimed pass (timed=false, no latency; harness/generate.py) are images like any
    other for the counters, and invisible to latency, throughput and memory."""
    stats = _stats().assign(timed=[True, True, True, False, False],
                            batch_latency_s=[2.0, 2.0, 5.0, None, None],
                            peak_memory_bytes=[100e6, 100e6, 500e6, 900e6, 900e6])
    summary = _summary(stats)
    assert summary.loc["latency_s", "value"] == 2.0 and summary.loc["latency_s", "n"] == 3
    assert summary.loc["throughput_img_s", "value"] == pytest.approx(3 / 7)
    assert summary.loc["peak_memory_mb", "value"] == 500.0, "the timed batches' memory"
    assert summary.loc["target_forwards", "n"] == 5
    per_sample = SpeedEvaluator().evaluate(_FakeSamples(stats)).per_sample
    assert per_sample["timed"].tolist() == [True, True, True, False, False]
    assert per_sample["latency_s"].isna().tolist() == [False, False, False, True, True]


def test_timing_noise_is_a_high_quantile_of_each_batchs_contention_and_steal() -> None:
    stats = _stats().assign(
        latency_reps_s=["2.0 2.0", "2.0 2.0", "5.0 5.5", "3.0 3.0", "3.0 3.0"],  # c: 10% spread
        cpu_reps_s=["2.0 2.0", "2.0 2.0", "5.0 5.5", "1.5 3.0", "1.5 3.0"])  # d, e: half the first rep off the CPU
    summary = _summary(stats)
    noise = [0.0, 0.1, 0.5]  # batches r-0, r-1, r-2: without the scheduler's times, the spread counts
    assert summary.loc["timing_noise", "value"] == pytest.approx(np.quantile(noise, 0.9))
    assert summary.loc["timing_noise", "n"] == 3 and not summary.loc["timing_noise", "higher_is_better"]
    assert summary.loc["timing_spread", "value"] == 0.0  # median of r-0..r-2's spreads 0, 0.1, 0
    wider = stats.assign(latency_reps_s=["2.0 2.0", "2.0 2.0", "5.0 5.5", "3.0 3.6", "3.0 3.6"])
    assert _summary(wider).loc["timing_spread", "value"] == pytest.approx(0.1)  # median of 0, 0.1, 0.2
    assert "timing_noise" not in _summary(_stats()).index, "no repetitions, no CPU times: no figure"
    # with the scheduler's times, the spread no longer counts, the run-queue wait does
    sched = stats.assign(run_reps_s=["2.0 2.0", "2.0 2.0", "5.0 5.5", "3.0 3.0", "3.0 3.0"],
                         wait_reps_s=["0 0", "0 0", "0 0", "1.0 0", "1.0 0"])  # r-2: a quarter of its time waiting
    noise = [0.0, 0.0, 0.5]  # r-2's steal (0.5) is larger than its wait share (0.25)
    assert _summary(sched).loc["timing_noise", "value"] == pytest.approx(np.quantile(noise, 0.9))
    waiting = sched.assign(cpu_reps_s=sched["latency_reps_s"])  # the thread ran whenever it was not waiting
    assert _summary(waiting).loc["timing_noise", "value"] == pytest.approx(np.quantile([0.0, 0.0, 0.25], 0.9))


TRACES = Path(__file__).parent / "fixtures" / "timing_traces.csv"


def _warned_runs(traces: pd.DataFrame, scheduler: bool, threshold: float = 0.1) -> dict[str, bool]:
    """Per recorded run: whether any decoder's timing_noise (0.9 quantile over its batches) exceeds
    `threshold`; without the scheduler's times (`scheduler` false) as on a kernel without schedstat."""
    frame = traces if scheduler else traces.drop(columns=["run_reps_s", "wait_reps_s"])
    warned: dict[str, bool] = {}
    for (run, _decoder), batches in frame.groupby(["run", "decoder"]):
        noise = _noise_per_batch(batches.reset_index(drop=True)).quantile(0.9)
        warned[run] = warned.get(run, False) or bool(noise > threshold)
    return warned


def test_the_noise_statistic_on_recorded_quiet_and_loaded_runs() -> None:
    """Real measurements (tests/fixtures/timing_traces.csv, from benchmarks/timing_noise.py on a 2-core
    machine: the default job five times alone and twice beside a busy process; every timed batch's
    repetitions): alone, at most one run in five warns; beside the load, every run warns. Without the
    scheduler's times the repetitions' spread stands in, and the quiet runs warn as they used to."""
    traces = pd.read_csv(TRACES)
    loads = traces.drop_duplicates("run").set_index("run")["load"]
    warned = _warned_runs(traces, scheduler=True)
    quiet = [run for run in warned if loads[run] == "quiet"]
    loaded = [run for run in warned if loads[run] != "quiet"]
    assert len(quiet) == 5 and len(loaded) == 2
    assert sum(warned[run] for run in quiet) <= 1, warned
    assert all(warned[run] for run in loaded), warned
    spread_only = _warned_runs(traces, scheduler=False)
    assert sum(spread_only[run] for run in quiet) >= 4, "the old statistic: false alarms on a quiet machine"


def test_end_to_end_latency_adds_conditioning_and_tokens_to_pixels() -> None:
    stats = _stats().assign(image_decode_s=[0.5, 0.5, 1.0, 0.4, 0.4])
    summary = _summary(stats)
    assert summary.loc["image_decode_s", "value"] == 0.5
    assert summary.loc["end_to_end_s", "value"] == pytest.approx(2.7 + 1.0)  # median of 2.7, 2.7, 6.5, 3.7, 3.7


def test_island_statistics_of_the_parallel_resampler() -> None:
    stats = _stats().assign(verify_forwards=[1, 1, 2, 0, 0], resample_forwards=[3, 3, 4, 0, 0],
                            islands=[2, 0, 4, 0, 0], resample_set=[10, 0, 20, 0, 0], island_size_max=[6, 0, 9, 0, 0])
    summary = _summary(stats)
    assert summary.loc["verify_forwards", "value"] == pytest.approx(0.8)
    assert summary.loc["resample_forwards", "value"] == pytest.approx(2.0)
    assert summary.loc["islands_per_step", "value"] == pytest.approx(6 / 4)
    assert summary.loc["island_size", "value"] == pytest.approx(30 / 6)
    assert summary.loc["island_size_max", "value"] == 9
