"""Prompt shards without a cluster: shard jobs run one after the other (Hydra's basic launcher)
into one shared SampleSet per decoder; the evaluate stage scores the merged, unsharded plan and
refuses an incomplete one. tests/test_slurm.py runs the same flow through a real SLURM."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT

# A seconds-long sharded baselines run: 6 prompts, 2 decoders, speed + GenEval (shapes detector).
BASE = ["+experiment=baselines_sharded", "model=random", "dataset_limit=6", "decoder=[raster,sjd]",
        "evaluator=[speed,geneval_shapes]", "threads=1", "batch_size=2", "warmup_batches=0"]
# Metrics that measure time or memory of one process; everything else must match exactly.
TIMING_METRICS = {"speedup_e2e_vs_raster", "latency_s", "latency_p90_s", "throughput_img_s", "condition_s", "peak_memory_mb",
                  "speedup_vs_raster", "timing_noise", "timing_spread", "image_decode_s", "end_to_end_s"}


def harness(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` in `cwd`, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, f"{res.args}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def pngs(samples_dir: Path) -> dict[str, bytes]:
    """decoder/sample_id -> PNG bytes of every image under a samples_dir."""
    return {f"{p.parent.parent.name}/{p.stem}": p.read_bytes()
            for p in sorted(samples_dir.glob("*/images/*.png"))}


def non_timing(summary_csv: Path) -> pd.DataFrame:
    """The summary without timing/memory metrics and without the experiment column, sorted."""
    table = pd.read_csv(summary_csv)
    table = table[~table.metric.isin(TIMING_METRICS)].drop(columns=["experiment", "ci_low", "ci_high"])
    return table.sort_values(["decoder", "evaluator", "metric", "subset"]).reset_index(drop=True)


def unsharded_reference(tmp_path: Path, extra: list[str] | None = None) -> Path:
    """The same experiment as one local, unsharded job; returns its run dir."""
    out = tmp_path / "unsharded"
    ok(harness([*BASE, *(extra or []), "shard.count=1", "stages=[generate,evaluate]", "samples_dir=null",
                f"hydra.run.dir={out}"], tmp_path))
    return out


@pytest.mark.long
def test_local_shard_sweep_shares_one_sample_set_and_matches_unsharded_run(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    ok(harness(["-m", *BASE, f"hydra.sweep.dir={sweep}"], tmp_path))
    # both shard jobs wrote into <sweep dir>/samples/<decoder>, none into its own job folder
    assert sorted(p.name for p in (sweep / "samples").iterdir()) == ["raster", "sjd"]
    assert not (sweep / "0" / "samples").exists() and not (sweep / "1" / "samples").exists()
    assert not (sweep / "0" / "summary.csv").exists()  # shard jobs only generate
    for job in ("0", "1"):
        log = (sweep / job / "__main__.log").read_text()
        assert "3 of 3 samples pending" in log  # each job planned its own half of 6 prompts
    ok(harness([*BASE, "stages=[evaluate]", f"samples_dir={sweep / 'samples'}",
                f"hydra.run.dir={sweep / 'evaluate'}"], tmp_path))

    ref = unsharded_reference(tmp_path)
    merged, single = pngs(sweep / "samples"), pngs(ref / "samples")
    assert len(single) == 12 and merged == single  # 6 prompts x 2 decoders, byte-identical
    pd.testing.assert_frame_equal(non_timing(sweep / "evaluate" / "summary.csv"),
                                  non_timing(ref / "summary.csv"))
    summary = pd.read_csv(sweep / "evaluate" / "summary.csv")
    gaps = summary[summary.metric == "geneval_gap_vs_raster"].set_index("decoder")
    overall = summary[(summary.metric == "geneval") & (summary.subset == "all")].set_index("decoder")
    assert sorted(gaps.index) == ["raster", "sjd"] and gaps.loc["raster", "value"] == 0.0
    assert gaps.loc["sjd", "value"] == pytest.approx(overall.loc["sjd", "value"] - overall.loc["raster", "value"])


@pytest.mark.long
def test_evaluate_refuses_until_every_shard_is_complete(tmp_path: Path) -> None:
    args = [*BASE, "decoder=[raster]", "evaluator=[speed]", "dataset_limit=4"]
    shared = tmp_path / "shared"
    # a shard job cannot evaluate: the error comes before any sample is written
    res = harness([*args, "stages=[generate,evaluate]", f"samples_dir={shared}",
                   f"hydra.run.dir={tmp_path / 'both'}"], tmp_path)
    assert res.returncode != 0 and "a shard job cannot evaluate" in res.stderr
    assert not list(shared.glob("*/images/*.png"))

    ok(harness([*args, "shard.index=0", f"samples_dir={shared}", f"hydra.run.dir={tmp_path / 's0'}"],
               tmp_path))
    evaluate = [*args, "stages=[evaluate]", f"samples_dir={shared}"]
    res = harness([*evaluate, f"hydra.run.dir={tmp_path / 'e0'}"], tmp_path)
    assert res.returncode != 0
    # shard 1 holds prompts 1 and 3 (round-robin): exactly those are named as missing
    assert "2 of 4 planned samples are missing" in res.stderr
    assert "shapes-00001_00, shapes-00003_00" in res.stderr
    assert not (tmp_path / "e0" / "summary.csv").exists()

    ok(harness([*args, "shard.index=1", f"samples_dir={shared}", f"hydra.run.dir={tmp_path / 's1'}"],
               tmp_path))
    ok(harness([*evaluate, f"hydra.run.dir={tmp_path / 'e1'}"], tmp_path))
    assert pd.read_csv(tmp_path / "e1" / "summary.csv").query("metric == 'target_forwards'").n.iloc[0] == 4
