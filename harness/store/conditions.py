"""The condition cache: a conditioner's costly stage computed once per (prompt, image seed), or once
per prompt where the stage reads no seed, and shared by every decoder, timing repetition, shard and
rerun of a job (docs/methodology.md, "Conditioning").

A conditioner takes part when it splits itself into `stage` (the costly call: Tar's LLM, LlamaGen's
text encoder; prompts [, seeds] -> a tensor or a tuple of tensors, batch first), `finish` (the
stage's output -> the Condition, cheap and deterministic: TA-Tok's code embedding, LlamaGen's
padding) and `per_image` (True: the stage's output depends on the image seed, so entries are keyed
by (prompt, seed); False: by the prompt alone). Other conditioners (the shapes world's word ids) are
called as they are: they cost microseconds.

Layout under `root` (`<samples_dir>/conditions/`, beside the SampleSets):

    <context>/context.json   what the entries were made with: the stage's class and config (its
                             model config node, without where weights are read from and without
                             options at their defaults), its weights id, per_image, the effective
                             generation config where the stage has one (Tar's LLM), and the model
                             name only where the stage has no config node of its own
    <context>/<entry>.pt     one row of the stage's output with its prompt, seed and the seconds it
                             cost when it was computed (torch.save; read with weights_only)

<context> is a digest of context.json's content and <entry> of (prompt, seed): another conditioner,
other weights or other LLM sampling settings read other files and compute again, while models that
share a stage (Tar-1.5B at 512 and at 1024 px: the same LLM, weights and sampling) share its entries
when their jobs name one folder (`conditions_dir`). Files are written
atomically, so shard jobs share one folder; an entry that cannot be read is refused, naming it.

Time: `ledger` says how many stage calls ran, what they cost, and the recorded cost of every entry
a condition call served (`charged_s`), so the harness reports for each batch what computing its
conditions costs, whichever decoder happened to compute them (harness/generate.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from harness.api import InputError
from harness.moved import TARGET, canonical
from harness.store.binding import _LOCATION_KEYS, without_defaults
from harness.store.provenance import weights_digest
from harness.store.samples import write_atomic

log = logging.getLogger(__name__)

CONDITIONS_DIR = "conditions"  # the cache's folder in a samples_dir
CONTEXT_FILE = "context.json"
ENTRY_FORMAT = 1
Key = tuple[str, int | None]  # (prompt text, image seed or None where the stage reads no seed)


class CorruptConditionError(InputError, ValueError):
    """A condition cache entry that cannot be read or does not hold the entry it is named for."""


@dataclass(slots=True)
class Ledger:
    """Counters of a cache: stage calls and the entries they computed with the seconds it took;
    entries read from disk; entries served to condition calls (counted once per call) and their
    recorded cost."""

    calls: int = 0
    computed: int = 0
    computed_s: float = 0.0
    loaded: int = 0
    served: int = 0
    charged_s: float = 0.0

    def copy(self) -> "Ledger":
        return dataclasses.replace(self)


@dataclass(frozen=True, slots=True)
class _Entry:
    parts: tuple[Tensor, ...]  # one row of each output tensor, on the CPU
    single: bool  # the stage returned one tensor (not a tuple)
    seconds: float  # its share of the stage call that computed it


@dataclass(slots=True)
class _Context:
    digest: str
    folder: Path | None
    entries: dict[Key, _Entry] = field(default_factory=dict)


def cacheable(conditioner: Any) -> bool:
    """Whether `conditioner` splits into a costly `stage` and a `finish` (module docstring)."""
    return hasattr(conditioner, "stage") and hasattr(conditioner, "finish")


def class_path(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def stage_config(model: dict[str, Any] | None, stage: Any) -> Any:
    """The config of `stage` within a resolved model config `model`: the node whose `_target_` is the
    stage's class (`model.llm`, `model.text_encoder`), else the whole model config; without the keys
    that say where weights are read from and without options at their defaults (as SampleSet
    bindings compare, harness/store/binding.py). None without a model config."""
    if model is None:
        return None
    tree = canonical(model)
    node = next((value for value in tree.values()
                 if isinstance(value, dict) and value.get(TARGET) == class_path(stage)), tree)
    return without_defaults(_without(node, _LOCATION_KEYS | {"operating_points"}))


def _without(tree: Any, keys: frozenset[str] | set[str]) -> Any:
    if isinstance(tree, dict):
        return {k: _without(v, keys) for k, v in tree.items() if k not in keys}
    return tree


def stage_weights_id(stage: Any) -> str:
    """What identifies the weights of `stage`: the files of the folder it loaded (`folder`: name,
    the name a link resolves to, size, modification time; a Hugging Face cache links to blobs named
    by their content), else a digest of its parameters (a torch module, or its `model`), else "none"
    (a stage without weights, whose config says everything)."""
    folder = getattr(stage, "folder", None)
    if folder:
        digest = hashlib.blake2b(digest_size=16)
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                stat = path.stat()
                digest.update(f"{path.name}\0{path.resolve().name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        return "files:" + digest.hexdigest()
    for module in (stage, getattr(stage, "model", None)):
        if isinstance(module, torch.nn.Module):
            return "params:" + weights_digest([module])
    return "none"


def has_own_node(model: dict[str, Any] | None, stage: Any) -> bool:
    """Whether the resolved model config `model` holds a node whose `_target_` is the stage's class."""
    return model is not None and any(isinstance(value, dict) and value.get(TARGET) == class_path(stage)
                                     for value in canonical(model).values())


