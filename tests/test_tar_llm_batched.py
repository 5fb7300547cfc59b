"""Tar's LLM stage batched with per-image draws (harness/models/tar/row_sampler.py): rows decoded
together equal rows decoded alone, the effective generation config reaches the sampling, a prompt's
images cost one `generate`, and models sharing the LLM share its condition entries."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.api import ConfigValueError
from harness.models.tar.llm import TarLLM, fetched_generation, parse_codes
from harness.models.tar.row_sampler import RowSampler, effective_config
from harness.run import run
from harness.store.conditions import context_description
from tests.conftest import compose_cfg
from tests.rehearsal.standins import GENERATION_PENALTY, GENERATION_TOP_K, tar_llm
from tests.single_thread import single_thread  # noqa: F401  (autouse)

transformers = pytest.importorskip("transformers")

PROMPTS = ["a red cat", "two blue dogs on the grass near a white house", "a cat", "three green birds",
           "a yellow car", "four black dogs and a brown cat in the snow"]
SEEDS = [11, 12, 13, 14, 15, 16]


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rehearsal's stand-in Tar LLM (generation_config.json: top-k 20, repetition penalty 1.1)."""
    folder = tmp_path_factory.mktemp("tar_llm") / "Tar-1.5B"
    tar_llm(folder)
    return folder


def _llm(folder: Path, **kwargs: Any) -> TarLLM:
    return TarLLM(local_path=str(folder), seq_len=kwargs.pop("seq_len", 9), dtype="fp32", **kwargs)


def _with_generation(standin: Path, tmp_path: Path, **settings: Any) -> Path:
    """A copy of the stand-in whose generation_config.json sets `settings`."""
    folder = tmp_path / "copy"
    shutil.copytree(standin, folder)
    config = transformers.GenerationConfig.from_pretrained(folder)
    config.update(**settings)
    config.save_pretrained(folder)
    return folder


def test_batched_rows_equal_rows_decoded_alone_token_for_token(standin: Path) -> None:
    """fp32 on the CPU: prompts of different lengths (left padding), batched 6, 4 + 2 and 1 at a time."""
    alone = _llm(standin, batch_size=1)
    codes = alone(PROMPTS, SEEDS)
    for size, calls in ((6, 1), (4, 2)):
        batched = _llm(standin, batch_size=size)
        assert torch.equal(batched(PROMPTS, SEEDS), codes), size
        assert batched.generate_calls == calls
    assert alone.generate_calls == len(PROMPTS)
    assert len({tuple(row) for row in codes.tolist()}) == len(PROMPTS)  # every image its own draw
    assert not torch.equal(alone(PROMPTS, [s + 100 for s in SEEDS]), codes)  # the seed drives the draw


def test_the_checkpoints_top_k_and_repetition_penalty_are_the_effective_config(standin: Path) -> None:
    llm = _llm(standin)
    assert llm.generation["top_k"] == GENERATION_TOP_K
    assert llm.generation["repetition_penalty"] == pytest.approx(GENERATION_PENALTY)
    assert llm.generation["do_sample"] is True and "transformers_version" not in llm.generation
    assert fetched_generation(local_path=str(standin)) == llm.generation  # what fetch prints
    assert _llm(standin, top_k=5).generation["top_k"] == 5  # model.llm's own settings on top


def test_top_k_and_repetition_penalty_reach_the_sampling(standin: Path, tmp_path: Path) -> None:
    """With top-k 1 from generation_config.json the draw is the penalised argmax: the codes equal
    transformers' greedy `generate` with the same repetition penalty, row by row, whatever the seed;
    without the penalty greedy gives other codes (so the penalty was applied, not ignored)."""
    folder = _with_generation(standin, tmp_path, top_k=1, repetition_penalty=3.0)
    llm = _llm(folder, seq_len=24, batch_size=6)
    codes = llm(PROMPTS, SEEDS)
    assert torch.equal(llm(PROMPTS, [s + 100 for s in SEEDS]), codes)  # top-k 1: no draw left

    def greedy(penalty: float) -> list[list[int]]:
        rows = []
        for prompt in PROMPTS:
            ids = torch.tensor([llm._input(prompt)])
            out = llm.model.generate(ids, max_new_tokens=24, do_sample=False, repetition_penalty=penalty)
            rows.append(parse_codes(llm.tokenizer.decode(out[0, ids.shape[1]:]), 24))
        return rows

    assert codes.tolist() == greedy(3.0)
    assert codes.tolist() != greedy(1.0)


