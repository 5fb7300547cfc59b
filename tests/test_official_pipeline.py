"""`python -m harness model=llamagen_tiny|tar_tiny` end to end with every decoder option, in a
fresh folder, with no network: the tiny official-layout stacks run through the real pipeline."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from tests.conftest import CONF, ROOT

DECODERS = sorted(p.stem for p in (CONF / "decoder").glob("*.yaml"))


@pytest.mark.long
@pytest.mark.parametrize("model", ["llamagen_tiny", "tar_tiny"])
def test_tiny_official_stack_runs_every_decoder(model: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    args = [f"model={model}", f"decoder=[{','.join(DECODERS)}]", "dataset_limit=2", "batch_size=2",
            "warmup_batches=0", "threads=1", "device=cpu", f"hydra.run.dir={out}"]
    res = subprocess.run([sys.executable, "-m", "harness", *args], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = pd.read_csv(out / "summary.csv")
    lat = summary[summary.metric == "latency_s"]
    assert set(lat.decoder) == set(DECODERS) and (lat.model == model).all()
    for dec in DECODERS:
        pngs = sorted((out / "samples" / dec).rglob("*.png"))
        assert len(pngs) == 2
        assert Image.open(pngs[0]).size == (64, 64)