def context_description(model_name: str, model: dict[str, Any] | None, conditioner: Any) -> dict[str, Any]:
    """What names a conditioner's entries (module docstring): the stage's class, its own config
    node, its weights, whether it reads image seeds and, where the stage says it (`generation`: Tar's
    LLM), its effective generation config. A stage with its own config node is named by it alone,
    not by the model around it: image models that share the stage (Tar at 512 and 1024 px) share
    its entries; one without (the whole model config stands for it) is named with the model."""
    stage = conditioner.stage
    description = {"format": ENTRY_FORMAT, "stage": class_path(stage), "config": stage_config(model, stage),
                   "weights": stage_weights_id(stage),
                   "per_image": bool(getattr(conditioner, "per_image", False))}
    generation = getattr(stage, "generation", None)
    if generation is not None:
        description["generation"] = generation
    if not has_own_node(model, stage):
        description["model"] = model_name
    return description


class ConditionCache:
    """Entries of conditioners' costly stages, in memory for a job and, with `root`, on disk.

    `model`: the model's name; `config`: the resolved model config (plain), from which the stage's
    own node is read (`stage_config`); without it nothing is written to or read from disk.
    `device`: where conditions are handed out (None: the CPU). `clock` times the stage's calls
    (tests pass a double)."""

    def __init__(self, root: Path | str | None = None, model: str = "model", config: dict[str, Any] | None = None,
                 device: torch.device | str | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.root = None if root is None else Path(root)
        self.model = model
        self.config = config
        self.device = device
        self.clock = clock
        self.ledger = Ledger()
        self._contexts: dict[int, _Context] = {}

    def condition(self, bundle: Any, prompts: Sequence[str], seeds: Sequence[int] | None = None) -> Any:
        """`bundle.condition(prompts, seeds)`, with the conditioner's stage outputs from the cache."""
        conditioner = bundle.conditioner
        if not cacheable(conditioner):
            return bundle.condition(prompts, seeds)
        return conditioner.finish(self.stage_output(conditioner, prompts, seeds))

    def keys(self, conditioner: Any, prompts: Sequence[str], seeds: Sequence[int] | None) -> list[Key]:
        """The entry key of each row: (prompt, seed) for a per-image stage given seeds, else (prompt, None)."""
        if bool(getattr(conditioner, "per_image", False)) and seeds is not None:
            if len(seeds) != len(prompts):
                raise ValueError(f"{len(prompts)} prompts but {len(seeds)} image seeds")
            return [(str(p), int(s)) for p, s in zip(prompts, seeds)]
        return [(str(p), None) for p in prompts]

    def missing(self, conditioner: Any, prompts: Sequence[str], seeds: Sequence[int] | None) -> set[Key]:
        """The distinct entries of these rows that are neither in memory nor on disk (none for a
        conditioner that does not take part)."""
        if not cacheable(conditioner):
            return set()
        context = self._context(conditioner)
        return {key for key in dict.fromkeys(self.keys(conditioner, prompts, seeds))
                if key not in context.entries and not self._on_disk(context, key)}

    def prefetch(self, conditioner: Any, prompts: Sequence[str], seeds: Sequence[int] | None, size: int) -> int:
        """Compute the missing entries of these rows ahead, in stage calls of at most `size` distinct
        entries in row order (a prompt's images together), serving nothing; return the entries computed."""
        if not cacheable(conditioner):
            return 0
        missing = self.missing(conditioner, prompts, seeds)
        todo = [key for key in dict.fromkeys(self.keys(conditioner, prompts, seeds)) if key in missing]
        context = self._context(conditioner)
        for start in range(0, len(todo), size):
            self._compute(conditioner, context, todo[start:start + size])
        return len(todo)

    def stage_output(self, conditioner: Any, prompts: Sequence[str], seeds: Sequence[int] | None) -> Any:
        """The stage's output for these rows: entries in memory or on disk are reused, the others
        computed in one stage call (each distinct entry once) and stored."""
        context = self._context(conditioner)
        keys = self.keys(conditioner, prompts, seeds)
        todo = []
        for key in dict.fromkeys(keys):
            if key in context.entries:
                continue
            loaded = self._read(context, key)
            if loaded is None:
                todo.append(key)
            else:
                context.entries[key] = loaded
                self.ledger.loaded += 1
        if todo:
            self._compute(conditioner, context, todo)
        distinct = dict.fromkeys(keys)
        self.ledger.served += len(distinct)
        self.ledger.charged_s += sum(context.entries[key].seconds for key in distinct)
        rows = [context.entries[key] for key in keys]
        parts = tuple(torch.stack([row.parts[i] for row in rows]) for i in range(len(rows[0].parts)))
        if self.device is not None:
            parts = tuple(part.to(self.device) for part in parts)
        return parts[0] if rows[0].single else parts

    def _compute(self, conditioner: Any, context: _Context, todo: list[Key]) -> None:
        stage = conditioner.stage
        prompts = [prompt for prompt, _ in todo]
        start = self.clock()
        if todo[0][1] is None:
            out = stage(prompts)
        else:
            out = stage(prompts, [seed for _, seed in todo])
        single = isinstance(out, Tensor)
        parts = (out,) if single else tuple(out)
        for part in parts:
            if part.is_cuda:
                torch.cuda.synchronize(part.device)
        seconds = self.clock() - start
        share = seconds / len(todo)
        for row, key in enumerate(todo):
            # a clone: a row of a batch would keep (and torch.save would write) the whole batch
            entry = _Entry(tuple(part[row].detach().to("cpu").clone() for part in parts), single, share)
            context.entries[key] = entry
            self._write(context, key, entry, parts[0].device.type)
        self.ledger.calls += 1
        self.ledger.computed += len(todo)
        self.ledger.computed_s += seconds

    def _context(self, conditioner: Any) -> _Context:
        found = self._contexts.get(id(conditioner))
        if found is not None:
            return found
        stage = conditioner.stage
        description = context_description(self.model, self.config, conditioner)
        text = json.dumps(description, sort_keys=True, default=str)
        digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
        folder = None
        if self.root is not None and self.config is not None:
            folder = self.root / digest
            folder.mkdir(parents=True, exist_ok=True)
            if not (folder / CONTEXT_FILE).is_file():
                write_atomic(folder / CONTEXT_FILE, (json.dumps(description, indent=1, sort_keys=True,
                                                                default=str) + "\n").encode())
            log.info("condition cache: %s (%s of model %s)", folder, description["stage"], self.model)
        context = _Context(digest, folder)
        self._contexts[id(conditioner)] = context
        return context

    @staticmethod
    def _path(context: _Context, key: Key) -> Path:
        assert context.folder is not None
        prompt, seed = key
        name = hashlib.blake2b(f"{prompt}\0{'-' if seed is None else seed}".encode(), digest_size=16).hexdigest()
        return context.folder / f"{name}.pt"

    def _on_disk(self, context: _Context, key: Key) -> bool:
        return context.folder is not None and self._path(context, key).is_file()

    def _write(self, context: _Context, key: Key, entry: _Entry, device: str) -> None:
        if context.folder is None:
            return
        buffer = io.BytesIO()
        torch.save({"format": ENTRY_FORMAT, "prompt": key[0], "seed": key[1], "seconds": entry.seconds,
                    "device": device, "single": entry.single, "parts": list(entry.parts)}, buffer)
        write_atomic(self._path(context, key), buffer.getvalue())

    def _read(self, context: _Context, key: Key) -> _Entry | None:
        """The entry stored on disk, None when there is none.

        Raises:
            CorruptConditionError: the file cannot be read, or holds another entry or a malformed one.
        """
        if not self._on_disk(context, key):
            return None
        path = self._path(context, key)
        try:
            stored = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any failure to unpickle is a corrupt file
            # torch's own message advises weights_only=False, which would unpickle anything: not named
            raise CorruptConditionError(_corrupt(path, f"not a file of tensors torch can load, "
                                                       f"{type(err).__name__}")) from err
        problem = _problem(stored, key)
        if problem:
            raise CorruptConditionError(_corrupt(path, problem))
        return _Entry(tuple(stored["parts"]), bool(stored["single"]), float(stored["seconds"]))


def _problem(stored: Any, key: Key) -> str | None:
    """What is wrong with a loaded entry for `key`, or None."""
    if not isinstance(stored, dict) or stored.get("format") != ENTRY_FORMAT:
        return f"not a condition cache entry of format {ENTRY_FORMAT}"
    if stored.get("prompt") != key[0] or stored.get("seed") != key[1]:
        return "it holds the entry of another prompt or seed"
    parts, seconds = stored.get("parts"), stored.get("seconds")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, Tensor) for p in parts):
        return "no tensors"
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        return f"a cost of {seconds!r} seconds"
    return None


def _corrupt(path: Path, why: str) -> str:
    return (f"condition cache entry {path} is corrupt ({why}); delete it (rm {os.fspath(path)}) and rerun: "
            "the entry is computed again")
