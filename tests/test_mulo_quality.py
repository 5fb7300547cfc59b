"""benchmarks/mulo_quality.py: variant parsing, and an end-to-end sweep on a tiny random model whose
per-image verdicts must add up to the printed scores and gaps."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.mulo import compose_config  # noqa: E402
from benchmarks.mulo_quality import X2_VARIANTS, main, overall, parse_variant  # noqa: E402
from evaluators.geneval_rules import paired_difference  # noqa: E402


def test_a_variant_names_a_decoder_and_its_overrides() -> None:
    assert parse_variant("tau0=mulo_sd:accept.tau=0.0,draft.window=8") == (
        "tau0", "mulo_sd", ["decoder.mulo_sd.accept.tau=0.0", "decoder.mulo_sd.draft.window=8"])
    assert parse_variant("zipar=zipar") == ("zipar", "zipar", [])
    for bad in ("zipar", "=zipar", "raster=raster", "x=mulo_sd:accept.tau"):
        with pytest.raises(ValueError, match="--variant"):
            parse_variant(bad)
    assert all(parse_variant(v)[1] in ("zipar", "mulo_sd") for v in X2_VARIANTS)


def test_sweep_writes_verdicts_that_give_the_printed_rows(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    main(["--model", "random", "--prompts", "6", "--batch", "4", "--procs", "1", "--device", "cpu",
          "--out", str(tmp_path), "--variant", "tau0=mulo_sd:accept.tau=0.0", "--variant", "z2=zipar:window=2"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert list(rows) == ["raster", "tau0", "z2"]
    raster = pd.read_csv(tmp_path / "raster.csv")
    assert len(raster) == 6 and set(raster.columns) == {"sample_id", "tag", "correct", "reason"}
    for name, fields in rows.items():
        frame = pd.read_csv(tmp_path / f"{name}.csv")
        gap, se = paired_difference(frame, raster)
        assert float(fields[3]) == pytest.approx(overall(frame), abs=1e-3)
        assert float(fields[4]) == pytest.approx(gap, abs=1e-3) and float(fields[5]) == pytest.approx(se, abs=1e-3)
    tokens = compose_config("random", []).model.grid ** 2  # raster: one target forward per token
    assert float(rows["raster"][1]) == tokens
    assert float(rows["tau0"][1]) < tokens and float(rows["tau0"][2]) > 0  # drafts accepted, drafter ran


def test_set_overrides_the_config_of_every_row(capsys) -> None:  # type: ignore[no-untyped-def]
    main(["--model", "random", "--prompts", "2", "--batch", "2", "--procs", "1", "--device", "cpu",
          "--set", "model.grid=4", "--variant", "z1=zipar:window=1"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert "model.grid=4" in lines[0]
    assert float(rows["raster"][1]) == 16  # a 4x4 grid, not the config's 8x8
    assert float(rows["z1"][1]) == 4 + 3  # ZipAR window 1 on 4 rows of 4: (rows - 1) * window + cols
    with pytest.raises(SystemExit):
        main(["--model", "random", "--prompts", "2", "--procs", "1", "--set", "model.grid"])


def test_start_draws_the_images_of_a_longer_run(tmp_path: Path) -> None:
    common = ["--model", "random", "--batch", "3", "--procs", "1", "--device", "cpu", "--variant", "z1=zipar:window=1"]
    main([*common, "--prompts", "5", "--out", str(tmp_path / "all")])
    main([*common, "--start", "3", "--prompts", "2", "--out", str(tmp_path / "tail")])
    for name in ("raster", "z1"):
        whole, tail = pd.read_csv(tmp_path / "all" / f"{name}.csv"), pd.read_csv(tmp_path / "tail" / f"{name}.csv")
        pd.testing.assert_frame_equal(tail, whole.iloc[3:].reset_index(drop=True))  # ids, verdicts, reasons


def test_raster_from_reuses_a_stored_raster_row(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    common = ["--model", "random", "--batch", "3", "--procs", "1", "--device", "cpu", "--variant", "z1=zipar:window=1"]
    main([*common, "--prompts", "4", "--out", str(tmp_path / "first")])
    first = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    stored = tmp_path / "first" / "raster.csv"
    main([*common, "--prompts", "4", "--raster-from", str(stored), "--out", str(tmp_path / "again")])
    again = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert again["raster"][1] == "nan"  # not decoded: no forwards counted
    assert again["raster"][3] == first["raster"][3] and again["z1"][3:6] == first["z1"][3:6]
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "again" / "raster.csv"), pd.read_csv(stored))
    with pytest.raises(ValueError, match="--raster-from .*holds 4 samples, this run draws 2"):
        main([*common, "--start", "1", "--prompts", "2", "--raster-from", str(stored)])
    with pytest.raises(FileNotFoundError, match="no such file"):
        main([*common, "--prompts", "4", "--raster-from", str(tmp_path / "none.csv")])


def test_an_unknown_decoder_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no decoder 'nope'"):
        main(["--model", "random", "--prompts", "2", "--procs", "1", "--device", "cpu", "--variant", "x=nope"])


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
