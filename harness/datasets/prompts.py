"""Prompt sets -> list[Prompt]. Each loader is a `_target_` of a `conf/dataset/*.yaml` file."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from harness.api import InputError, Prompt, checked_number

log = logging.getLogger(__name__)


class PromptFileError(InputError, ValueError):
    """A prompts file is missing or malformed; the message names the path and line."""


def shapes(n: int = 64, seed: int = 0) -> list[Prompt]:
    """The shapes world's GenEval-style prompt set: n captions, balanced over the six tags."""
    from harness.shapes.scenes import prompt_set
    checked_number("dataset.n", n, integer=True, low=1)
    checked_number("dataset.seed", seed, integer=True)

    return [Prompt(id=f"shapes/{i:05d}", text=m["prompt"], meta=m) for i, m in enumerate(prompt_set(n, seed))]


def prompt_file(path: str | Path) -> list[Prompt]:
    """Prompts from a `.txt` file (one prompt per non-empty line) or a `.jsonl` file (one object per
    line with "prompt" or "text", optional "id"; other fields become `meta`)."""
    p = Path(path)
    if not p.is_file():
        raise PromptFileError(f"prompts file {p} does not exist; set dataset.path to a .txt or .jsonl file")
    lines = _text_lines(p)
    if p.suffix == ".jsonl":
        prompts = [_jsonl_prompt(p, i + 1, line) for i, line in enumerate(lines) if line.strip()]
    else:
        prompts = [Prompt(id=f"{p.stem}/{i:05d}", text=line.strip()) for i, line in enumerate(lines) if line.strip()]
    if not prompts:
        raise PromptFileError(f"prompts file {p} holds no prompt")
    ids = [q.id for q in prompts]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise PromptFileError(f"prompts file {p} repeats prompt ids {dup}; ids must be unique")
    return prompts


def _text_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, or PromptFileError naming the first line that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise PromptFileError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                              f"{err.start}); save the prompts file as UTF-8") from err


def _jsonl_prompt(path: Path, lineno: int, line: str) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise PromptFileError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
    if not isinstance(obj, dict):
        raise PromptFileError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    text = obj.get("prompt", obj.get("text"))
    if not isinstance(text, str) or not text.strip():
        raise PromptFileError(f"{path}:{lineno}: needs a non-empty string field 'prompt' (or 'text')")
    meta = {k: v for k, v in obj.items() if k not in ("id", "prompt", "text")}
    given = obj.get("id", f"{path.stem}/{lineno - 1:05d}")
    if isinstance(given, bool) or not isinstance(given, (str, int)) or not str(given).strip():
        raise PromptFileError(f"{path}:{lineno}: 'id' must be a non-empty string (or a number), got "
                              f"{given!r}; give the prompt an id or leave the field out (then it is "
                              f"{path.stem}/<line - 1>)")
    return Prompt(id=str(given), text=text, meta=meta)


def select(prompts: list[Prompt], limit: int | None) -> list[Prompt]:
    """The first `limit` prompts (all when None)."""
    if limit is not None and limit < 1:
        raise ValueError(f"dataset limit must be >= 1 or null, got {limit}")
    return prompts if limit is None else prompts[:limit]
