"""The condition cache (issue 41): Tar's LLM and LlamaGen's text encoder run once per (prompt, image
seed), or once per prompt, for a whole job of several decoders and timing repetitions; a rerun reads
the entries from disk; another conditioner or LLM sampling computes its own; a corrupt entry is
refused with its path."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.models.llamagen.t5_captions import TinyTextEncoder
from harness.models.tar.llm import TinyCodeLM
from harness.run import run
from harness.store.conditions import CONDITIONS_DIR, ConditionCache, stage_config
from harness.store.samples import SampleSet
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)
from tests.test_bad_inputs import outcome

DECODERS = {"tar_tiny": "[raster,zipar,mulo_sd]", "llamagen_tiny": "[raster,zipar,mulo_sd]"}


def _job(model: str, samples: Path, extra: list[str] | None = None) -> list[str]:
    """Three decoders x two timing repetitions: 3 prompts x 2 images, two of them timed at batch 1,
    the rest decoded at batch 2 (after a warm-up of every decoder)."""
    return [f"model={model}", f"decoder={DECODERS[model]}", "dataset_limit=3", "images_per_prompt=2", "batch_size=2",
            "warmup_batches=1", "timing.reps=2", "timing.images=2", "timing.batch_size=1", "evaluator=[speed]",
            "stages=[generate]", f"samples_dir={samples}", "device=cpu", "report=false", *(extra or [])]


@pytest.fixture
def llm_rows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int | None]]:
    """Every row the tiny Tar LLM is asked to draw: (prompt, image seed)."""
    rows: list[tuple[str, int | None]] = []
    original = TinyCodeLM.__call__

    def recording(self: TinyCodeLM, prompts: Any, seeds: Any = None) -> Any:
        rows.extend(zip(prompts, seeds if seeds is not None else [None] * len(prompts)))
        return original(self, prompts, seeds)

    monkeypatch.setattr(TinyCodeLM, "__call__", recording)
    return rows


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every caption the tiny text encoder is asked to encode."""
    texts: list[str] = []
    original = TinyTextEncoder.forward

    def recording(self: TinyTextEncoder, batch: Any) -> Any:
        texts.extend(batch)
        return original(self, batch)

    monkeypatch.setattr(TinyTextEncoder, "forward", recording)
    return texts


def _planned(samples: Path, decoder: str = "raster") -> list[tuple[str, int]]:
    records = SampleSet(samples / decoder).records()
    return list(zip(records["prompt"], records["seed"].astype(int)))


def test_condition_cache_draws_each_images_llm_sample_once_per_job_and_rerun_reads_the_disk(
        tmp_path: Path, llm_rows: list[tuple[str, int | None]]) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("tar_tiny", samples)), tmp_path / "first")
    planned = _planned(samples)
    assert len(planned) == 6
    assert Counter(llm_rows) == Counter(planned)  # one LLM draw per (prompt, image seed), not one per decode
    stats = {d: SampleSet(samples / d).stats().set_index("sample_id") for d in ("raster", "zipar", "mulo_sd")}
    for name, table in stats.items():  # every decoder is charged a conditioning for each timed image
        timed = table[table["timed"].astype(str) == "True"]
        assert len(timed) == 2 and (timed["condition_s"].astype(float) > 0).all(), name
    images = {p.relative_to(samples): p.read_bytes() for p in samples.glob("*/images/*.png")}

    _drop_sample_sets(samples)
    llm_rows.clear()  # a rerun (or another shard) into the same samples_dir: every entry is on disk
    run(compose_cfg(_job("tar_tiny", samples)), tmp_path / "second")
    assert llm_rows == []
    assert {p.relative_to(samples): p.read_bytes() for p in samples.glob("*/images/*.png")} == images
    llm_rows.clear()  # a later job of another decoder on the same images
    run(compose_cfg(_job("tar_tiny", samples, ["decoder=[lantern]"])), tmp_path / "third")
    assert llm_rows == [] and len(_planned(samples, "lantern")) == 6


def _drop_sample_sets(samples: Path) -> None:
    """Delete every SampleSet of a samples_dir, keeping its condition cache."""
    for folder in samples.iterdir():
        if folder.name != CONDITIONS_DIR:
            shutil.rmtree(folder)


def test_condition_cache_encodes_each_prompt_once_for_a_per_prompt_text_encoder(
        tmp_path: Path, encoded: list[str]) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("llamagen_tiny", samples)), tmp_path / "run")
    prompts = [prompt for prompt, _ in _planned(samples)]
    assert len(prompts) == 6 and len(set(prompts)) == 3
    assert Counter(encoded) == Counter(set(prompts))  # each prompt once, shared by its two images


