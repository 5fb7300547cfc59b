"""Sharded sweeps through `hydra/launcher=slurm` against a real SLURM cluster (scripts/slurm_local.sh).

Run with `pytest -m slurm` after `scripts/slurm_local.sh start` and `export SLURM_CONF=...`
(or SLURM_DIR=<dir> for a cluster started with another SLURM_DIR); skipped when no cluster answers.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import pytest

from baselines.methods.raster import RasterDecoder
from tests.conftest import ROOT
from tests.test_sharding import BASE, non_timing, ok, pngs, unsharded_reference

pytestmark = pytest.mark.slurm

# Resources of the one-node test cluster (the launcher's defaults ask for a GPU and 64 GB).
LAUNCHER = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=10"]


class SlowRasterDecoder(RasterDecoder):
    """Raster decoding that sleeps before each batch: a job that is reliably mid-generation when
    the test cancels it. Images are exactly the raster decoder's."""

    def __init__(self, sampling: Any, delay_s: float = 1.0, name: str = "raster") -> None:
        super().__init__(sampling, name)
        self.delay_s = delay_s

    def generate(self, models: Any, cond: Any, seeds: Sequence[int]) -> Any:
        time.sleep(self.delay_s)
        return super().generate(models, cond, seeds)


def _slurm_conf() -> Path:
    if os.environ.get("SLURM_CONF"):
        return Path(os.environ["SLURM_CONF"])
    return Path(os.environ.get("SLURM_DIR", "/tmp/slurm-local")) / "slurm.conf"


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """Environment for SLURM clients and the harness; skips when no cluster answers."""
    conf = _slurm_conf()
    start = "start one with `scripts/slurm_local.sh start` (Debian packages: docs/slurm.md)"
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        pytest.skip(f"no SLURM cluster: sinfo/sbatch not installed; {start}")
    if not conf.is_file():
        pytest.skip(f"no SLURM cluster: {conf} does not exist (set SLURM_CONF or SLURM_DIR); {start}")
    env = {**os.environ, "SLURM_CONF": str(conf), "PYTHONPATH": str(ROOT)}
    try:
        node = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True,
                              timeout=20)
        acct = subprocess.run(["sacct", "-n", "-X", "-o", "JobID"], env=env, capture_output=True, text=True,
                              timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip(f"no SLURM cluster: sinfo/sacct did not answer in 20 s ({conf}); {start}")
    states = node.stdout.split()
    if node.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mixed", "allocated") for s in states):
        answer = (node.stdout + node.stderr).strip()[:200]
        pytest.skip(f"no SLURM cluster up at {conf} (sinfo: {answer!r}); {start}")
    if acct.returncode != 0:
        pytest.skip(f"SLURM accounting is off at {conf} (sacct: {acct.stderr.strip()[:200]!r}): submitit "
                    "cannot tell that a cancelled job died; start the cluster with ACCOUNTING=1")
    return env


def harness(args: list[str], cwd: Path, env: dict[str, str],
            timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def job_name() -> str:
    return f"mulo_test_{uuid.uuid4().hex[:8]}"


def squeue(env: dict[str, str], name: str) -> list[str]:
    """`<array id> <job id> <state>` lines of the jobs called `name`."""
    res = subprocess.run(["squeue", "-h", "-n", name, "-o", "%F %i %T"], env=env, capture_output=True,
                         text=True, timeout=30)
    return res.stdout.split("\n") if res.stdout.strip() else []


def test_two_shard_sweep_through_slurm_matches_local_run(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    sweep = tmp_path / "sweep"
    name = job_name()
    t0 = time.monotonic()
    ok(harness(["-m", *BASE, *LAUNCHER, f"hydra.launcher.name={name}", f"hydra.sweep.dir={sweep}"],
               tmp_path, slurm_env))
    submissions = list((sweep / ".submitit").glob("*/*_submission.sh"))
    assert len(submissions) == 1 and "#SBATCH --array=0-1" in submissions[0].read_text()  # one array, 2 tasks
    # the evaluate stage as one more SLURM job over the merged set (shard.index=0: one job, not two)
    ok(harness(["-m", *BASE, "stages=[evaluate]", "shard.index=0", f"samples_dir={sweep / 'samples'}",
                *LAUNCHER, f"hydra.launcher.name={name}", f"hydra.sweep.dir={tmp_path / 'evaluate'}"],
               tmp_path, slurm_env))
    print(f"SLURM sweep + evaluate: {time.monotonic() - t0:.1f} s")
    assert not (tmp_path / "evaluate" / "1").exists()  # shard.index=0 replaced the experiment's shard sweep

    ref = unsharded_reference(tmp_path)
    merged, single = pngs(sweep / "samples"), pngs(ref / "samples")
    assert len(single) == 12 and merged == single
    pd.testing.assert_frame_equal(non_timing(tmp_path / "evaluate" / "0" / "summary.csv"),
                                  non_timing(ref / "summary.csv"))


def test_cancelled_job_resubmitted_completes_sample_set(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    kill_wait = _kill_wait(slurm_env)
    per_shard = 4
    delay = max(1.0, (kill_wait + 4) / (per_shard - 1))  # still generating when SIGKILL follows scancel
    sweep, name = tmp_path / "sweep", job_name()
    args = [*BASE, "dataset_limit=8", "decoder=[raster]", "evaluator=[speed]", "batch_size=1"]
    slow = ["decoder.raster._target_=tests.test_slurm.SlowRasterDecoder", f"+decoder.raster.delay_s={delay}"]
    cmd = [sys.executable, "-m", "harness", "-m", *args, *slow, *LAUNCHER, f"hydra.launcher.name={name}",
           f"hydra.sweep.dir={sweep}"]
    records = sweep / "samples" / "raster" / "records"
    shard0 = [f"shapes-{i:05d}_00" for i in range(0, 8, 2)]  # round-robin: shard 0 has prompts 0, 2, 4, 6

    launcher = subprocess.Popen(cmd, cwd=tmp_path, env=slurm_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not any((records / f"{sid}.json").exists() for sid in shard0):
            assert launcher.poll() is None, launcher.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "shard 0 wrote no sample in 300 s"
            time.sleep(0.2)
        jobs = squeue(slurm_env, name)
        array_id = jobs[0].split()[0]
        subprocess.run(["scancel", f"{array_id}_0"], env=slurm_env, check=True, timeout=30)
        output, _ = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            subprocess.run(["scancel", "-n", name], env=slurm_env, timeout=30)
    assert launcher.returncode != 0, output[-3000:]  # the launcher reports the cancelled job
    state = subprocess.run(["sacct", "-n", "-X", "-j", f"{array_id}_0", "-o", "State"], env=slurm_env,
                           capture_output=True, text=True, timeout=30).stdout
    assert "CANCELLED" in state, state
    done_before = sorted(p.stem for p in records.glob("*.json") if p.stem in shard0)
    assert 0 < len(done_before) < per_shard, f"not cancelled mid-generation: {done_before}"
    images = sweep / "samples" / "raster" / "images"
    kept = {p.name: (p.read_bytes(), p.stat().st_mtime_ns)
            for sid in done_before for p in (images / f"{sid}.png", records / f"{sid}.json")}

    # resubmit the same sweep: shard 0 resumes, shard 1 (complete) generates nothing
    res = subprocess.run(cmd, cwd=tmp_path, env=slurm_env, capture_output=True, text=True, timeout=600)
    ok(res)
    planned = sorted(f"shapes-{i:05d}_00" for i in range(8))
    assert sorted(p.stem for p in records.glob("*.json")) == planned  # nothing missing, nothing extra
    assert sorted(p.stem for p in images.glob("*.png")) == planned
    assert not [p for p in (sweep / "samples").rglob("*") if p.name.endswith(".tmp")]  # no leftovers
    for sid in done_before:  # samples finished before the cancel were kept, not generated again
        for p in (images / f"{sid}.png", records / f"{sid}.json"):
            assert (p.read_bytes(), p.stat().st_mtime_ns) == kept[p.name], p
    runs = {sid: json.loads((records / f"{sid}.json").read_text())["stats"]["batch_id"].split("-")[0]
            for sid in shard0}
    assert len({runs[sid] for sid in done_before}) == 1  # one generation run per sample, two runs in all
    assert len(set(runs.values())) == 2

    evaluate = harness([*args, "stages=[evaluate]", f"samples_dir={sweep / 'samples'}",
                        f"hydra.run.dir={tmp_path / 'evaluate'}"], tmp_path, slurm_env)
    ok(evaluate)
    samples = pd.read_csv(sweep / "samples" / "raster" / "samples.csv")
    assert sorted(samples.sample_id) == planned  # consolidated: every sample exactly once
    ref = unsharded_reference(tmp_path, ["dataset_limit=8", "decoder=[raster]", "evaluator=[speed]",
                                         "batch_size=1"])
    assert pngs(sweep / "samples") == pngs(ref / "samples")  # identical to an uninterrupted run


def test_evaluate_job_refuses_incomplete_sample_set(tmp_path: Path, slurm_env: dict[str, str]) -> None:
    args = [*BASE, "dataset_limit=4", "decoder=[raster]", "evaluator=[speed]"]
    samples, name = tmp_path / "sweep" / "samples", job_name()
    # only shard 0 of 2 is generated
    ok(harness(["-m", *args, "shard.index=0", *LAUNCHER, f"hydra.launcher.name={name}",
                f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path, slurm_env))
    generated = sorted(p.stem for p in samples.glob("raster/images/*.png"))
    assert generated == ["shapes-00000_00", "shapes-00002_00"]
    res = harness(["-m", *args, "stages=[evaluate]", "shard.index=0", f"samples_dir={samples}", *LAUNCHER,
                   f"hydra.launcher.name={name}", f"hydra.sweep.dir={tmp_path / 'evaluate'}"],
                  tmp_path, slurm_env)
    # The job ran on the cluster and stopped with the input error's one line (exit status 2), which
    # the submitting command reports with its message.
    assert res.returncode != 0
    assert "is incomplete: 2 of 4 planned samples are missing" in res.stderr
    assert "shapes-00001_00, shapes-00003_00" in res.stderr
    logs = list((tmp_path / "evaluate" / ".submitit").glob("*/*_log.err"))  # it did run as a SLURM job
    assert any("2 of 4 planned samples are missing" in log.read_text() for log in logs)
    assert not (tmp_path / "evaluate" / "0" / "summary.csv").exists()


def _kill_wait(env: dict[str, str]) -> int:
    """The cluster's KillWait (seconds between a cancelled step's SIGTERM and its SIGKILL)."""
    out = subprocess.run(["scontrol", "show", "config"], env=env, capture_output=True, text=True,
                         timeout=30).stdout
    for line in out.splitlines():
        if line.split("=")[0].strip() == "KillWait":
            return int(line.split("=")[1].split()[0])
    return 30
