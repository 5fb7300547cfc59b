"""Run outputs: merging summary.csv tables (harness.store.summary) and run.json (harness.store.provenance)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from harness.store import provenance
from harness.store import summary as results

HEADER = "experiment,model,decoder,evaluator,metric,subset,value,stderr,n,higher_is_better\n"


def _write_summary(folder: Path, rows: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.csv").write_text(HEADER + rows)
    return folder


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Two runs of one experiment (a sweep job nested one level deeper) and a bulky image folder."""
    _write_summary(tmp_path / "main" / "t1" / "0", (
        "main,shapes,raster,speed,latency_s,all,1.23456,,8,False\n"
        "main,shapes,raster,speed,step_compression,all,1.0,0.0,8,True\n"
        "main,shapes,raster,geneval,geneval,all,0.71234,0.01,32,True\n"
        "main,shapes,raster,geneval,geneval,colors,0.5,0.02,8,True\n"
    ))
    _write_summary(tmp_path / "main" / "t2", (
        "main,shapes,mulo_sd,speed,latency_s,all,0.41,,8,False\n"
        "main,shapes,mulo_sd,speed,step_compression,all,3.12345,0.1,8,True\n"
    ))
    (tmp_path / "main" / "t2" / "samples" / "images").mkdir(parents=True)
    return tmp_path


def test_load_concatenates_every_summary_with_its_run_dir(runs: Path) -> None:
    frame = results.load([runs])
    assert len(frame) == 6
    expected = [str(runs / "main" / "t1" / "0"), str(runs / "main" / "t2")]
    assert sorted(set(frame["run_dir"])) == expected
    assert frame.groupby("run_dir").size().tolist() == [4, 2]
    assert len(results.load([runs / "main" / "t2" / "summary.csv", runs / "main" / "t2"])) == 2


def test_load_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no summary.csv found under"):
        results.load([tmp_path])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        results.load([tmp_path / "nope"])
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.csv").write_text("metric,value\nfid,3\n")
    with pytest.raises(ValueError, match="lacks the columns"):
        results.load([tmp_path])


def test_pivot_keeps_first_seen_order_and_refuses_clashes(runs: Path) -> None:
    frame = results.load([runs])
    wide = results.pivot(frame)
    assert list(wide.columns) == ["latency_s", "step_compression", "geneval"]
    assert list(wide.index) == [("shapes", "raster"), ("shapes", "mulo_sd")]
    assert wide.loc[("shapes", "mulo_sd"), "step_compression"] == pytest.approx(3.12345)
    assert pd.isna(wide.loc[("shapes", "mulo_sd"), "geneval"])
    with pytest.raises(ValueError, match="share a table cell"):
        results.pivot(frame, index=("model",))
    with pytest.raises(KeyError, match="swept"):
        results.pivot(frame, index=("model", "swept"))
    both = results.pivot(frame, columns=("metric", "subset"), subset=None)
    assert both.loc[("shapes", "raster"), ("geneval", "colors")] == 0.5


def test_format_table(runs: Path) -> None:
    table = results.format_table(results.load([runs]))
    assert table == (
        "| model  | decoder | latency_s ↓ | step_compression ↑ | geneval ↑ |\n"
        "|--------|---------|------------:|-------------------:|----------:|\n"
        "| shapes | raster  |       1.235 |              1.000 |    0.7123 |\n"
        "| shapes | mulo_sd |       0.410 |              3.123 |         - |"
    )