def test_gumbel_draws_follow_the_warped_distribution() -> None:
    """Each row's draw is a sample of softmax(warped scores): frequencies over 4000 seeds within
    4 standard errors; top-k 2 never draws outside the two best tokens."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    scores = probs.log().repeat(4000, 1)
    ids = torch.zeros(4000, 1, dtype=torch.long)

    def frequencies(**settings: Any) -> torch.Tensor:
        config = effective_config(transformers.GenerationConfig(), settings)
        out = RowSampler(config, list(range(4000)), [0] * 4000, torch.device("cpu"))(ids, scores)
        return (out == 0).double().mean(0)

    for settings, expected in (({}, probs), ({"top_k": 2}, torch.tensor([0.625, 0.375, 0.0, 0.0]))):
        seen = frequencies(**settings)
        tolerance = 4 * (expected * (1 - expected) / 4000).sqrt() + 1e-12
        assert ((seen - expected.double()).abs() <= tolerance.double()).all(), (settings, seen)


def test_a_generation_setting_the_sampler_does_not_apply_is_refused() -> None:
    with pytest.raises(ConfigValueError, match="no_repeat_ngram_size"):
        effective_config(transformers.GenerationConfig(no_repeat_ngram_size=3), {})


def test_the_cache_key_names_the_generation_config_not_the_image_model(standin: Path, tmp_path: Path) -> None:
    class Conditioner:
        per_image = True

        def __init__(self, stage: Any) -> None:
            self.stage = stage

    node = {"_target_": "harness.models.tar.llm.TarLLM", "repo_id": "csuhan/Tar-1.5B", "temperature": 1.0}
    at_512 = {"name": "tar_1.5b_512", "target_size": 512, "llm": node}
    at_1024 = {"name": "tar_1.5b_1024", "target_size": 1024, "llm": node}
    llm = _llm(standin)
    key = context_description("tar_1.5b_512", at_512, Conditioner(llm))
    assert key == context_description("tar_1.5b_1024", at_1024, Conditioner(llm))
    assert "model" not in key and key["generation"] == llm.generation
    other = _llm(_with_generation(standin, tmp_path, top_k=7))
    changed = context_description("tar_1.5b_512", at_512, Conditioner(other))
    assert changed["generation"] != key["generation"]


def _standin_job(standin: Path, samples: Path, extra: list[str]) -> list[str]:
    """model=tar_tiny with the stand-in Tar LLM (9 codes): 3 prompts x 4 images, as GenEval's 4 per
    prompt, the first prompt's images timed at batch 1 (twice), the rest decoded at batch 4."""
    llm = [f"+model.llm.local_path={standin}", "model.llm._target_=harness.models.tar.llm.TarLLM",
           "~model.llm.codebook_size", "+model.llm.dtype=fp32"]
    return ["model=tar_tiny", *llm, "dataset_limit=3", "images_per_prompt=4", "batch_size=4",
            "warmup_batches=1", "timing.reps=2", "timing.images=4", "timing.batch_size=1", "evaluator=[speed]",
            "stages=[generate]", f"samples_dir={samples}", "device=cpu", "report=false", *extra]


@pytest.fixture
def generate_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every batched `generate` the Tar LLM makes."""
    calls: list[int] = []
    original = TarLLM._decode

    def recording(self: TarLLM, prompts: list[str], draws: list[int]) -> list[list[int]]:
        calls.append(len(prompts))
        return original(self, prompts, draws)

    monkeypatch.setattr(TarLLM, "_decode", recording)
    return calls


def test_a_prompts_four_images_cost_one_llm_call_and_a_second_resolution_none(
        standin: Path, tmp_path: Path, generate_calls: list[int]) -> None:
    """Two decoders, 3 prompts x 4 images: one `generate` of 4 rows per prompt (the per-row path
    made 4 per prompt), timed images included; then the same LLM under a 128 px image model with
    the same conditions_dir makes no LLM call at all, and its run.json records the generation config."""
    shared = tmp_path / "conditions"
    run(compose_cfg(_standin_job(standin, tmp_path / "s64", ["decoder=[raster,zipar]",
                                                             f"conditions_dir={shared}"])), tmp_path / "first")
    assert generate_calls == [4, 4, 4]
    assert math.isclose(len(generate_calls) / 3, 1.0)  # LLM calls per prompt
    generate_calls.clear()
    second = ["decoder=[raster]", f"conditions_dir={shared}", "model.name=tar_tiny_128", "model.target_size=128"]
    run(compose_cfg(_standin_job(standin, tmp_path / "s128", second)), tmp_path / "second")
    assert generate_calls == []
    recorded = json.loads((tmp_path / "second" / "run.json").read_text())
    assert recorded["extra"]["llm_generation"]["top_k"] == GENERATION_TOP_K


def test_fetch_prints_the_effective_generation_config(standin: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """stages=[fetch] names the generation config the LLM will sample with, read from the fetched
    generation_config.json (the downloads themselves are tested in tests/test_rehearsal.py)."""
    import logging

    from harness import preflight
    from harness.assets import fetching

    monkeypatch.setattr(fetching, "model_assets", lambda model: [])
    monkeypatch.setattr(fetching, "fetch_assets", lambda assets: [])
    cfg = compose_cfg(["model=tar_1.5b_512", f"model.llm.local_path={standin}"])
    with caplog.at_level(logging.INFO, logger="harness.preflight"):
        lines = preflight.fetch(cfg)
    line = next(line for line in lines if "effective generation config" in line)
    assert f"'top_k': {GENERATION_TOP_K}" in line and f"'repetition_penalty': {GENERATION_PENALTY}" in line
    assert line in caplog.text
