"""The commands the docs give are the ones that work: the README's GPU section is the sequence the
rehearsal runs (tests/test_rehearsal.py, through tests/doc_commands.rehearsed), and every
`python -m harness` line of README.md and docs/*.md composes; one that scores (a `stages=[evaluate]`
line, or one setting an evaluator's options) evaluates the existing SampleSets and never
regenerates them."""
from __future__ import annotations

import re

import pytest

from tests.conftest import compose_cfg
from tests.doc_commands import (README_MODEL, README_PROTOCOL, REHEARSAL_CHANGES, Command, all_doc_commands,
                                gpu_section, rehearsed)

_SWEEP = re.compile(r"^([^=]+)=(?:range\((\d+),\d+\)|([^,\[\]]+),.*)$")


def _composable(command: Command) -> list[str] | None:
    """The overrides as one job of the command composes them (hydra's own keys dropped, a sweep at
    its first value); None for a line with placeholders (NAME, ${...}, ...)."""
    out = []
    for word in command.overrides:
        if "NAME" in word or "${" in word or "..." in word:
            return None
        if word.startswith(("hydra.", "hydra/")):
            continue
        match = _SWEEP.match(word) if command.multirun else None
        out.append(f"{match.group(1)}={match.group(2) or match.group(3)}" if match else word)
    return out


def _scores(command: Command) -> bool:
    """Whether the command is an evaluate step: it names the evaluate stage alone or sets an evaluator's options."""
    return "stages=[evaluate]" in command.overrides or any(w.startswith("evaluator.") for w in command.overrides)


def test_readme_gpu_section_is_the_sequence_the_rehearsal_runs() -> None:
    steps = gpu_section()
    stages = [next((w for w in c.overrides if w.startswith("stages=")), None) for c in steps]
    assert [c.module for c in steps] == ["harness", "harness", "harness", "harness.tables"], steps
    assert stages[:3] == ["stages=[fetch]", "stages=[generate]", "stages=[evaluate]"]
    readme_words = {w for c in steps for w in c.words}
    for token in [*REHEARSAL_CHANGES, README_MODEL, README_PROTOCOL]:
        assert token in readme_words, f"the rehearsal changes {token!r}, which the README no longer has"
    samples = [next(w for w in c.overrides if w.startswith("samples_dir=")) for c in steps[1:3]]
    assert samples[0] == samples[1]  # evaluate scores the set the shards wrote
    changed = rehearsed("llamagen_xl_512", "coco5k")
    for readme, ours in zip(steps, changed, strict=True):  # nothing else differs
        differing = {(a, b) for a, b in zip(readme.words, ours.words, strict=True) if a != b}
        assert all(a in REHEARSAL_CHANGES or a in (README_MODEL, README_PROTOCOL) or a.startswith("samples_dir=")
                   for a, _ in differing), differing


def test_every_doc_command_composes_and_evaluate_commands_score_existing_samples() -> None:
    checked = 0
    for command in all_doc_commands():
        overrides = _composable(command)
        if overrides is None:
            continue
        cfg = compose_cfg(overrides)
        checked += 1
        if not _scores(command):
            continue
        where = f"{command.where}: python {' '.join(command.words)}"
        assert list(cfg.stages) == ["evaluate"], f"{where} would generate the images again (stages={list(cfg.stages)})"
        assert cfg.samples_dir, f"{where} names no samples_dir: it would score an empty run folder"
        if cfg.get("rows_by_model"):
            assert any(w.startswith("model=") for w in overrides), f"{where} does not say which model's samples"
    assert checked >= 15


def test_the_rule_catches_a_command_that_regenerates() -> None:
    bad = Command("x.md", ("-m", "harness", "+experiment=paper_main", "protocol=geneval",
                           "evaluator.geneval_official.env_python=/envs/geneval/bin/python"))
    assert _scores(bad) and list(compose_cfg(_composable(bad)).stages) == ["generate", "evaluate"]
    sweep = Command("x.md", ("-m", "harness", "-m", "shard.count=8", "shard.index=range(0,8)", "stages=[generate]"))
    assert _composable(sweep) == ["shard.count=8", "shard.index=0", "stages=[generate]"]


@pytest.mark.parametrize("model,protocol", [("llamagen_xl_512", "dpg_bench")])
def test_rehearsed_commands_change_model_protocol_and_samples_dir(model: str, protocol: str) -> None:
    steps = rehearsed(model, protocol)
    assert f"samples_dir=results/paper_main/{model}/{protocol}/samples" in steps[1].words
    assert all(f"model={model}" in s.words and f"protocol={protocol}" in s.words for s in steps[:3])
    assert "hydra/launcher=local" in steps[1].words and "shard.index=range(0,2)" in steps[1].words
