"""`+experiment=calibration`: every real backbone's raster row composes under the protocol of its
published number, the published numbers carry their sources, a model under another protocol is refused,
Tar runs at 256 px with AR-DTok in fp32 and the LLM in bf16 (a row at another precision is labelled),
and `python -m harness.tables` prints published beside harness values from a run on a stand-in (the tiny
random Tar stack under tar_1.5b_256's name, scored by the shapes GenEval on the shapes prompts)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import preflight
from harness.api import ConfigValueError
from harness.checks import check_published_protocol
from harness.comparisons import model_setting
from harness.report import calibration
from harness.report.tables import main as tables_main
from tests.conftest import CONF, ROOT, compose_cfg

PUBLISHED = {  # model -> protocols of its published numbers (conf/experiment/calibration.yaml)
    "tar_1.5b_256": ["geneval", "dpg_bench"], "tar_7b_256": ["geneval", "dpg_bench"],
    "janus_pro_1b": ["geneval"], "janus_pro_7b": ["geneval"],
    "lumina_mgpt_768": ["field_coco"], "emu3_gen": ["field_coco"], "llamagen_xl_512": ["field_coco", "geneval"],
}
EVALUATORS = {"geneval": ["speed", "geneval_official"], "dpg_bench": ["speed", "dpg_bench_official"],
              "field_coco": ["speed", "fid", "clip_score"]}
METRIC_PROTOCOL = {"geneval": "geneval", "dpg_bench": "dpg_bench", "fid": "field_coco", "clip_score": "field_coco"}


@pytest.mark.parametrize(("model", "protocol"), [(m, p) for m, ps in PUBLISHED.items() for p in ps])
def test_calibration_composes_the_raster_row_of_every_real_model(model: str, protocol: str) -> None:
    cfg = compose_cfg(["+experiment=calibration", f"model={model}", f"protocol={protocol}"])
    jobs = preflight.plan(cfg)
    assert cfg.name == "calibration" and cfg.protocol_name == protocol and cfg.require_cuda
    assert jobs.decoders == ["raster"] and jobs.evaluators == EVALUATORS[protocol]
    assert {str(k): list(v) for k, v in cfg.published_protocols.items()} == PUBLISHED
    check_published_protocol(cfg)  # the published protocol passes


def test_a_model_under_another_protocol_is_refused() -> None:
    cfg = compose_cfg(["+experiment=calibration", "model=janus_pro_7b", "protocol=field_coco"])
    with pytest.raises(ConfigValueError, match="measured under protocol geneval, not field_coco; pass protocol=geneval"):
        check_published_protocol(cfg)
    check_published_protocol(compose_cfg(["+experiment=calibration", "model=janus_tiny", "protocol=field_coco"]))


@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_tar_calibrates_at_256_px_as_its_eval_scripts(size: str) -> None:
    """Tar's eval_geneval.py / eval_dpg_bench.py force ar_dtok_lp_256px.pth, keep AR-DTok, TA-Tok and the
    VQ decoder in fp32 and run the LLM in bf16; the paper protocols' Tar configs do the same."""
    model = compose_cfg([f"model=tar_{size}_256"]).model
    assert (model.target_file, model.target_size, model.drafter_file) == ("ar_dtok_lp_256px.pth", 256, None)
    for name in (f"tar_{size}_256", f"tar_{size}_512", f"tar_{size}_1024"):
        node = compose_cfg([f"model={name}"]).model
        assert (node.dtype, node.vq_dtype, node.llm.dtype) == ("fp32", "fp32", "bf16"), name
    assert model_setting(compose_cfg([f"model=tar_{size}_256"])) is None
    assert model_setting(compose_cfg([f"model=tar_{size}_512", "model.dtype=bf16"])) == "dtype=bf16"
    assert model_setting(compose_cfg(["model=tar_tiny"])) is None  # no published precision declared


