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
    <context>/shapes.json    the shapes and dtypes of one entry's tensors, as the stage computed them
    <context>/<entry>.pt     one row of the stage's output with its prompt, seed and the seconds it
                             cost when it was computed (torch.save; read with weights_only)

<context> is a digest of context.json's content and <entry> of (prompt, seed): another conditioner,
other weights or other LLM sampling settings read other files and compute again, while models that
share a stage (Tar-1.5B at 512 and at 1024 px: the same LLM, weights and sampling) share its entries
when their jobs name one folder (`conditions_dir`). Files are written
atomically, so shard jobs share one folder; an entry that cannot be read is refused, naming it.

Integrity on read: every entry stores the digest of the context it was made in, and is refused
(naming it) when that is not its folder's, so an entry copied in from another folder (a hand merge,
a copy between machines) is never served; its tensors must have the shapes and dtypes shapes.json
records (or, before that file exists, those of the other entries read); a context.json that does not describe the folder's context is refused. A
path of the cache that is the wrong kind of file (a file where a folder belongs, a folder where an
entry belongs) or that cannot be written is refused, naming it and the fix.

Temporary files: a writer killed between writing an entry's temporary file and renaming it leaves
`.<entry>.pt.<hex>.tmp` behind; the next job that opens the context removes them (and a writer
whose temporary file a concurrent job removed writes it again), so a killed and resumed job leaves
the folder an uninterrupted one does.

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
import re
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
SHAPES_FILE = "shapes.json"  # the shapes and dtypes of the stage's output, written by its first call
ENTRY_FORMAT = 2  # 2: entries store their context's digest
_TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # write_atomic's temporary files
_WRITE_TRIES = 3
Key = tuple[str, int | None]  # (prompt text, image seed or None where the stage reads no seed)


class CorruptConditionError(InputError, ValueError):
    """A condition cache entry that cannot be read or does not hold the entry it is named for."""


class ConditionCacheError(InputError, OSError):
    """A path of the condition cache that is the wrong kind of file or cannot be written."""


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


Signature = tuple[bool, tuple[tuple[tuple[int, ...], str], ...]]  # (single, ((shape, dtype) per part))


@dataclass(slots=True)
class _Context:
    digest: str
    folder: Path | None
    entries: dict[Key, _Entry] = field(default_factory=dict)
    signature: Signature | None = None  # what every entry of this context holds
    signature_from: Path | None = None  # the file it was first read from (None: computed)


def signature(entry: _Entry) -> Signature:
    """(single, ((shape, dtype) of each part)): what entries of one context share."""
    return entry.single, tuple((tuple(part.shape), str(part.dtype)) for part in entry.parts)


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
            if context.signature_from is not None and signature(entry) != context.signature:
                why = _shape_problem(context.signature, signature(entry), "the stage computes")
                source = context.signature_from
                raise CorruptConditionError(_bad_context(source, why) if source.name == SHAPES_FILE
                                            else _corrupt(source, why))
            if context.signature_from is None or context.signature_from.name != SHAPES_FILE:
                self._write_shapes(context, signature(entry))
            context.entries[key] = entry
            self._write(context, key, entry, parts[0].device.type)
        self.ledger.calls += 1
        self.ledger.computed += len(todo)
        self.ledger.computed_s += seconds

    def _context(self, conditioner: Any) -> _Context:
        found = self._contexts.get(id(conditioner))
        if found is not None:
            return found
        description = context_description(self.model, self.config, conditioner)
        text = json.dumps(description, sort_keys=True, default=str)
        digest = hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
        folder = None
        if self.root is not None and self.config is not None:
            folder = self.root / digest
            _open_folder(folder, json.loads(text))
            log.info("condition cache: %s (%s of model %s)", folder, description["stage"], self.model)
        context = _Context(digest, folder)
        if folder is not None and (folder / SHAPES_FILE).exists():
            context.signature, context.signature_from = _read_shapes(folder / SHAPES_FILE), folder / SHAPES_FILE
        self._contexts[id(conditioner)] = context
        return context

    @staticmethod
    def _write_shapes(context: _Context, found: Signature) -> None:
        """Record what the stage computes as the context's signature (shapes.json, once)."""
        context.signature = found
        if context.folder is None:
            context.signature_from = None
            return
        path = context.folder / SHAPES_FILE
        text = json.dumps({"single": found[0], "parts": [[list(shape), dtype] for shape, dtype in found[1]]})
        try:
            write_atomic(path, (text + "\n").encode())
        except OSError as err:
            raise ConditionCacheError(_unwritable(path, err.strerror or str(err))) from err
        context.signature_from = path

    @staticmethod
    def _path(context: _Context, key: Key) -> Path:
        assert context.folder is not None
        prompt, seed = key
        name = hashlib.blake2b(f"{prompt}\0{'-' if seed is None else seed}".encode(), digest_size=16).hexdigest()
        return context.folder / f"{name}.pt"

    def _on_disk(self, context: _Context, key: Key) -> bool:
        if context.folder is None:
            return False
        path = self._path(context, key)
        if path.exists() and not path.is_file():
            raise ConditionCacheError(f"condition cache entry {path} is not a file (a folder or another kind of "
                                      f"file is in its place); remove it (rm -r {os.fspath(path)}) and rerun: "
                                      "the entry is computed again")
        return path.is_file()

    def _write(self, context: _Context, key: Key, entry: _Entry, device: str) -> None:
        if context.folder is None:
            return
        buffer = io.BytesIO()
        torch.save({"format": ENTRY_FORMAT, "context": context.digest, "prompt": key[0], "seed": key[1],
                    "seconds": entry.seconds, "device": device, "single": entry.single,
                    "parts": list(entry.parts)}, buffer)
        path = self._path(context, key)
        for attempt in range(_WRITE_TRIES):
            try:
                write_atomic(path, buffer.getvalue())
                return
            except FileNotFoundError:  # a job opening this context removed our temporary file: again
                if attempt + 1 == _WRITE_TRIES or not context.folder.is_dir():
                    raise ConditionCacheError(_unwritable(path, "its folder disappeared while writing")) from None
            except OSError as err:
                raise ConditionCacheError(_unwritable(path, err.strerror or str(err))) from err

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
        problem = _problem(stored, key, context.digest)
        if problem:
            raise CorruptConditionError(_corrupt(path, problem))
        entry = _Entry(tuple(stored["parts"]), bool(stored["single"]), float(stored["seconds"]))
        if context.signature is not None and signature(entry) != context.signature:
            whose = f"{context.signature_from} records" if context.signature_from is not None and \
                context.signature_from.name == SHAPES_FILE else "the other entries of its context hold"
            raise CorruptConditionError(_corrupt(path, _shape_problem(signature(entry), context.signature, whose)))
        if context.signature is None:
            context.signature, context.signature_from = signature(entry), path
        return entry


