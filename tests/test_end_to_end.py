"""`python -m harness` as a user runs it: in a fresh folder, writing summary.csv and run.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_harness_runs_end_to_end_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["+experiment=smoke", f"hydra.run.dir={out}"]
    res = _run(args, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(out / "summary.csv")
    assert {"experiment", "model", "decoder", "dataset", "evaluator", "metric", "value"} <= set(summary.columns)
    lat = summary[(summary.metric == "latency_s") & (summary.decoder == "raster")]
    assert len(lat) == 1 and lat.value.iloc[0] > 0
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["name"] == "smoke"
    pngs = sorted((out / "samples" / "raster").rglob("*.png"))
    assert len(pngs) == 4
    before = {p: p.read_bytes() for p in pngs}
    # a rerun into the same folder skips every complete sample and re-scores them
    res = _run(args, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "already complete" in res.stderr + res.stdout
    assert {p: p.read_bytes() for p in pngs} == before


@pytest.mark.long
def test_evaluate_only_rescore_existing_samples(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    assert _run(["+experiment=smoke", f"hydra.run.dir={out}", "stages=[generate]"], tmp_path).returncode == 0
    assert not (out / "summary.csv").exists()
    res = _run(["+experiment=smoke", f"hydra.run.dir={tmp_path / 'eval'}", "stages=[evaluate]",
                f"samples_dir={out / 'samples'}"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "eval" / "summary.csv").exists()
    # an evaluate stage refuses an incomplete set, naming the missing samples
    res = _run(["+experiment=smoke", f"hydra.run.dir={tmp_path / 'eval2'}", "stages=[evaluate]",
                f"samples_dir={out / 'samples'}", "dataset_limit=6"], tmp_path)
    assert res.returncode != 0 and "missing" in (res.stderr + res.stdout).lower()


def test_bad_prompts_file_names_path_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    res = _run(["+experiment=smoke", f"hydra.run.dir={tmp_path / 'r'}", "dataset=prompt_file",
                f"dataset.path={bad}"], tmp_path)
    assert res.returncode != 0 and f"{bad}:2" in res.stderr


def test_unwritable_samples_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    res = _run(["+experiment=smoke", f"hydra.run.dir={tmp_path / 'r'}", f"samples_dir={blocker / 'sub'}"], tmp_path)
    assert res.returncode != 0 and "is not writable" in res.stderr and str(blocker / "sub") in res.stderr