def test_the_calibration_numbers_are_sourced_and_cover_the_experiment() -> None:
    facts = calibration.load_published()
    assert set(facts["model"]) == set(PUBLISHED) - {"llamagen_xl_512"}  # LlamaGen: none readable
    for model, metric, source in zip(facts["model"], facts["metric"], facts["source"]):
        assert (CONF / "model" / f"{model}.yaml").is_file(), model
        assert METRIC_PROTOCOL[metric] in PUBLISHED[model], (model, metric)
        assert source.startswith("github.com/") and "@" in source, source  # a repository at a commit
    value = facts.set_index(["model", "metric"])["value"]
    assert (value["tar_1.5b_256", "geneval"], value["tar_7b_256", "dpg_bench"]) == (76.0, 84.19)
    assert (value["janus_pro_7b", "geneval"], value["emu3_gen", "fid"]) == (80.0, 31.12)


def test_the_tolerance_grows_with_the_standard_error_and_a_setting_is_never_within() -> None:
    line = calibration.Line("m", "M", "geneval", 76.0, "s", 75.0, 0.5, 100, "r", None)
    assert line.band == pytest.approx(2 * 2 ** 0.5 * 0.5 + 0.5) and line.within is True
    assert calibration.Line("m", "M", "geneval", 76.0, "s", 72.0, 0.5, 100, "r", None).within is False
    assert calibration.Line("m", "M", "geneval", 76.0, "s", 75.0, None, 100, "r", None).within is None
    assert calibration.Line("m", "M", "geneval", 76.0, "s", 75.0, 0.5, 100, "r", "dtype=bf16").within is False
    assert calibration.Line("m", "M", "fid", 30.0, "s", 31.5, None, 100, "r", None).within is True


def _standin(model: str, name: str, out: Path) -> subprocess.CompletedProcess:
    """The calibration job of `name` run on the tiny stack `model` under that name: the raster row,
    4 shapes prompts scored by the shapes GenEval (no weights, no network)."""
    args = ["+experiment=calibration", f"model={model}", f"model.name={name}", "protocol=geneval", "dataset=shapes",
            "evaluator=[speed,geneval_shapes]", "evaluator.geneval_shapes.show_progress=false", "dataset_limit=4",
            "images_per_prompt=1", "batch_size=4", "warmup_batches=0", "require_cuda=false", "device=cpu",
            "threads=1", "report=false", "timing.images=null", "timing.batch_size=null", f"hydra.run.dir={out}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=out.parent, env=env, capture_output=True,
                          text=True, timeout=600)


def test_the_table_prints_published_beside_harness_values_on_standins(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "results"
    done = _standin("tar_tiny", "tar_1.5b_256", runs / "tar_1.5b_256")  # one run: the test stays short
    assert done.returncode == 0, done.stderr[-3000:]
    assert tables_main([str(runs), "--out", str(tmp_path / "paper"), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "### " + calibration.TITLE in printed
    frame = pd.read_csv(tmp_path / "paper" / "tables" / "calibration.csv")
    for model, published in (("tar_1.5b_256", 76.0),):
        line = frame[(frame["model"] == model) & (frame["metric"] == "geneval")].iloc[0]
        summary = pd.read_csv(runs / model / "summary.csv")
        value = summary[(summary["metric"] == "geneval") & (summary["decoder"] == "raster")]["value"].iloc[0]
        assert line["published"] == published and line["harness"] == pytest.approx(100 * value)
        assert line["delta"] == pytest.approx(100 * value - published)
        assert line["within"] == (abs(line["delta"]) <= line["tolerance"])
        assert line["source"].startswith("github.com/") and line["run_dir"].endswith(model)
    assert frame[frame["model"] != "tar_1.5b_256"]["harness"].isna().all()  # published, not run: empty
    rows = [r for r in printed.splitlines() if r.startswith("| Tar-1.5B (256 px AR-DTok)")]
    assert len(rows) == 1 and "76.0" in rows[0] and "2·√2·SE + 0.5 =" in rows[0]
    assert "| Janus-Pro-7B" in printed and "Source of Janus-Pro-7B GenEval (%): github.com/deepseek-ai/Janus@" in printed
    sys.stderr.write(printed)  # the table as printed (pytest -s shows it)