def _problem(stored: Any, key: Key, digest: str) -> str | None:
    """What is wrong with a loaded entry for `key` in the context `digest`, or None."""
    if not isinstance(stored, dict) or stored.get("format") != ENTRY_FORMAT:
        return f"not a condition cache entry of format {ENTRY_FORMAT}"
    if stored.get("context") != digest:
        return (f"it was made in context {stored.get('context')!r}, not this folder's {digest} (another text "
                "encoder, LLM, weights or sampling: a copy from another folder or machine)")
    if stored.get("prompt") != key[0] or stored.get("seed") != key[1]:
        return "it holds the entry of another prompt or seed"
    if not isinstance(stored.get("single"), bool):
        return "no flag saying whether the stage returned one tensor"
    parts, seconds = stored.get("parts"), stored.get("seconds")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, Tensor) for p in parts):
        return "no tensors"
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        return f"a cost of {seconds!r} seconds"
    return None


def _shape_problem(found: Signature, expected: Signature, whose: str) -> str:
    """Why an entry's tensors do not fit its context, e.g. "tensors [(4, 8) float32], while ..."."""
    def show(sig: Signature) -> str:
        return ", ".join(f"{shape} {dtype.removeprefix('torch.')}" for shape, dtype in sig[1]) + \
            ("" if sig[0] else " (a tuple)")
    return f"tensors {show(found)}, while {whose} {show(expected)}"


def _open_folder(folder: Path, description: dict[str, Any]) -> None:
    """Create the context folder with its context.json, or check an existing one's; remove the
    temporary files killed writers left there.

    Raises:
        ConditionCacheError: a path of the cache is a file where a folder belongs (or the reverse),
            or cannot be created.
        CorruptConditionError: the folder's context.json describes another context or cannot be read.
    """
    for path in (folder.parent, folder):
        if path.exists() and not path.is_dir():
            raise ConditionCacheError(f"condition cache folder {path} is a file, not a folder; remove or rename it "
                                      f"(rm {os.fspath(path)}) and rerun, or set samples_dir to another folder")
    context_file = folder / CONTEXT_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_temp_files(folder)
        if not context_file.exists():
            write_atomic(context_file, (json.dumps(description, indent=1, sort_keys=True) + "\n").encode())
            return
    except OSError as err:
        raise ConditionCacheError(_unwritable(folder, err.strerror or str(err))) from err
    try:
        stored = json.loads(context_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CorruptConditionError(_bad_context(context_file, f"it cannot be read as JSON ({type(err).__name__})")) \
            from err
    if stored != description:
        raise CorruptConditionError(_bad_context(context_file, "it describes another context than the one its "
                                                               "folder is named for (a copied or edited file)"))


def _read_shapes(path: Path) -> Signature:
    """The signature shapes.json records; CorruptConditionError naming it when it holds none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return bool(data["single"]), tuple((tuple(int(n) for n in shape), str(dtype))
                                           for shape, dtype in data["parts"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CorruptConditionError(_bad_context(path, f"no shapes can be read from it ({type(err).__name__})")) \
            from err


def _remove_temp_files(folder: Path) -> None:
    """Delete the temporary files (write_atomic's `.<name>.<hex>.tmp`) killed writers left in `folder`."""
    for name in os.listdir(folder):
        if _TEMP_NAME.match(name):
            (folder / name).unlink(missing_ok=True)


def _bad_context(path: Path, why: str) -> str:
    return (f"condition cache file {path} is corrupt ({why}); delete its folder (rm -r {os.fspath(path.parent)}) "
            "and rerun: its entries are computed again")


def _unwritable(path: Path, why: str) -> str:
    return (f"condition cache path {path} cannot be written ({why}); make {path.parent} a writable folder, or "
            "set samples_dir to one")


def _corrupt(path: Path, why: str) -> str:
    return (f"condition cache entry {path} is corrupt ({why}); delete it (rm {os.fspath(path)}) and rerun: "
            "the entry is computed again")