@pytest.mark.parametrize("change", ["model.llm.seed=7", "model.llm.draws=shared_per_prompt"])
def test_condition_cache_is_not_reused_under_other_llm_sampling(
        tmp_path: Path, llm_rows: list[tuple[str, int | None]], change: str) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("tar_tiny", samples)), tmp_path / "first")
    llm_rows.clear()
    run(compose_cfg(_job("tar_tiny", samples, [change, "overwrite_samples=true"])), tmp_path / "second")
    expected = 6 if "seed" in change else 3  # shared_per_prompt: one draw per prompt
    assert len(llm_rows) == expected
    assert len([p for p in (samples / CONDITIONS_DIR).iterdir() if p.is_dir()]) == 2


def test_condition_cache_is_not_reused_by_another_text_encoder(tmp_path: Path, encoded: list[str]) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("llamagen_tiny", samples)), tmp_path / "first")
    encoded.clear()
    run(compose_cfg(_job("llamagen_tiny", samples, ["+model.text_encoder.seed=3", "overwrite_samples=true"])),
        tmp_path / "second")
    assert len(set(encoded)) == 3


def test_condition_cache_keys_real_llm_sampling_settings() -> None:
    """TarLLM's temperature / top-p / top-k are part of its entries' context (its config node)."""
    class TarLLM:  # the stage is matched to its config node by class path
        pass

    TarLLM.__module__, TarLLM.__qualname__ = "harness.models.tar.llm", "TarLLM"
    node = {"_target_": "harness.models.tar.llm.TarLLM", "repo_id": "csuhan/Tar-7B-v0.1", "temperature": 1.0,
            "top_p": None, "cache_dir": "/somewhere", "local_path": None}
    model = {"name": "tar_7b_512", "llm": node, "target_file": "x.pth"}
    seen = stage_config(model, TarLLM())
    assert seen["repo_id"] == "csuhan/Tar-7B-v0.1" and "cache_dir" not in seen and "target_file" not in seen
    for other in ({"top_p": 0.95}, {"temperature": 0.7}, {"top_k": 1200}, {"draws": "shared_per_prompt"}):
        assert stage_config({**model, "llm": {**node, **other}}, TarLLM()) != seen, other
    assert stage_config({**model, "llm": {**node, "cache_dir": "/elsewhere"}}, TarLLM()) == seen


def test_condition_cache_refuses_a_corrupt_entry_naming_its_path(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("tar_tiny", samples)), tmp_path / "first")
    entry = sorted((samples / CONDITIONS_DIR).glob("*/*.pt"))[0]
    entry.write_bytes(b"not a torch file")
    _drop_sample_sets(samples)
    status, err = outcome(tmp_path, _job("tar_tiny", samples), capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(lines) == 1
    assert str(entry) in lines[0] and "corrupt" in lines[0] and "delete it" in lines[0]


def test_condition_cache_in_memory_serves_repeated_rows_without_calling_the_stage() -> None:
    class Stage:
        calls = 0

        def __call__(self, prompts: Any, seeds: Any = None) -> Any:
            import torch
            Stage.calls += 1
            return torch.tensor([[len(p), s or 0] for p, s in zip(prompts, seeds or [None] * len(prompts))])

    class Conditioner:
        stage, per_image = Stage(), True

        def finish(self, out: Any) -> Any:
            return out

    class Bundle:
        conditioner = Conditioner()

    cache = ConditionCache()
    first = cache.condition(Bundle(), ["ab", "abc", "ab"], [1, 2, 1])  # a repeated row is computed once
    assert Stage.calls == 1 and cache.ledger.computed == 2 and first.tolist() == [[2, 1], [3, 2], [2, 1]]
    again = cache.condition(Bundle(), ["abc", "ab"], [2, 1])
    assert Stage.calls == 1 and again.tolist() == [[3, 2], [2, 1]]


def test_condition_cache_folder_is_no_decoder_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = outcome(tmp_path, ["decoder=[raster]", "+decoder.conditions={_target_: x.Y}"], capsys)
    assert status == 2 and "decoder.conditions" in err and "another name" in err


# ------------------------------------------------------------------ integrity of what is read (issue 57)

def _error_line(status: int, err: str) -> str:
    """The one `error:` line of a refusal (exit 2, no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _contexts(samples: Path) -> list[Path]:
    return sorted(p for p in (samples / CONDITIONS_DIR).iterdir() if p.is_dir())


def test_condition_cache_refuses_an_entry_copied_from_another_encoders_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two text encoders of one shape: an entry of the other's folder placed in this one's (a hand
    merge) is refused, naming it, instead of changing every image without a word."""
    samples = tmp_path / "samples"
    run(compose_cfg(_job("llamagen_tiny", samples)), tmp_path / "first")
    [mine] = _contexts(samples)
    run(compose_cfg(_job("llamagen_tiny", samples, ["+model.text_encoder.seed=3", "overwrite_samples=true"])),
        tmp_path / "second")
    [other] = [c for c in _contexts(samples) if c != mine]
    entry = sorted(mine.glob("*.pt"))[0]
    shutil.copyfile(other / entry.name, entry)  # same prompt, same shape, another encoder's features
    status, err = outcome(tmp_path, _job("llamagen_tiny", samples, ["overwrite_samples=true"]), capsys)
    line = _error_line(status, err)
    assert str(entry) in line and "another folder" in line and f"rm {entry}" in line


def test_condition_cache_refuses_an_entry_of_another_shape_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    samples = tmp_path / "samples"
    run(compose_cfg(_job("llamagen_tiny", samples)), tmp_path / "first")
    [context] = _contexts(samples)
    entries = sorted(context.glob("*.pt"))
    stored = torch.load(entries[-1], weights_only=True)
    stored["parts"][0] = stored["parts"][0][:, :3]  # fewer features than its neighbours
    torch.save(stored, entries[-1])
    _drop_sample_sets(samples)
    status, err = outcome(tmp_path, _job("llamagen_tiny", samples), capsys)
    line = _error_line(status, err)
    assert "corrupt" in line and "tensors" in line
    assert any(str(e) in line for e in entries)  # the odd one, or the first read when it came first


def test_condition_cache_reads_context_json_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("llamagen_tiny", samples)), tmp_path / "first")
    [context] = _contexts(samples)
    described = json.loads((context / "context.json").read_text())
    described["model"] = "another"
    (context / "context.json").write_text(json.dumps(described))
    _drop_sample_sets(samples)
    line = _error_line(*outcome(tmp_path, _job("llamagen_tiny", samples), capsys))
    assert str(context / "context.json") in line and "another context" in line and f"rm -r {context}" in line


