"""Before the first image: a paper protocol whose official environment is not built stops naming it
and the command that builds it; a GPU evaluator that would score on the CPU stops unless
`evaluate_on_cpu=true`; the budget prints the evaluate stage's cost beside generation's."""
from __future__ import annotations

from pathlib import Path

import pytest

import harness.run as run_module
from harness.budget import Conditioning, Cost, EvaluateCost, Work, estimate
from harness.cli import report_errors
from harness.run import EvaluationFailedError, run
from tests.conftest import ROOT, compose_cfg

SHARED = ROOT.parent / "shared" / "data"
TINY = ["+experiment=paper_main", "model=llamagen_tiny", "decoder=[raster]", "require_cuda=false", "device=cpu",
        "threads=1", "dataset_limit=1", "batch_size=4", "warmup_batches=0", "timing.images=0", "report=false"]
DATA = {"geneval": f"dataset.metadata={SHARED / 'geneval' / 'evaluation_metadata.jsonl'}",
        "dpg_bench": f"dataset.prompts={SHARED / 'dpg_bench' / 'prompts'}"}


def _status(cfg, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        report_errors(lambda: run(cfg, out), failed=(EvaluationFailedError,))
    except SystemExit as exit_:
        return int(exit_.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


@pytest.mark.skipif(not SHARED.is_dir(), reason="the benchmark prompt files are not beside the checkout")
@pytest.mark.parametrize("protocol", ["geneval", "dpg_bench"])
def test_paper_protocol_without_its_official_environment_stops_before_the_first_image(
        protocol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path / "cache"))
    decoded: list[int] = []
    real = run_module.generate_all
    monkeypatch.setattr(run_module, "generate_all", lambda jobs, specs, **kw: decoded.append(len(specs)) or real(
        jobs, specs, **kw))
    cfg = compose_cfg([*TINY, f"protocol={protocol}", DATA[protocol]])
    status, err = _status(cfg, tmp_path / "run", capsys)
    home = tmp_path / "cache" / "official" / protocol
    assert status == 2, err
    assert f"evaluator.{protocol}_official.env_python={home}/env/bin/python does not exist" in err
    assert f"python -m evaluators.official_build {protocol}" in err
    assert decoded == [] and not list((tmp_path / "run").rglob("*.png"))


def test_in_process_variant_without_its_packages_stops_before_the_first_image(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """evaluator=geneval (mmdet in process) is checked for its imports before generation."""
    pytest.importorskip("transformers")
    import importlib.util

    if importlib.util.find_spec("mmdet") is not None:
        pytest.skip("mmdet is installed here")
    cfg = compose_cfg(["+experiment=smoke", "dataset=geneval", f"dataset.metadata={SHARED / 'geneval' / 'evaluation_metadata.jsonl'}",
                       "evaluator=[speed,geneval]", "images_per_prompt=4", "dataset_limit=1", "evaluate_on_cpu=true"])
    status, err = _status(cfg, tmp_path / "run", capsys)
    assert status == 2, err
    assert "mmdet" in err and "geneval_official" in err and "python -m evaluators.official_build geneval" in err
    assert not list((tmp_path / "run").rglob("*.png"))


def test_gpu_evaluator_on_the_cpu_stops_unless_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is usable here")
    base = ["+experiment=smoke", "evaluator=[speed,hpsv2]", "evaluator.hpsv2.checkpoint=/nowhere/hps.pt"]
    status, err = _status(compose_cfg(base), tmp_path / "a", capsys)
    assert status == 2, err
    assert "evaluator hpsv2" in err and "evaluator.hpsv2.device=auto" in err and "evaluate_on_cpu=true" in err
    assert not list((tmp_path / "a").rglob("*.png"))
    status, err = _status(compose_cfg([*base, "evaluator.hpsv2.device=cpu"]), tmp_path / "b", capsys)
    assert status == 2 and "evaluator.hpsv2.device=cpu" in err, err
    # allowed on purpose: the job goes past the guard and generates (HPSv2 then fails on its missing checkpoint)
    status, err = _status(compose_cfg([*base, "evaluate_on_cpu=true", "decoder=[raster]", "dataset_limit=1"]),
                          tmp_path / "c", capsys)
    assert "evaluate_on_cpu" not in err and list((tmp_path / "c").rglob("*.png")), err
    # an evaluator without `gpu: true` (the shapes world's FID) is not held back
    from harness import preflight

    preflight.check_evaluate_device(compose_cfg(["+experiment=smoke", "evaluator=[speed,fid_shapes]"]),
                                    ["speed", "fid_shapes"])


def test_budget_prints_the_evaluate_stage_beside_generation() -> None:
    budget = estimate([Work("raster", 0, 0, 8)], {("raster", 4): Cost(4, 2.0, "warm-up")}, reps=1, timed_size=1,
                      batch_size=4, conditioning=Conditioning(), device="cuda",
                      evaluate=[EvaluateCost("geneval_official", 3600, 0.5), EvaluateCost("other", 10, None)])
    text = str(budget)
    assert budget.evaluate_s == 1800 and budget.seconds == 4.0  # generation alone in `seconds`
    assert "about 0.5 GPU-hours to evaluate" in text
    assert "evaluate geneval_official: 3600 images x 0.5 s" in text and "= 0.5 h" in text
    assert "evaluate other: 10 images, no per-image cost stated" in text


def test_paper_protocol_budget_lists_every_planned_evaluator() -> None:
    from harness import preflight

    cfg = compose_cfg(["+experiment=paper_main", "model=llamagen_xl_512", "protocol=coco5k"])
    costs = preflight.evaluate_costs(cfg, preflight.plan(cfg).evaluators, 100)
    assert [(c.evaluator, c.images) for c in costs] == [("fid", 100), ("hpsv2", 100)]
    assert all(c.seconds_per_image and c.seconds_per_image > 0 for c in costs)
