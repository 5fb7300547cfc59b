"""The target's EAGLE head is loaded only by jobs with a decoder that drafts with it: a damaged head
file stops those jobs before anything is generated and no other, and the SampleSets of the decoders
that do not use the head are shared by jobs with and without EAGLE rows (the weights digest leaves
the head out; the head's digest binds the EAGLE rows' sets)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import preflight
from harness.cli import EXIT_INPUT_ERROR, report_errors
from harness.run import run
from tests.conftest import compose_cfg

BASE = ["+experiment=smoke", "model=llamagen_tiny", "dataset_limit=2", "evaluator=[speed]"]


def _run(tmp_path: Path, name: str, overrides: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit status, stderr) of one in-process job into tmp_path/name."""
    capsys.readouterr()
    cfg = compose_cfg([*BASE, *overrides])
    try:
        report_errors(lambda: run(cfg, tmp_path / name))
    except SystemExit as exit_:
        return int(exit_.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


def _pngs(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.rglob("*.png"))}


def test_model_for_drops_the_head_only_without_a_decoder_that_requires_it() -> None:
    cfg = compose_cfg([*BASE, "decoder=[raster,eagle2]"])
    assert preflight.model_for(cfg, ["raster"]).eagle_head_file is None
    assert preflight.model_for(cfg, ["raster", "eagle2"]).eagle_head_file == cfg.model.eagle_head_file
    assert cfg.model.eagle_head_file == "eagle_head_tiny.safetensors"  # the job's config is left as written
    shapes = compose_cfg(["model=shapes", "decoder=[raster,lantern]"])
    assert preflight.model_for(shapes, ["raster"]).eagle_head is False
    assert preflight.model_for(shapes, ["lantern"]).eagle_head is True


def test_a_damaged_head_stops_only_the_jobs_that_draft_with_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    damaged = tmp_path / "head.safetensors"
    damaged.write_bytes(b"\x00" * 40)  # not a safetensors file
    status, err = _run(tmp_path, "raster", ["decoder=[raster]", f"model.eagle_head_file={damaged}"], capsys)
    assert status == 0, err
    assert len(_pngs(tmp_path / "raster" / "samples" / "raster")) == 2
    status, err = _run(tmp_path, "eagle", ["decoder=[raster,eagle2]", f"model.eagle_head_file={damaged}"], capsys)
    assert status == EXIT_INPUT_ERROR and str(damaged) in err, err
    assert not _pngs(tmp_path / "eagle"), "nothing may be generated"


def test_raster_images_are_shared_by_jobs_with_and_without_the_head(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = tmp_path / "samples"
    status, err = _run(tmp_path, "first", ["decoder=[raster]", f"samples_dir={samples}"], capsys)
    assert status == 0, err
    made = _pngs(samples / "raster")
    assert len(made) == 2
    status, err = _run(tmp_path, "second", ["decoder=[raster,eagle2]", f"samples_dir={samples}"], capsys)
    assert status == 0, err
    assert _pngs(samples / "raster") == made, "raster's images were decoded again"
    raster = json.loads((samples / "raster" / "binding.json").read_text())
    eagle = json.loads((samples / "eagle2" / "binding.json").read_text())
    assert ";eagle_head:" not in raster["weights"]
    assert eagle["weights"].startswith(raster["weights"] + ";eagle_head:")