@pytest.mark.parametrize("spoil", ["conditions_is_a_file", "context_is_a_file", "entry_is_a_folder"])
def test_condition_cache_os_errors_are_one_line_naming_the_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: str) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("llamagen_tiny", samples)), tmp_path / "first")
    [context] = _contexts(samples)
    entry = sorted(context.glob("*.pt"))[0]
    _drop_sample_sets(samples)
    if spoil == "conditions_is_a_file":
        shutil.rmtree(samples / CONDITIONS_DIR)
        bad = samples / CONDITIONS_DIR
        bad.write_text("")
    elif spoil == "context_is_a_file":
        shutil.rmtree(context)
        bad = context
        bad.write_text("")
    else:
        entry.unlink()
        bad = entry
        bad.mkdir()
    line = _error_line(*outcome(tmp_path, _job("llamagen_tiny", samples), capsys))
    assert str(bad) in line and (f"rm {bad}" in line or f"rm -r {bad}" in line)


def test_samples_dir_inside_the_condition_cache_is_refused(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    samples = tmp_path / "samples"
    run(compose_cfg(_job("llamagen_tiny", samples)), tmp_path / "first")
    [context] = _contexts(samples)
    for inside in (samples / CONDITIONS_DIR, context, context / "more"):
        line = _error_line(*outcome(tmp_path, _job("llamagen_tiny", inside), capsys))
        assert f"samples_dir {inside}" in line and f"samples_dir={samples}" in line


_KILL_ON_ENTRY = """
import os, signal, sys
real_replace, count, at = os.replace, [0], int(sys.argv[1])
def replace(src, dst, *a, **k):
    if str(dst).endswith(".pt"):
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)  # its temporary file is written, not yet renamed
    return real_replace(src, dst, *a, **k)
os.replace = replace
from harness.__main__ import main
sys.argv = ["harness", *sys.argv[2:]]
main()
"""


def _folder(root: Path) -> dict[str, Any]:
    """Every file under `root` by relative path: entries as their stored content without the seconds
    they cost (a measured time), others as bytes."""
    import torch

    found: dict[str, Any] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.suffix == ".pt":
            stored = torch.load(path, weights_only=True)
            stored.pop("seconds")
            found[str(path.relative_to(root))] = {k: [t.tolist() for t in v] if k == "parts" else v
                                                  for k, v in stored.items()}
        else:
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


def test_condition_cache_killed_while_writing_resumes_to_the_folder_of_an_uninterrupted_run(
        tmp_path: Path) -> None:
    """SIGKILL between an entry's temporary file and its rename, then a rerun: the conditions/ folder
    is file for file the one a job that was never killed leaves (no orphaned .tmp)."""
    import os
    import subprocess
    import sys

    killed, whole = tmp_path / "killed", tmp_path / "whole"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", _KILL_ON_ENTRY, "2", *_job("llamagen_tiny", killed),
            f"hydra.run.dir={tmp_path / 'run_killed'}"]
    status = subprocess.run(args, env=env, capture_output=True, timeout=300).returncode
    assert status == -9
    assert [p.name for p in (killed / CONDITIONS_DIR).rglob("*.tmp")], "the kill left no temporary file"
    run(compose_cfg(_job("llamagen_tiny", killed)), tmp_path / "resumed")
    run(compose_cfg(_job("llamagen_tiny", whole)), tmp_path / "uninterrupted")
    assert _folder(killed / CONDITIONS_DIR) == _folder(whole / CONDITIONS_DIR)
