"""The `python -m harness` commands of README.md and docs/*.md, as a user would type them: read from
the ```bash blocks (continuation lines joined, comments dropped, split as the shell splits them).

`gpu_section()` is the README's "Reproduce the paper on a GPU" sequence, which the rehearsal
(tests/test_rehearsal.py) runs; `rehearsed(...)` is that sequence with the only changes the
rehearsal makes to it (REHEARSAL_CHANGES: another model and protocol, the local launcher for
SLURM, two shards for eight), each of which must find its token in the README."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tests.conftest import ROOT

GPU_HEADING = "## Reproduce the paper on a GPU"
_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


@dataclass(frozen=True)
class Command:
    """One command line: its file, its words after `python` (`-m harness ...`)."""

    where: str
    words: tuple[str, ...]

    @property
    def module(self) -> str:
        return self.words[1]

    @property
    def overrides(self) -> list[str]:
        return [w for w in self.words[2:] if w != "-m"]

    @property
    def multirun(self) -> bool:
        return "-m" in self.words[2:]


def commands(text: str, where: str) -> list[Command]:
    """Every `python -m <module> ...` command of the ```bash blocks of `text`."""
    found = []
    for block in _BLOCK.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            if not line.lstrip().startswith("python -m "):
                continue
            words = shlex.split(line, comments=True)
            if len(words) >= 3 and words[0] == "python" and words[1] == "-m":
                found.append(Command(where, tuple(words[1:])))
    return found


def all_doc_commands() -> list[Command]:
    """The `python -m harness` commands of README.md and docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += [c for c in commands(path.read_text(encoding="utf-8"), path.name) if c.module == "harness"]
    return found


def gpu_section() -> list[Command]:
    """The harness commands of the README's GPU section, in order (harness runs and
    `harness.tables`); step 0's environment builds (`evaluators.official_build`, conda and CUDA) are
    left to the rehearsal's stand-in homes."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(GPU_HEADING)
    end = text.find("\n## ", start + len(GPU_HEADING))
    found = commands(text[start:end if end > 0 else None], "README.md")
    return [c for c in found if c.module == "harness" or c.module.startswith("harness.")]


# the rehearsal's changes to the README's commands: token in the README -> what the rehearsal types
REHEARSAL_CHANGES = {
    "hydra/launcher=slurm": "hydra/launcher=local",  # no SLURM cluster in the rehearsal: the same sweep, locally
    "shard.count=8": "shard.count=2",
    "shard.index=range(0,8)": "shard.index=range(0,2)",
}
README_MODEL, README_PROTOCOL = "model=tar_1.5b_512", "protocol=geneval"


def rehearsed(model: str, protocol: str) -> list[Command]:
    """The GPU section as the rehearsal runs it for `model` and `protocol`: the README's words, with
    REHEARSAL_CHANGES and the model and protocol replaced (samples_dir's path follows them)."""
    out = []
    for command in gpu_section():
        words = []
        for word in command.words:
            word = REHEARSAL_CHANGES.get(word, word)
            word = {README_MODEL: f"model={model}", README_PROTOCOL: f"protocol={protocol}"}.get(word, word)
            if word.startswith("samples_dir="):
                word = word.replace("/tar_1.5b_512/geneval/", f"/{model}/{protocol}/")
            words.append(word)
        out.append(Command(command.where, tuple(words)))
    return out
