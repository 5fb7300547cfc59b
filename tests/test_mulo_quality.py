"""benchmarks/mulo_quality.py: variant parsing, and sweeps on a tiny random model that run the
pipeline untimed, whose per-image verdicts add up to the printed scores and gaps."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.mulo_quality import X2_VARIANTS, main, parse_variant  # noqa: E402
from evaluators.geneval_rules import tag_accuracies  # noqa: E402
from harness.store.summary import paired_difference  # noqa: E402
from tests.single_thread import single_thread  # noqa: F401,E402  (autouse)

TINY = ["--set", "model.grid=8", "--set", "model.vocab=32", "--set", "model.dim=32", "--set", "model.n_layer=1"]
COMMON = ["--model", "random", "--batch", "3", "--device", "cpu", *TINY]


def _rows(out: str) -> dict[str, list[str]]:
    """The printed Markdown table: method (without the setting a label may add) -> its cells."""
    return {line.split("|")[2].strip().split(" (")[0]: [c.strip() for c in line.split("|")[3:-1]]
            for line in out.splitlines() if line.startswith("| ") and line.count("|") > 4 and "Method" not in line}


def test_a_variant_names_a_decoder_and_its_overrides() -> None:
    assert parse_variant("tau0=mulo_sd:accept.tau=0.0,draft.window=8") == (
        "tau0", "mulo_sd", ["accept.tau=0.0", "draft.window=8"])
    assert parse_variant("zipar=zipar") == ("zipar", "zipar", [])
    for bad in ("zipar", "=zipar", "raster=raster", "x=mulo_sd:accept.tau"):
        with pytest.raises(ValueError, match="--variant"):
            parse_variant(bad)
    assert all(parse_variant(v)[1] in ("zipar", "mulo_sd") for v in X2_VARIANTS)


def test_sweep_is_an_untimed_pipeline_run_whose_verdicts_give_the_printed_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = main([*COMMON, "--prompts", "6", "--out", str(tmp_path), "--variant", "tau0=mulo_sd:accept.tau=0.0",
                    "--variant", "z2=zipar:window=2"])
    out = capsys.readouterr().out
    rows = _rows(out)
    assert list(rows) == ["raster", "tau0", "z2"]
    assert "| z2 (window=2) " in out  # ZipAR off the paper's window 16 says so
    assert "latency_s" not in set(summary.metric), "untimed"
    raster = pd.read_csv(tmp_path / "per_sample" / "raster" / "geneval.csv")
    assert len(raster) == 6 and {"sample_id", "tag", "correct", "reason"} <= set(raster.columns)
    for name, cells in rows.items():
        frame = pd.read_csv(tmp_path / "per_sample" / name / "geneval.csv")
        gap, se = paired_difference(frame, raster)
        overall = tag_accuracies(frame["tag"].tolist(), frame["correct"].tolist())["overall"]
        assert float(cells[2]) == pytest.approx(overall, abs=1e-3)
        assert cells[3] == f"{gap:.3f} ± {se:.3f}"
        stats = pd.read_csv(tmp_path / "samples" / name / "stats.csv")
        assert not stats.timed.any() and stats.batch_latency_s.isna().all()
        assert float(cells[0]) == pytest.approx(stats.target_forwards.mean(), abs=0.05)
    assert float(rows["raster"][0]) == 64  # raster: one target forward per token of the 8x8 grid
    assert float(rows["tau0"][0]) < 64 and float(rows["tau0"][1]) > 0  # drafts accepted, drafter ran


def test_set_overrides_the_config_of_every_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main([*COMMON, "--prompts", "2", "--out", str(tmp_path / "a"), "--set", "model.grid=4",
          "--variant", "z1=zipar:window=1", "--variant", "m=mulo_sd", "--set", "decoder.mulo_sd.accept.tau=0.0"])
    out = capsys.readouterr().out
    rows = _rows(out)
    assert "model.grid=4" in out.splitlines()[0]
    assert float(rows["raster"][0]) == 16  # a 4x4 grid, not the config's 8x8
    assert float(rows["z1"][0]) == 4 + 3  # ZipAR window 1 on 4 rows of 4: (rows - 1) * window + cols
    assert '"tau": 0.0' in (tmp_path / "a" / "samples" / "m" / "binding.json").read_text()
    with pytest.raises(SystemExit):
        main([*COMMON, "--prompts", "2", "--set", "model.grid"])


def test_start_draws_the_images_of_a_longer_run(tmp_path: Path) -> None:
    common = [*COMMON, "--variant", "z1=zipar:window=1"]
    main([*common, "--prompts", "5", "--out", str(tmp_path / "all")])
    main([*common, "--start", "3", "--prompts", "2", "--out", str(tmp_path / "tail")])
    for name in ("raster", "z1"):
        whole = pd.read_csv(tmp_path / "all" / "per_sample" / name / "geneval.csv")
        tail = pd.read_csv(tmp_path / "tail" / "per_sample" / name / "geneval.csv")
        pd.testing.assert_frame_equal(tail, whole.iloc[3:].reset_index(drop=True))  # ids, verdicts, reasons


def test_samples_keeps_raster_between_runs_and_refuses_other_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [*COMMON, "--prompts", "4", "--samples", str(tmp_path / "samples")]
    main([*common, "--out", str(tmp_path / "first"), "--variant", "z1=zipar:window=1"])
    first = _rows(capsys.readouterr().out)
    raster = tmp_path / "samples" / "raster" / "records"
    stamps = {p.name: p.stat().st_mtime_ns for p in raster.iterdir()}
    main([*common, "--out", str(tmp_path / "again"), "--variant", "z2=zipar:window=2"])
    again = _rows(capsys.readouterr().out)
    assert {p.name: p.stat().st_mtime_ns for p in raster.iterdir()} == stamps, "raster was not decoded again"
    assert again["raster"] == first["raster"]
    from harness.store.samples import BindingMismatchError

    with pytest.raises(BindingMismatchError, match="seed"):
        main([*common, "--seed", "7", "--out", str(tmp_path / "other"), "--variant", "z1=zipar:window=1"])


def test_an_unknown_decoder_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no decoder 'nope'"):
        main([*COMMON, "--prompts", "2", "--variant", "x=nope"])


def test_failure_kinds_read_every_reason_the_rules_write() -> None:
    from benchmarks.mulo_quality import failure_kind, failure_shares
    from evaluators.geneval_rules import Detection, GenEvalRules

    rules = GenEvalRules()

    def reason(dets, meta):  # type: ignore[no-untyped-def]
        return rules.evaluate(dets, meta)[1]

    def det(cls, box, color="red"):  # type: ignore[no-untyped-def]
        return Detection(cls=cls, box=box, score=0.99, color=color)

    two = {"tag": "counting", "include": [{"class": "traffic light", "count": 2}],
           "exclude": [{"class": "traffic light", "count": 3}]}
    red = {"tag": "colors", "include": [{"class": "circle", "count": 1, "color": "blue"}]}
    rel = {"tag": "position", "include": [{"class": "square", "count": 1},
                                          {"class": "circle", "count": 1, "position": ["left of", 0]}]}
    boxes = [(0, 0, 10, 10), (20, 0, 30, 10), (40, 0, 50, 10)]
    cases = {
        "missing": reason([det("traffic light", boxes[0])], two),
        "extra": reason([det("traffic light", b) for b in boxes], two),
        "color": reason([det("circle", boxes[0])], red),
        "position": reason([det("square", boxes[0]), det("circle", boxes[2])], rel),
    }
    for kind, text in cases.items():
        assert text and failure_kind(text) == kind, (kind, text)
    missing_target = reason([det("circle", boxes[0])], rel).splitlines()
    assert [failure_kind(line) for line in missing_target] == ["missing", "position"]
    with pytest.raises(ValueError, match="no failure kind"):
        failure_kind("something else")
    frame = pd.DataFrame({"reason": [cases["missing"], "", "\n".join(missing_target), float("nan")]})
    assert failure_shares(frame) == {"missing": 0.5, "extra": 0.0, "color": 0.0, "position": 0.25}


def test_timed_times_the_first_images_at_batch_one_and_adds_the_speed_columns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = main([*COMMON, "--prompts", "4", "--timed", "2", "--out", str(tmp_path),
                    "--variant", "z1=zipar:window=1"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "Method" in line)
    assert "Speed-up" in header and "Noise" in header
    assert {"latency_s", "speedup_vs_raster"} <= set(summary.metric)
    for name in ("raster", "z1"):
        stats = pd.read_csv(tmp_path / "samples" / name / "stats.csv").set_index("sample_id").sort_index()
        assert stats.timed.tolist() == [True, True, False, False]
        assert (stats.batch_size[stats.timed] == 1).all() and stats.batch_latency_s[stats.timed].gt(0).all()
    with pytest.raises(SystemExit):
        main([*COMMON, "--prompts", "2", "--timed", "3"])