def test_cli_prints_the_table(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert results.main([str(runs)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| model  | decoder | latency_s ↓")
    assert results.main([str(runs), "--all-subsets"]) == 0
    assert "geneval/colors ↑" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        results.main([str(runs / "missing")])


# --- provenance --------------------------------------------------------------------------------

def test_run_json_records_environment_and_config(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(provenance, "PROJECT_ROOT", tmp_path)  # not a git checkout
    path = tmp_path / "run" / "run.json"
    record = provenance.write_run_json(path, {"seed": 3, "out": tmp_path}, {"shard": 1})
    assert json.loads(path.read_text()) == record
    assert record["git"] == {"commit": "unknown", "dirty": "unknown"}
    assert record["config"] == {"seed": 3, "out": str(tmp_path)}
    assert record["extra"] == {"shard": 1}
    assert set(provenance.PACKAGES) == set(record["packages"])
    assert record["packages"]["pandas"] == pd.__version__
    assert record["device"]["cpu"] and record["python"].count(".") == 2
    assert not [p for p in path.parent.iterdir() if p.name != "run.json"]  # atomic: no leftovers
    again = provenance.write_run_json(path, {"seed": 3}, None)
    assert again["created_utc"] == record["created_utc"] and again["extra"] == {}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_state_reports_commit_and_dirty_flag(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        command = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    assert provenance.git_state(tmp_path)["commit"] == "unknown"  # no commit yet
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("commit", "-q", "-m", "init")
    assert provenance.git_state(tmp_path) == {"commit": git("rev-parse", "HEAD"), "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert provenance.git_state(tmp_path)["dirty"] is True


def test_headline_has_at_most_eight_columns_with_errors() -> None:
    rows = []
    for decoder, value in (("raster", 1.0), ("mulo_sd", 3.0)):
        for metric, stderr in (("target_forwards", 0.0), ("speedup_vs_raster", 0.2), ("geneval", 0.01),
                               ("geneval_gap_vs_raster", 0.03), ("dpg_bench", 0.5), ("fid", 0.0),
                               ("kid", 0.001), ("hpsv2", 0.1), ("latency_s", 0.1)):
            rows.append({"model": "m", "decoder": decoder, "metric": metric, "subset": "all",
                         "value": value, "stderr": stderr, "n": 4, "higher_is_better": True})
    table = results.headline(pd.DataFrame(rows))
    header = table.splitlines()[0]
    assert header.count("|") - 1 == results.HEADLINE_COLUMNS
    assert "latency_s" not in table and "HPSv2" not in header  # the eighth metric does not fit
    assert "3.00 ± 0.20" in table and "target fwd" in header


# --- incomplete runs, sidecars, options (issue 57) ------------------------------------------------

_KILL_AFTER_FIRST_SUMMARY = """
import os, signal, sys
import harness.store.summary as summary
original = summary.write_summary
def write_summary(path, frame):
    original(path, frame)
    os.kill(os.getpid(), signal.SIGKILL)  # killed during evaluation: one decoder's rows written
summary.write_summary = write_summary
from harness.__main__ import main
sys.argv = ["harness", *sys.argv[1:]]
main()
"""


def _killed_run(tmp_path: Path) -> Path:
    """A smoke run of two decoders SIGKILLed after the first decoder's rows reached summary.csv."""
    import os
    import sys

    run_dir = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", _KILL_AFTER_FIRST_SUMMARY, "+experiment=smoke", "decoder=[raster,mulo_sd]",
            "evaluator=[speed]", "device=cpu", f"hydra.run.dir={run_dir}"]
    assert subprocess.run(args, env=env, capture_output=True, timeout=300).returncode == -9
    assert (run_dir / "summary.csv").is_file()
    return run_dir


def test_a_run_killed_during_evaluation_is_refused_unless_read_as_partial(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.report.tables import main as tables_main

    run_dir = _killed_run(tmp_path)
    with pytest.raises(results.IncompleteRunError) as refused:
        results.load([run_dir])
    message = str(refused.value)
    assert f"run {run_dir} is incomplete" in message and "raster, mulo_sd" in message and "--partial" in message
    for main in (results.main, lambda argv: tables_main([*argv, "--out", str(tmp_path / "tables")])):
        with pytest.raises(SystemExit) as exit_:
            main([str(run_dir)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "error: run" in err and "incomplete" in err and "Traceback" not in err
    assert results.main([str(run_dir), "--partial"]) == 0
    out = capsys.readouterr().out
    label, table = out.split("\n", 1)
    assert label.startswith(f"> PARTIAL: run {run_dir} is incomplete") and "raster" in table and "mulo_sd" not in table
    assert len(results.load([run_dir], partial=True)) > 0


def test_a_complete_run_reads_without_a_label(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.run import run
    from tests.conftest import compose_cfg

    run(compose_cfg(["+experiment=smoke", "decoder=[raster,mulo_sd]", "evaluator=[speed]", "device=cpu"]),
        tmp_path / "whole")
    assert results.main([str(tmp_path / "whole"), "--partial"]) == 0
    out = capsys.readouterr().out
    assert "PARTIAL" not in out and "mulo_sd" in out


def test_a_sidecar_without_its_hash_is_warned_as_unverifiable(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "run" / "summary.csv"
    path.parent.mkdir()
    results.write_summary(path, pd.DataFrame([{"metric": "fid", "subset": "all", "value": 3.0, "stderr": None,
                                               "n": 8, "higher_is_better": False}]))
    meta = json.loads((path.parent / results.META_NAME).read_text())
    with caplog.at_level("WARNING"):
        results.read_summary(path)
    assert not caplog.records  # a full sidecar: verified without a word
    del meta["sha256"]
    (path.parent / results.META_NAME).write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        assert len(results.read_summary(path)) == 1
    assert any("no sha256" in r.getMessage() and "cannot be verified" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("count", ["-1", "0"])
def test_tables_refuses_a_grid_without_images(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              count: str) -> None:
    from harness.report.tables import main as tables_main

    with pytest.raises(SystemExit) as exit_:
        tables_main([str(runs), "--out", str(tmp_path / "out"), "--grid-images", count])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--grid-images must be a whole number >= 1" in err and count in err
