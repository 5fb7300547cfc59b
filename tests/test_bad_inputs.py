"""Bad input, as a user gives it: each case asserts the exit status of the command and that the
message names the offending field or file (and, where there is one, the fix).

Most cases run the command line in-process (the same pre-check, composition, run and error report as
`python -m harness`, without a new interpreter per case); two run `python -m harness` itself to
prove the wiring of the exit status.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf
import torch

import harness.__main__ as cli_main
from harness import preflight
from harness.store import summary as results
from harness.cli import EXIT_INPUT_ERROR, check_overrides, report_errors
from harness.run import EvaluationFailedError, run
from tests.conftest import ROOT, compose_cfg

SMOKE = ["+experiment=smoke"]


def outcome(tmp_path: Path, overrides: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit status, stderr) of `python -m harness +experiment=smoke <overrides>`, in-process."""
    argv = [*SMOKE, f"hydra.run.dir={tmp_path / 'run'}", *overrides]
    capsys.readouterr()
    try:
        check_overrides(argv, cli_main.__file__, cli_main._config_path())
        cfg = compose_cfg([a for a in argv if not a.startswith("hydra.")])
        report_errors(lambda: run(cfg, tmp_path / "run"), failed=(EvaluationFailedError,))
    except SystemExit as exit_:
        return int(exit_.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


# (overrides, words the message must contain)
CONFIG_CASES = [
    (["sampling.temperature=nan"], ["sampling.temperature", "finite"]),
    (["sampling.temperature=inf"], ["sampling.temperature", "finite"]),
    (["sampling.cfg_scale=nan"], ["sampling.cfg_scale", "finite"]),
    (["sampling.cfg_scale=-1"], ["sampling.cfg_scale", ">= 0"]),
    (["sampling.temperature=hot"], ["sampling.temperature", "'hot'"]),
    (["sampling.top_k=2.5"], ["sampling.top_k", "integer"]),
    (["sampling.top_k=0"], ["sampling.top_k", ">= 1"]),
    (["sampling.top_p=0"], ["sampling.top_p", "> 0"]),
    (["sampling.top_p=1.5"], ["sampling.top_p", "<= 1"]),
    (["sampling.filter_order=top_p"], ["sampling.filter_order", "'top_p'", "top_k_first", "top_p_first"]),
    (["dataset_limit=abc"], ["dataset_limit", "'abc'"]),
    (["dataset_limit=0"], ["dataset_limit", ">= 1"]),
    (["threads=-1"], ["threads", ">= 1"]),
    (["warmup_batches=-1"], ["warmup_batches", ">= 0"]),
    (["batch_size=0"], ["batch_size", ">= 1"]),
    (["images_per_prompt=0"], ["images_per_prompt", ">= 1"]),
    (["seed=abc"], ["seed", "integer"]),
    (["shard.index=2", "shard.count=2"], ["shard.index", "shard.count"]),
    (["stages=[generat]"], ["stages", "generat", "generate"]),
    (["stages=[]"], ["stages", "empty"]),
    (["stages=[generate,generate]"], ["stages", "repeats"]),
    (["overwrite_samples=maybe"], ["overwrite_samples", "true or false"]),
    (["report=no"], ["report", "true or false", "'no'"]),
    (["swept_keys=[sampling.temprature]"], ["swept_keys", "'sampling.temprature'", "sampling.temperature"]),
    (["swept_keys=[sampling]"], ["swept_keys", "'sampling'", "not a single value", "sampling.temperature"]),
    (["swept_keys=sampling.temperature"], ["swept_keys", "list", "swept_keys=[sampling.temperature]"]),
    (["decoder=[]"], ["no decoder", "decoder=[raster"]),
    (["decoder=[rastr,raster]"], ["unknown decoder", "'rastr'", "mulo_sd", "raster"]),
    (["evaluator=[spd]"], ["unknown evaluator", "'spd'", "speed", "geneval_shapes"]),
    (["model=nope"], ["unknown model", "'nope'", "shapes"]),
    (["dataset.n=0"], ["dataset.n", ">= 1"]),
    (["model.grid=0"], ["model.grid", ">= 1"]),
    (["model.grid=6", "model.draft_ratio=4"], ["model.grid", "model.draft_ratio"]),
    (["model.dim=65"], ["model.dim", "model.n_head"]),
    (["dataset=prompt_file"], ["dataset.path must be set", "dataset.path=<value>"]),
    (["device=tpu"], ["device=tpu", "device=auto, cpu, cuda or cuda:N"]),
    # decoder options: the full key and the value, before any model is built
    (["decoder.zipar.window=wide"], ["decoder.zipar.window=wide", "'wide'", "decoder/zipar.yaml"]),
    (["decoder.mulo_sd.accept.k=-1"], ["decoder.mulo_sd.accept.k=-1", ">= 1"]),
    (["decoder.mulo_sd.accept.k=abc"], ["decoder.mulo_sd.accept.k=abc", "'abc'"]),
    (["decoder.mulo_sd.draft.upsampler.kind=bogus"], ["decoder.mulo_sd.draft.upsampler.kind=bogus", "pixel"]),
    (["decoder.zipar.mask=foo"], ["decoder.zipar.mask=foo", "written"]),
    (["decoder.eagle2.draft.depth=x"], ["decoder.eagle2.draft.depth=x", "integer"]),
    (["decoder.lantern.sampling.filter_order=x"], ["decoder.lantern.sampling.filter_order=x", "top_p_first"]),
    (["decoder.lantern.accept.pooled_if=some"], ["decoder.lantern.accept.pooled_if=some", "prefix", "mass"]),
    # an evaluator's name becomes per_sample/<decoder>/<name>.csv
    (["+evaluator.geneval_shapes.name=../x"], ["evaluator.geneval_shapes.name", "'../x'", "plain file name"]),
    (["+evaluator.geneval_shapes.name=a/b"], ["evaluator.geneval_shapes.name", "'a/b'"]),
    (["+evaluator.geneval_shapes.name="], ["evaluator.geneval_shapes.name", "''"]),
]


@pytest.mark.parametrize("overrides,words", CONFIG_CASES, ids=[" ".join(c[0]) for c in CONFIG_CASES])
def test_bad_config_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], words: list[str]
) -> None:
    status, err = outcome(tmp_path, overrides, capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert err.startswith("error: ") and "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    assert err.count("\n") == 1, "one line"
    assert not list((tmp_path / "run").rglob("*.png")), "nothing may be generated"


# Results that misled or refusals that did not say what to do (issue 57): (overrides, words)
UNCLEAR_CASES = [
    # an operating point no decoder config reads would apply to nothing, while run.json shows it
    (["+model.operating_points.mulo_sd.accept.kk=3"],
     ["model.operating_points.mulo_sd.accept.kk", "did you mean mulo_sd.accept.k", "Fix the key or remove it"]),
    (["+model.operating_points.mulo_sd.draft.windw=3"], ["model.operating_points.mulo_sd.draft.windw", "draft.window"]),
    (["+model.operating_points.mulo.accept.k=3"],
     ["model.operating_points.mulo:", "lantern, mulo_sd", "~model.operating_points.mulo"]),
    # field-decoder trees that cannot fit the model: refused at build, naming the option
    (["decoder=[sjd_pac]", "decoder.sjd_pac.tree_width=100000"],
     ["decoder.sjd_pac.tree_width", "image codes", "tree_width <="]),
    (["decoder=[sjd_pac]", "decoder.sjd_pac.tree_width=8", "decoder.sjd_pac.tree_depth=30"],
     ["decoder.sjd_pac.tree_depth", "scratch cache slots", "make the tree smaller"]),
    (["decoder=[eagle2]", "decoder.eagle2.draft.top_k=100000"], ["decoder.eagle2.draft.top_k", "image codes"]),
    # an old path whose class does not exist: no "moved" warning, no error about a path never written
    (["decoder.raster._target_=baselines.raster.NoSuchDecoder"],
     ["decoder.raster._target_=baselines.raster.NoSuchDecoder", "has no 'NoSuchDecoder'"]),
    # a shard job asked to evaluate (was a ValueError traceback)
    (["shard.count=2", "stages=[generate,evaluate]"], ["shard 0 of 2", "stages=[generate]"]),
]


@pytest.mark.parametrize("overrides,words", UNCLEAR_CASES, ids=[" ".join(c[0]) for c in UNCLEAR_CASES])
def test_bad_input_is_one_clear_line_before_anything_is_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], words: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a false "moved to" warning fails here
        status, err = outcome(tmp_path, overrides, capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert err.startswith("error: ") and "Traceback" not in err and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    assert "moved to" not in err and not list(tmp_path.rglob("binding.json")), "nothing may be bound"


def test_a_janus_stack_without_its_small_drafter_names_the_setting_that_removed_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = outcome(tmp_path, ["model=janus_tiny", "decoder=[sd]", "model.small_arch=null"], capsys)
    assert status == EXIT_INPUT_ERROR and "Traceback" not in err, err
    assert "sd: needs small_drafter" in err and "model.small_arch" in err and "draft.model" not in err
    assert not list(tmp_path.rglob("binding.json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = outcome(tmp_path, ["device=cuda"], capsys)
    assert status == EXIT_INPUT_ERROR and "device=cuda" in err and "device=cpu" in err


@pytest.mark.parametrize(("model", "key"), [("llamagen_xl_512", "dtype"), ("tar_7b_1024", "llm.dtype"),
                                          ("lumina_mgpt_768", "dtype"), ("janus_pro_7b", "dtype"), ("emu3_gen", "dtype")])
def test_half_precision_on_a_cpu_is_warned(model: str, key: str) -> None:
    """Tar's AR-DTok runs in fp32 as its eval scripts, its LLM in bf16: the LLM's key is named."""
    node = compose_cfg([f"model={model}"]).model
    warning = preflight.cpu_dtype_warning(node, torch.device("cpu"))
    value = OmegaConf.select(node, key)
    assert warning and f"model.{key}={value}" in warning and f"model.{key}=fp32" in warning
    assert preflight.cpu_dtype_warning(node, torch.device("cuda")) is None
    assert preflight.cpu_dtype_warning(node, "cuda:1") is None
    assert preflight.cpu_dtype_warning(compose_cfg([f"model={model}", f"model.{key}=fp32"]).model, "cpu") is None
    assert preflight.cpu_dtype_warning(compose_cfg([f"model={model}", f"model.{key}=float16"]).model, "cpu")


def test_run_dir_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    status, err = outcome(tmp_path, [f"hydra.run.dir={blocker / 'run'}"], capsys)
    assert status == EXIT_INPUT_ERROR and str(blocker) in err and "hydra.run.dir" in err


def test_samples_dir_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "samples_file"
    blocker.write_text("x")
    status, err = outcome(tmp_path, [f"samples_dir={blocker}"], capsys)
    assert status == EXIT_INPUT_ERROR and "samples_dir" in err and str(blocker) in err


# --- prompt files ------------------------------------------------------------------------------


def _prompts(tmp_path: Path, name: str, data: bytes) -> list[str]:
    path = tmp_path / name
    path.write_bytes(data)
    return ["dataset=prompt_file", f"dataset.path={path}"]


@pytest.mark.parametrize(
    "name,data,words",
    [
        ("p.txt", b"a photo of a cat\n\xff\xfe broken\n", ["p.txt:2", "UTF-8"]),
        ("p.jsonl", b'{"prompt": "ok"}\n{"prompt": \n', ["p.jsonl:2", "not valid JSON"]),
        ("p.jsonl", b'{"prompt": "ok"}\n{"text": 3}\n', ["p.jsonl:2", "'prompt'"]),
        ("p.jsonl", b'["a list"]\n', ["p.jsonl:1", "JSON object"]),
        ("p.txt", b"\n  \n", ["p.txt", "holds no prompt"]),
        (
            "p.jsonl",
            b'{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n',
            ["p.jsonl", "repeats prompt ids"],
        ),
        ("p.jsonl", b'{"prompt": "x"}\n{"id": "", "prompt": "y"}\n', ["p.jsonl:2", "'id'", "''"]),
        ("p.jsonl", b'{"prompt": "x", "id": null}\n', ["p.jsonl:1", "'id'", "None"]),
    ],
)
def test_bad_prompts_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes, words: list[str]
) -> None:
    status, err = outcome(tmp_path, [*_prompts(tmp_path, name, data), "evaluator=[speed]"], capsys)
    assert status == EXIT_INPUT_ERROR, err
    for word in words:
        assert word in err, (word, err)


def test_missing_prompts_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = outcome(tmp_path, ["dataset=prompt_file", f"dataset.path={tmp_path / 'none.txt'}"], capsys)
    assert status == EXIT_INPUT_ERROR and "none.txt" in err and "dataset.path" in err


def test_geneval_refuses_a_txt_prompts_file_before_generating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = [*_prompts(tmp_path, "p.txt", b"a photo of a cat\n"), "evaluator=[speed,geneval_shapes]"]
    status, err = outcome(tmp_path, overrides, capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert "geneval_shapes" in err and f"dataset.path={tmp_path / 'p.txt'}" in err and ".jsonl" in err
    assert not list((tmp_path / "run").rglob("*.png")), "nothing may be generated"
    # without GenEval the same file runs
    assert outcome(tmp_path, [*overrides[:2], "evaluator=[speed]", "decoder=[raster]"], capsys)[0] == 0


def test_prompts_without_metadata_are_refused_on_one_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    caption = "a photo of a " + "very " * 2000 + "long cat"
    data = json.dumps({"prompt": caption}).encode() + b"\n"
    status, err = outcome(tmp_path, _prompts(tmp_path, "long.jsonl", data), capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert err.startswith("error: evaluator geneval_shapes") and err.count("\n") == 1
    assert str(tmp_path / "long.jsonl") in err and "'tag'" in err and f"({len(caption)} characters)" in err
    assert len(err) < 600, "the caption must be shortened, not quoted whole"
    assert not list((tmp_path / "run").rglob("*.png")), "nothing may be generated"


def test_an_evaluator_failing_alike_on_every_decoder_is_named_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Samples made from prompts without metadata, scored with the metadata at hand: GenEval reads
    the samples' own (absent) metadata, fails on each decoder for the same reason, said once."""
    caption = "a photo of a " + "very " * 2000 + "long cat"
    bare = _prompts(tmp_path, "bare.jsonl", json.dumps({"id": "p", "prompt": caption}).encode())
    base = ["decoder=[raster,zipar]", "dataset_limit=1"]
    assert outcome(tmp_path, [*bare, *base, "stages=[generate]", "evaluator=[speed]"], capsys)[0] == 0
    meta = {"id": "p", "prompt": caption, "tag": "single_object", "include": [{"class": "cat", "count": 1}]}
    rich = _prompts(tmp_path, "rich.jsonl", json.dumps(meta).encode())
    status, err = outcome(tmp_path / "e", [*rich, *base, "stages=[evaluate]", "evaluator=[geneval_shapes]",
                                           f"samples_dir={tmp_path / 'run' / 'samples'}"], capsys)
    assert status == 1, err
    assert "geneval on raster, zipar (ValueError: sample p_00" in err and err.count("ValueError") == 1
    assert len(err) < 800, "the caption must be shortened, not quoted whole"


def test_rejected_caption_is_quoted_shortened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    caption = "a photo of a " + "very " * 400 + "long cat"
    overrides = [*_prompts(tmp_path, "long.txt", caption.encode()), "model=shapes", "decoder=[raster]",
                 "evaluator=[speed]"]
    status, err = outcome(tmp_path, overrides, capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert "shapes grammar" in err and f"({len(caption)} characters)" in err
    assert len(err) < 600, "the caption must be shortened, not quoted whole"


# --- weights -----------------------------------------------------------------------------------


def _weights_copy(tmp_path: Path) -> Path:
    from harness.shapes.weights import WORLDS

    folder = tmp_path / "weights"
    folder.mkdir()
    for file in WORLDS["x1"].iterdir():
        if file.is_file():
            (folder / file.name).write_bytes(file.read_bytes())
    return folder


@pytest.mark.parametrize(
    "damage,words",
    [
        ("manifest_garbled", ["manifest.json", "corrupt"]),
        ("manifest_missing", ["manifest.json", "not installed"]),
        ("manifest_no_files", ["manifest.json", "'files'"]),
        ("weights_changed", ["target.safetensors", "sha256"]),
    ],
)
def test_bad_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, words: list[str]
) -> None:
    folder = _weights_copy(tmp_path)
    manifest = folder / "manifest.json"
    if damage == "manifest_garbled":
        manifest.write_text(manifest.read_text()[:40])
    elif damage == "manifest_missing":
        manifest.unlink()
    elif damage == "manifest_no_files":
        manifest.write_text('{"info": 1}')
    else:
        target = folder / "target.safetensors"
        target.write_bytes(target.read_bytes()[:-8] + b"\0" * 8)
    status, err = outcome(
        tmp_path, ["model=shapes", f"model.weights_dir={folder}", "decoder=[raster]"], capsys
    )
    assert status == EXIT_INPUT_ERROR, err
    for word in words:
        assert word in err, (word, err)


# --- SampleSets --------------------------------------------------------------------------------


def test_rerun_with_another_configuration_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["decoder=[raster]", "evaluator=[speed]"]
    assert outcome(tmp_path, base, capsys)[0] == 0
    images = {p: p.read_bytes() for p in (tmp_path / "run" / "samples").rglob("*.png")}
    status, err = outcome(tmp_path, [*base, "sampling.temperature=0", "sampling.cfg_scale=2.0"], capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert "sampling.temperature: stored 1.0, now 0" in err and "sampling.cfg_scale" in err
    assert "hydra.run.dir" in err and "overwrite_samples=true" in err
    assert {p: p.read_bytes() for p in images} == images, "nothing was reused or deleted"
    # a decoder option counts too
    status, err = outcome(tmp_path, ["decoder=[mulo_sd]", "evaluator=[speed]"], capsys)
    assert status == 0, err  # another decoder: its own SampleSet
    status, err = outcome(
        tmp_path, ["decoder=[mulo_sd]", "evaluator=[speed]", "decoder.mulo_sd.accept.tau=1.0"], capsys
    )
    assert status == EXIT_INPUT_ERROR and "decoder.accept.tau: stored 0.1, now 1.0" in err


def test_overwrite_samples_regenerates_under_the_new_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["decoder=[raster]", "evaluator=[speed]"]
    assert outcome(tmp_path, base, capsys)[0] == 0
    status, err = outcome(tmp_path, [*base, "sampling.temperature=0", "overwrite_samples=true"], capsys)
    assert status == 0, err
    binding = json.loads((tmp_path / "run" / "samples" / "raster" / "binding.json").read_text())
    assert binding["sampling"]["temperature"] == 0
    stats = pd.read_csv(tmp_path / "run" / "samples" / "raster" / "stats.csv")
    assert len(stats) == 4  # regenerated, not appended
    # the same configuration resumes (timing-only keys do not count)
    status, err = outcome(tmp_path, [*base, "sampling.temperature=0", "batch_size=4", "threads=1"], capsys)
    assert status == 0, err


def test_set_without_binding_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["decoder=[raster]", "evaluator=[speed]"]
    assert outcome(tmp_path, base, capsys)[0] == 0
    binding = tmp_path / "run" / "samples" / "raster" / "binding.json"
    binding.unlink()
    status, err = outcome(tmp_path, base, capsys)
    assert status == EXIT_INPUT_ERROR and "no binding.json" in err
    binding.write_text("{not json")
    status, err = outcome(tmp_path, base, capsys)
    assert status == EXIT_INPUT_ERROR and "binding.json" in err and "corrupt" in err


def test_evaluate_only_on_an_incomplete_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert outcome(tmp_path, ["decoder=[raster]", "stages=[generate]"], capsys)[0] == 0
    samples = tmp_path / "run" / "samples"
    status, err = outcome(
        tmp_path / "e",
        ["decoder=[raster]", "stages=[evaluate]", f"samples_dir={samples}", "dataset_limit=6"],
        capsys,
    )
    assert status == EXIT_INPUT_ERROR and "incomplete" in err and "stages=[generate]" in err


@pytest.mark.parametrize("content,kind", [("[1, 2]", "list"), ('"abc"', "str"), ("{not json", "corrupt")])
def test_a_corrupt_binding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, kind: str
) -> None:
    base = ["decoder=[raster]", "evaluator=[speed]"]
    assert outcome(tmp_path, [*base, "stages=[generate]"], capsys)[0] == 0
    samples = tmp_path / "run" / "samples"
    binding = samples / "raster" / "binding.json"
    binding.write_text(content)
    status, err = outcome(tmp_path / "e", [*base, "stages=[evaluate]", f"samples_dir={samples}"], capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert str(binding) in err and kind in err and "overwrite_samples=true" in err
    # the fix the refusal suggests works: the set is generated again under this configuration
    status, err = outcome(tmp_path, [*base, "overwrite_samples=true"], capsys)
    assert status == 0, err
    assert json.loads(binding.read_text())["decoder"]["name"] == "raster"


def test_samples_dir_one_level_too_deep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert outcome(tmp_path, ["decoder=[raster]", "stages=[generate]"], capsys)[0] == 0
    samples = tmp_path / "run" / "samples"
    for stages in ("stages=[evaluate]", "stages=[generate]"):
        status, err = outcome(
            tmp_path / "e", ["decoder=[raster]", stages, f"samples_dir={samples / 'raster'}"], capsys
        )
        assert status == EXIT_INPUT_ERROR, err
        assert "is itself a SampleSet" in err and f"samples_dir={samples}" in err
        assert not (samples / "raster" / "raster").exists(), "no set is made inside the set"


def test_options_for_an_unselected_evaluator_are_recorded_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    """protocol=dpg_bench sets an option of the in-process `dpg_bench` variant, which its evaluator
    list does not run: the plan records it with the reason (run.json) and says so on an info line,
    not a warning (every DPG-Bench job would warn)."""
    cfg = compose_cfg(["+protocol=dpg_bench", "model=random", "decoder=[raster]"])
    with caplog.at_level(logging.INFO, logger="harness.preflight"):
        jobs = preflight.plan(cfg)
    assert jobs.evaluators == ["speed", "dpg_bench_official"] and "not selected" in jobs.skipped["dpg_bench"]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("not running evaluator dpg_bench" in r.getMessage() for r in caplog.records)


def test_an_experiment_configuring_an_unselected_decoder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """decoder=[...] narrower than the experiment's list: the decoders it configures but the command
    line leaves out are skipped with their reason, as rows_by_model's are, before any model is built."""
    cfg = compose_cfg(["+experiment=main_x2", "decoder=[raster,zipar]"])
    jobs = preflight.plan(cfg)
    assert jobs.decoders == ["raster", "zipar"]
    assert "not selected" in jobs.skipped["mulo_sd"] and "mulo_sd_anchored" in jobs.skipped
    status, err = outcome(tmp_path, ["decoder=[raster]", "+decoder.mulo_sd.draft.window=8",
                                     "evaluator=[speed]"], capsys)
    assert status == 0, err
    assert [p.name for p in (tmp_path / "run" / "samples").iterdir()] == ["raster"]


def test_evaluate_reads_a_corrupt_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert outcome(tmp_path, ["decoder=[raster]", "stages=[generate]"], capsys)[0] == 0
    samples = tmp_path / "run" / "samples"
    png = sorted((samples / "raster" / "images").glob("*.png"))[0]
    png.write_bytes(png.read_bytes()[:30] + b"\0" * (png.stat().st_size - 30))  # same size, bad data
    status, err = outcome(
        tmp_path / "e", ["decoder=[raster]", "stages=[evaluate]", f"samples_dir={samples}"], capsys
    )
    assert status == EXIT_INPUT_ERROR and png.stem in err


def test_record_path_that_misses_its_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record whose `path` does not lead to its image fails the completeness check (it used to
    pass it and be skipped by the evaluators, which then scored 3 of 4 planned images)."""
    assert outcome(tmp_path, ["decoder=[raster]", "stages=[generate]"], capsys)[0] == 0
    samples = tmp_path / "run" / "samples"
    record = sorted((samples / "raster" / "records").glob("*.json"))[0]
    data = json.loads(record.read_text())
    data["path"] = "images/elsewhere.png"
    record.write_text(json.dumps(data))
    status, err = outcome(
        tmp_path / "e", ["decoder=[raster]", "stages=[evaluate]", f"samples_dir={samples}"], capsys
    )
    assert status == EXIT_INPUT_ERROR, err
    assert str(record) in err and "images/elsewhere.png" in err and "stages=[generate]" in err


def _stored_set(tmp_path: Path, capsys: pytest.CaptureFixture[str], decoder: str = "raster") -> Path:
    """A SampleSet of `decoder` generated at the defaults (the random model's temperature 1.0)."""
    overrides = [f"decoder=[{decoder}]", "evaluator=[speed]", "stages=[generate]"]
    status, err = outcome(tmp_path, overrides, capsys)
    assert status == 0, err
    return tmp_path / "run" / "samples"


@pytest.mark.parametrize(
    "decoder,key,stored,other",
    [("raster", "sampling.temperature", "1.0", "0.5"),
     ("mulo_sd", "decoder.mulo_sd.accept.tau", "0.1", "0.4")],
)
def test_rescored_sweep_keeps_the_images_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], decoder: str, key: str, stored: str, other: str
) -> None:
    """stages=[evaluate] with a swept key set to another value than the set's images were made with
    is refused (its rows would carry the job's value); at the stored value the label is the images'."""
    samples = _stored_set(tmp_path, capsys, decoder)
    base = [f"decoder=[{decoder}]", "evaluator=[speed]", "stages=[evaluate]", f"samples_dir={samples}",
            f"swept_keys=[{key}]"]
    status, err = outcome(tmp_path / "e", [*base, f"{key}={other}"], capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert f"swept_keys labels the rows of {decoder} with {key}={other}" in err and f"stored {stored}" in err
    assert str(samples / decoder / "binding.json") in err and f"set {key}={stored}" in err
    assert not (tmp_path / "e" / "run" / "summary.csv").exists()
    status, err = outcome(tmp_path / "ok", base, capsys)
    assert status == 0, err
    summary = pd.read_csv(tmp_path / "ok" / "run" / "summary.csv")
    assert set(summary[key]) == {float(stored)}


def test_unbound_set_is_named_and_gets_no_invented_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A set without binding.json is scored with a warning naming its folder; swept keys, which
    would label its rows with values nothing can check, are refused."""
    samples = _stored_set(tmp_path, capsys)
    (samples / "raster" / "binding.json").unlink()
    base = ["decoder=[raster]", "evaluator=[speed]", "stages=[evaluate]", f"samples_dir={samples}"]
    caplog.clear()
    status, err = outcome(tmp_path / "plain", [*base, "sampling.temperature=0.5"], capsys)
    assert status == 0, err
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(str(samples / "raster") in m and "cannot be checked" in m for m in warned), warned
    status, err = outcome(tmp_path / "swept", [*base, "swept_keys=[sampling.temperature]"], capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert "swept_keys" in err and "sampling.temperature" in err and "binding.json" in err
    assert str(samples / "raster") in err and "overwrite_samples=true" in err


# --- results files -----------------------------------------------------------------------------


def _summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert outcome(tmp_path, ["decoder=[raster]", "evaluator=[speed]"], capsys)[0] == 0
    return tmp_path / "run" / "summary.csv"


def _results_cli(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = results.main([str(path.parent)])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "damage,words",
    [
        ("truncated_at_a_line", ["rows but", "were written"]),
        ("truncated_mid_row", ["summary.csv"]),
        ("garbled_value", ["column 'value'", "'fast'"]),
        ("garbled_flag", ["higher_is_better", "'perhaps'"]),
        ("fractional_n", ["column 'n'", "whole"]),
        ("no_metric_columns", ["lacks the columns"]),
        ("empty", ["not a readable CSV"]),
        ("not_utf8", ["not a readable CSV"]),
        ("meta_corrupt", ["summary.meta.json", "corrupt"]),
        ("edited_same_rows", ["sha256", "summary.meta.json", "changed after"]),
        ("cut_mid_row_without_sidecar", ["line break", "cut short"]),
        ("meta_rows_text", ["summary.meta.json", "malformed", "'25'"]),
        ("meta_empty", ["summary.meta.json", "malformed", "None"]),
    ],
)
def test_bad_summary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, words: list[str]
) -> None:
    path = _summary(tmp_path, capsys)
    lines = path.read_text().splitlines(keepends=True)
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    if damage == "truncated_at_a_line":
        path.write_text("".join(lines[:-2]))
    elif damage == "truncated_mid_row":
        path.write_text("".join(lines[:-1]) + lines[-1][:5])
    elif damage == "garbled_value":
        frame.loc[1, "value"] = "fast"
        frame.to_csv(path, index=False)
    elif damage == "garbled_flag":
        frame.loc[0, "higher_is_better"] = "perhaps"
        frame.to_csv(path, index=False)
    elif damage == "fractional_n":
        frame.loc[0, "n"] = "2.5"
        frame.to_csv(path, index=False)
    elif damage == "no_metric_columns":
        frame.drop(columns=["metric"]).to_csv(path, index=False)
    elif damage == "empty":
        path.write_text("")
    elif damage == "not_utf8":
        path.write_bytes(b"\xff\xfe\x00garbage\n")
    elif damage == "edited_same_rows":  # one number changed, the row count kept
        frame.loc[0, "value"] = "0.001"
        frame.to_csv(path, index=False)
    elif damage == "cut_mid_row_without_sidecar":  # the last row loses its empty ci cells: parses alike
        path.with_name("summary.meta.json").unlink()
        path.write_text(path.read_text()[:-3])
    elif damage == "meta_rows_text":
        path.with_name("summary.meta.json").write_text('{"rows": "25"}')
    elif damage == "meta_empty":
        path.with_name("summary.meta.json").write_text("{}")
    else:
        path.with_name("summary.meta.json").write_text("[")
    code, err = _results_cli(path, capsys)
    assert code == 2, err
    assert str(path) in err
    for word in words:
        assert word in err, (word, err)


def test_summary_without_sidecar_is_read_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Without summary.meta.json a cut on a line end cannot be told from a shorter table: the
    table is read, and a warning names the file and says its rows cannot be verified."""
    path = _summary(tmp_path, capsys)
    path.with_name("summary.meta.json").unlink()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # one row fewer, cut on a line end
    caplog.clear()
    code, err = _results_cli(path, capsys)
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    named = [m for m in warned if str(path) in m and "cannot be verified" in m and "stages=[evaluate]" in m]
    assert named, warned


def test_summary_rows_are_counted_when_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _summary(tmp_path, capsys)
    meta = json.loads(path.with_name("summary.meta.json").read_text())
    assert meta["rows"] == len(pd.read_csv(path)) > 0
    assert len(results.load([path.parent])) == meta["rows"]


def test_run_json_is_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _summary(tmp_path, capsys)

    def refuse(constant: str) -> None:
        raise ValueError(f"run.json holds {constant}")

    record = json.loads((tmp_path / "run" / "run.json").read_text(), parse_constant=refuse)
    assert record["extra"]["summary_rows"] > 0 and "raster" in record["extra"]["sample_sets"]


# --- the real command line ---------------------------------------------------------------------


def _harness(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "override,word",
    [("sampling.temperature=nan", "sampling.temperature"), ("decoder=[rastr]", "unknown decoder"),
     ("decoder.mulo_sd.accept.k=-1", "decoder.mulo_sd.accept.k=-1")],
)
def test_command_line_exit_status(tmp_path: Path, override: str, word: str) -> None:
    res = _harness([*SMOKE, f"hydra.run.dir={tmp_path / 'run'}", override], tmp_path)
    assert res.returncode == EXIT_INPUT_ERROR, res.stderr[-2000:]
    assert word in res.stderr and "Traceback" not in res.stderr


def test_official_evaluator_with_a_wrong_env_python_stops_before_generating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong `env_python` of an official evaluator (evaluators/official_env.py) is one line naming the
    option and the recipe, before anything is generated."""
    meta = {"id": "p", "prompt": "a photo of a cat", "tag": "single_object", "include": [{"class": "cat", "count": 1}]}
    wrong = tmp_path / "geneval-env" / "bin" / "python"
    overrides = [*_prompts(tmp_path, "rich.jsonl", json.dumps(meta).encode()), "evaluator=[speed,geneval_official]",
                 f"evaluator.geneval_official.env_python={wrong}", f"evaluator.geneval_official.repo={tmp_path}",
                 f"evaluator.geneval_official.model_path={tmp_path}"]
    status, err = outcome(tmp_path, overrides, capsys)
    assert status == EXIT_INPUT_ERROR, err
    assert err.startswith(f"error: evaluator.geneval_official.env_python={wrong} does not exist"), err
    assert err.count("\n") == 1 and "docs/evaluators.md" in err
    assert not list((tmp_path / "run").rglob("*.png")), "nothing may be generated"
