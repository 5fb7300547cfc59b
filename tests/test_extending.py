"""docs/extending.md's worked example: a decoder from a package outside the harness, selected by a
config in the user's own folder (hydra.searchpath), runs end to end through `python -m harness`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT

EXAMPLES = ROOT / "docs" / "examples"


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLES)]), "OMP_NUM_THREADS": "1"}
    args = [
        sys.executable,
        "-m",
        "harness",
        f"hydra.searchpath=[file://{EXAMPLES / 'my_configs'}]",
        "+experiment=my_decoder",
        "dataset_limit=4",
        "batch_size=4",
        "threads=1",
        *overrides,
    ]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _images(run_dir: Path, decoder: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "samples" / decoder / "images").glob("*.png"))}


@pytest.mark.long
def test_a_decoder_from_the_users_package_runs_end_to_end(tmp_path: Path) -> None:
    res = _run(tmp_path, f"hydra.run.dir={tmp_path / 'hot'}")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "hot" / "summary.csv")
    assert {"raster", "annealed_raster"} <= set(summary.decoder)
    assert "geneval" in set(summary.metric) and "speedup_vs_raster" in set(summary.metric)
    hot = _images(tmp_path / "hot", "annealed_raster")
    assert len(hot) == 4 and hot != _images(tmp_path / "hot", "raster")
    # with the start temperature equal to the run's, the user's decoder is raster, token for token
    res = _run(
        tmp_path, f"hydra.run.dir={tmp_path / 'flat'}", "decoder.annealed_raster.start_temperature=1.0"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert _images(tmp_path / "flat", "annealed_raster") == _images(tmp_path / "flat", "raster")
