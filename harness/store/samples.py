"""The SampleSet on disk: the only channel between generation and evaluation (DESIGN.md section 2).

Layout under `root`:

    images/<sample_id>.png     the image (8-bit RGB PNG)
    records/<sample_id>.json   prompt, seed, PNG size and decode stats; written after the PNG, so
                               its presence marks the sample complete
    samples.csv, stats.csv     consolidated, sorted copies of the records (`consolidate()`)
    binding.json               what produced the samples (model weights, decoder configuration,
                               sampling, seed, engine; `bind()`): a generate stage with another
                               configuration refuses to add to or reuse the set

Every file is written atomically (temporary file in the same folder, then `os.replace`), so a
killed job leaves either a complete sample or a leftover that `pending()` deletes and regenerates.
Several shard jobs may write into one SampleSet: per-sample files never collide.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import string
import struct
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd
from PIL import Image

from harness.api import InputError, Prompt
from harness.runtime.seeding import image_seed
from harness.store.binding import BINDING_FILE, BindingMismatchError, binding_differences, refusal

log = logging.getLogger(__name__)

RECORD_FORMAT = 1
RECORD_COLUMNS = ("sample_id", "prompt_id", "prompt", "image_index", "seed", "path", "meta")
_VERBATIM = frozenset(string.ascii_letters + string.digits + "_")
_MAX_ENCODED_ID = 150  # keeps "<id>_<index>.json" and temp names well under 255 bytes
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error)


class NotWritableError(InputError, OSError):
    """The SampleSet's root cannot be created or written."""


class IncompleteSampleSetError(InputError, RuntimeError):
    """An evaluate stage was asked to score a SampleSet that lacks planned samples."""


class CorruptImageError(InputError, OSError):
    """A sample's PNG cannot be decoded."""


class SampleMismatchError(InputError, ValueError):
    """A stored sample was generated for a different prompt text or seed than the plan asks for."""


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """One image to generate: which prompt, which of its images, with which seed."""

    sample_id: str
    prompt: Prompt
    image_index: int
    seed: int


def sample_id_for(prompt_id: str, image_index: int) -> str:
    """Return the filesystem-safe, unique sample id of image `image_index` of `prompt_id`.

    The encoding is injective: letters, digits and "_" are kept, "/" becomes "-", every other
    character becomes "~" plus its UTF-8 bytes in hex; the index follows the last "_"
    (e.g. "geneval/00042", 3 -> "geneval-00042_03").
    """
    if not prompt_id:
        raise ValueError("prompt id must be a non-empty string")
    if image_index < 0:
        raise ValueError(f"image_index must be >= 0, got {image_index}")
    parts = []
    for char in prompt_id:
        if char in _VERBATIM:
            parts.append(char)
        elif char == "/":
            parts.append("-")
        else:
            parts.append("".join(f"~{byte:02x}" for byte in char.encode("utf-8")))
    encoded = "".join(parts)
    if len(encoded) > _MAX_ENCODED_ID:
        # "~~" never appears in an untruncated encoding ("~" is always followed by hex digits).
        digest = hashlib.blake2b(prompt_id.encode("utf-8"), digest_size=8).hexdigest()
        encoded = f"{encoded[:_MAX_ENCODED_ID - 18]}~~{digest}"
    return f"{encoded}_{image_index:02d}"


def plan(
    prompts: Sequence[Prompt],
    images_per_prompt: int,
    global_seed: int,
    shard: int = 0,
    num_shards: int = 1,
) -> list[SampleSpec]:
    """Return the samples of shard `shard` of `num_shards`, in prompt order.

    Prompts are dealt round-robin (prompt i goes to shard i % num_shards), so every shard job that
    plans the same prompt list gets a disjoint part and together they cover it exactly once.
    """
    if images_per_prompt < 1:
        raise ValueError(f"images_per_prompt must be >= 1, got {images_per_prompt}")
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(
            f"shard must be in [0, num_shards) with num_shards >= 1, got shard={shard}, "
            f"num_shards={num_shards}"
        )
    prompts = list(prompts)
    duplicates = _duplicates(prompt.id for prompt in prompts)
    if duplicates:
        raise ValueError(f"prompt ids must be unique; these repeat: {duplicates[:20]}")
    return [
        SampleSpec(
            sample_id=sample_id_for(prompt.id, index),
            prompt=prompt,
            image_index=index,
            seed=image_seed(global_seed, prompt.id, index),
        )
        for prompt in prompts[shard::num_shards]
        for index in range(images_per_prompt)
    ]


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and `os.replace`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class SampleSet:
    """Images, prompts and per-image decode stats of one generation run, on disk under `root`."""

    def __init__(self, root: Path | str, only: Iterable[str] | None = None) -> None:
        self.root = Path(root)
        self.images_dir = self.root / "images"
        self.records_dir = self.root / "records"
        self.only = None if only is None else frozenset(only)  # sample ids this view reads
        self._writable = False
        if self.root.exists() and not self.root.is_dir():
            raise NotWritableError(f"sample set folder {self.root} is a file, not a folder; point "
                                   "samples_dir (or hydra.run.dir) at a folder")

    def __repr__(self) -> str:
        view = "" if self.only is None else f", {len(self.only)} planned samples"
        return f"SampleSet({str(self.root)!r}{view})"

    def view(self, specs: Sequence[SampleSpec]) -> "SampleSet":
        """The same folder restricted to the samples of `specs`: records(), stats() and prompts()
        read only those, so an evaluator scores exactly a run's plan, not every stored sample."""
        return SampleSet(self.root, only=[spec.sample_id for spec in specs])

    def binding(self) -> dict[str, Any] | None:
        """The stored binding (what produced the samples), or None when the set has none."""
        path = self.root / BINDING_FILE
        fix = ("use a fresh output directory, or generate into it again (stages=[generate,evaluate]) with "
               "overwrite_samples=true, which deletes its samples first")
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise BindingMismatchError(f"{path} is unreadable or corrupt ({exc}); {fix}") from exc
        if not isinstance(stored, dict):
            raise BindingMismatchError(f"{path} is corrupt: it holds a JSON {type(stored).__name__}, not "
                                       f"an object; {fix}")
        return stored

    def bind(self, binding: dict[str, Any], overwrite: bool = False,
             compared: Callable[[Any], Any] | None = None) -> None:
        """Bind the set to `binding` (JSON-serialisable) before anything is generated into it.

        A new set stores `binding`. A set bound to the same binding is resumed (its file is kept as
        it is). A set bound to another one, or holding samples without a binding, is refused with
        BindingMismatchError naming the differing keys, unless `overwrite`: then its samples are
        deleted first. Shard jobs of one sweep compute equal bindings, so they share one set.
        `compared` maps both bindings (their JSON forms) to what is compared and diffed (default:
        themselves; harness/store/binding.compared leaves out options at their defaults).
        """
        self.ensure_writable()
        wanted = json.loads(json.dumps(binding, sort_keys=True))  # the form it takes on disk
        try:
            stored = self.binding()
        except BindingMismatchError as exc:  # a corrupt binding.json: what made the samples is unknown
            if not overwrite:
                raise
            log.warning("%s: overwrite_samples=true, deleting the samples of a set whose binding is "
                        "unreadable (%s)", self, exc)
            self._delete_samples()
            stored = None
        view = compared or (lambda tree: tree)
        if stored is not None and view(stored) == view(wanted):
            return
        has_samples = any(self.records_dir.glob("*.json"))
        if stored is not None or has_samples:
            if not overwrite:
                raise BindingMismatchError(refusal(self.root, stored, wanted, view))
            log.warning("%s: overwrite_samples=true, deleting the samples made under another "
                        "configuration (%s)", self, "; ".join(binding_differences(stored, wanted, view)[:5]))
            self._delete_samples()
        write_atomic(self.root / BINDING_FILE, json.dumps(wanted, indent=1, sort_keys=True).encode())

    def _delete_samples(self) -> None:
        """Remove every image, record and consolidated table of the set (not the folder)."""
        for folder in (self.images_dir, self.records_dir):
            for path in folder.iterdir():
                path.unlink()
        for name in ("samples.csv", "stats.csv", BINDING_FILE):
            (self.root / name).unlink(missing_ok=True)

    def image_path(self, sample_id: str) -> Path:
        """Path of the PNG of `sample_id` (which need not exist)."""
        return self.images_dir / f"{_checked_id(sample_id)}.png"

    def record_path(self, sample_id: str) -> Path:
        """Path of the JSON record of `sample_id` (which need not exist)."""
        return self.records_dir / f"{_checked_id(sample_id)}.json"

    def ensure_writable(self) -> None:
        """Create the folders and prove a file can be written there, or raise NotWritableError."""
        if self._writable:
            return
        try:
            self.images_dir.mkdir(parents=True, exist_ok=True)
            self.records_dir.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write_probe.{uuid.uuid4().hex[:12]}"  # unique: shards race
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise NotWritableError(
                f"results directory {self.root} is not writable: {exc}. Choose a writable output "
                "directory (hydra.run.dir or samples_dir) or fix its permissions."
            ) from exc
        self._writable = True

    def pending(self, specs: Sequence[SampleSpec]) -> list[SampleSpec]:
        """Return the specs still to generate, deleting any partial or corrupt leftovers of them.

        A sample is complete when its record exists and matches the spec, and its PNG exists, has
        the recorded size and passes PIL's verification.

        Raises:
            SampleMismatchError: a stored sample has another prompt text or seed than its spec.
        """
        self.ensure_writable()
        _check_unique(specs)
        self._remove_temp_files({spec.sample_id for spec in specs})
        todo = []
        for spec in specs:
            reason = self._incomplete_reason(spec)
            if reason is None:
                continue
            todo.append(spec)
            if reason != "not generated":
                log.warning("sample %s is incomplete (%s); regenerating it", spec.sample_id, reason)
            self.record_path(spec.sample_id).unlink(missing_ok=True)
            self.image_path(spec.sample_id).unlink(missing_ok=True)
        log.info("%s: %d of %d samples pending", self, len(todo), len(specs))
        return todo

    def missing(self, specs: Sequence[SampleSpec]) -> list[str]:
        """Return the ids of the specs that are not complete (`pending` that deletes nothing)."""
        return [spec.sample_id for spec in specs if self._incomplete_reason(spec) is not None]

    def require_complete(self, specs: Sequence[SampleSpec]) -> None:
        """Raise IncompleteSampleSetError, listing missing ids and why the first damaged samples
        (present but unusable) are, unless every spec is complete."""
        reasons = {spec.sample_id: reason for spec in specs
                   if (reason := self._incomplete_reason(spec)) is not None}
        if not reasons:
            return
        missing = list(reasons)
        shown = ", ".join(missing[:20]) + (", ..." if len(missing) > 20 else "")
        damaged = [f"{sample_id}: {reason}" for sample_id, reason in reasons.items()
                   if reason != "not generated"]
        detail = f" Damaged: {'; '.join(damaged[:3])}." if damaged else ""
        raise IncompleteSampleSetError(
            f"sample set {self.root} is incomplete: {len(missing)} of {len(specs)} planned samples "
            f"are missing or corrupt ({shown}).{detail} Run the generate stage (stages=[generate]) "
            "to finish it (it regenerates these), or point samples_dir at a complete set."
        )

    def write(self, spec: SampleSpec, image: np.ndarray, stats: dict[str, Any]) -> None:
        """Store one sample: the PNG first, then its record (the completion marker).

        Args:
            spec: the planned sample.
            image: [H, W, 3] uint8 RGB.
            stats: flat scalar columns (str, int, float, bool, None) for stats.csv, e.g. batch
                timing plus `DecodeStats.as_row()`.
        """
        if not (
            isinstance(image, np.ndarray) and image.dtype == np.uint8
            and image.ndim == 3 and image.shape[2] == 3
        ):
            raise ValueError(
                f"image for {spec.sample_id} must be a uint8 array [H, W, 3], got "
                f"{getattr(image, 'dtype', type(image).__name__)} {getattr(image, 'shape', '')}"
            )
        clean_stats = _clean_stats(spec.sample_id, stats)
        self.ensure_writable()
        buffer = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
        png = buffer.getvalue()
        record = {
            "format": RECORD_FORMAT,
            "sample_id": spec.sample_id,
            "prompt_id": spec.prompt.id,
            "prompt": spec.prompt.text,
            "image_index": spec.image_index,
            "seed": spec.seed,
            "meta": spec.prompt.meta,
            "path": f"images/{spec.sample_id}.png",
            "png_bytes": len(png),
            "height": int(image.shape[0]),
            "width": int(image.shape[1]),
            "stats": clean_stats,
        }
        try:
            text = json.dumps(record, ensure_ascii=False, indent=1)
        except TypeError as exc:
            raise TypeError(
                f"prompt meta of {spec.prompt.id!r} is not JSON-serialisable: {exc}"
            ) from exc
        # Drop an old marker first, so no crash can leave it pointing at a new, partial image.
        self.record_path(spec.sample_id).unlink(missing_ok=True)
        write_atomic(self.image_path(spec.sample_id), png)
        write_atomic(self.record_path(spec.sample_id), text.encode("utf-8"))

    def records(self) -> pd.DataFrame:
        """Return one row per complete sample, sorted by sample_id, with RECORD_COLUMNS.

        `path` is relative to root; `meta` is the prompt's meta as a JSON string.
        """
        return _records_frame(self._complete_records())

    def stats(self) -> pd.DataFrame:
        """Return sample_id plus the stats columns of every complete sample, sorted by sample_id."""
        return _stats_frame(self._complete_records())

    def prompts(self) -> list[Prompt]:
        """Return the distinct prompts of the stored samples, in sample_id order."""
        prompts: dict[str, Prompt] = {}
        for record in self._complete_records():
            prompt = Prompt(id=record["prompt_id"], text=record["prompt"], meta=record["meta"])
            known = prompts.setdefault(prompt.id, prompt)
            if known.text != prompt.text:
                raise SampleMismatchError(
                    f"prompt {prompt.id!r} has two texts in {self.root}: {known.text!r} and "
                    f"{prompt.text!r}; the set mixes runs of different datasets"
                )
        return list(prompts.values())

    def load_image(self, sample_id: str) -> np.ndarray:
        """Return the image of `sample_id` as [H, W, 3] uint8.

        Raises:
            FileNotFoundError: the PNG does not exist.
            CorruptImageError: the PNG is truncated or cannot be decoded.
        """
        path = self.image_path(sample_id)
        if not path.is_file():
            raise FileNotFoundError(f"no image for sample {sample_id!r}: {path} does not exist")
        try:
            with Image.open(path) as handle:
                return np.array(handle.convert("RGB"), dtype=np.uint8)
        except _PIL_ERRORS as exc:
            raise CorruptImageError(
                f"image {path} of sample {sample_id!r} is truncated or corrupt ({exc}); rerun the "
                "generate stage, which deletes and regenerates it"
            ) from exc

    def consolidate(self) -> tuple[Path, Path]:
        """Write root/samples.csv and root/stats.csv (sorted by sample_id) from the records."""
        self.ensure_writable()
        records = self._complete_records()  # read once: both tables describe the same samples
        samples_path, stats_path = self.root / "samples.csv", self.root / "stats.csv"
        write_atomic(samples_path, _records_frame(records).to_csv(index=False).encode("utf-8"))
        write_atomic(stats_path, _stats_frame(records).to_csv(index=False).encode("utf-8"))
        log.info("%s: consolidated %d samples into %s", self, len(records), samples_path.name)
        return samples_path, stats_path

    def _incomplete_reason(self, spec: SampleSpec) -> str | None:
        """Why `spec` is not complete, or None when it is."""
        record = self._read_record(spec.sample_id)
        image = self.image_path(spec.sample_id)
        if record is None:
            return "image without record" if image.exists() else "not generated"
        _check_matches(self.root, record, spec)
        if not self._leads_to(record.get("path"), image):
            return (f"its record {self.record_path(spec.sample_id)} gives path {record.get('path')!r}, "
                    f"which does not lead to its image {image.relative_to(self.root)}")
        if not image.is_file():
            return "record without image"
        if image.stat().st_size != record["png_bytes"]:
            return f"image has {image.stat().st_size} bytes, expected {record['png_bytes']}"
        try:
            with Image.open(image) as handle:
                handle.verify()
        except _PIL_ERRORS as exc:
            return f"image is corrupt: {exc}"
        return None

    def _leads_to(self, path: object, image: Path) -> bool:
        """Whether a record's `path` (relative to root) names the file `image`: the evaluators read
        the image through the record, so a record pointing elsewhere is not a complete sample."""
        if not isinstance(path, str) or not path:
            return False
        return os.path.normpath(self.root / path) == os.path.normpath(image)

    def _read_record(self, sample_id: str) -> dict[str, Any] | None:
        """The parsed record of `sample_id`, or None when it is missing or unreadable."""
        path = self.record_path(sample_id)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("record %s is unreadable (%s); sample counts as not generated", path, exc)
            return None
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
            log.warning("record %s has an unknown format; sample counts as not generated", path)
            return None
        return record

    def _complete_records(self) -> list[dict[str, Any]]:
        """Records whose PNG exists with the recorded size, sorted by sample_id (no decoding)."""
        if not self.records_dir.is_dir():
            return []
        records = []
        for path in self.records_dir.glob("*.json"):
            if path.name.startswith(".") or (self.only is not None and path.stem not in self.only):
                continue
            record = self._read_record(path.stem)
            if record is None:
                continue
            image = self.image_path(path.stem)
            if (not self._leads_to(record.get("path"), image) or not image.is_file()
                    or image.stat().st_size != record["png_bytes"]):
                log.warning("sample %s has no complete image at %s; skipping it", path.stem, image)
                continue
            records.append(record)
        return sorted(records, key=lambda r: r["sample_id"])

    def _remove_temp_files(self, sample_ids: set[str]) -> None:
        """Delete temporary files that killed writers of `sample_ids` left behind."""
        for folder in (self.images_dir, self.records_dir):
            for name in os.listdir(folder):
                # Temporary names are ".<sample_id>.<ext>.<hex>.tmp"; sample ids contain no ".".
                owner = name[1:].split(".", 1)[0]
                if name.startswith(".") and name.endswith(".tmp") and owner in sample_ids:
                    (folder / name).unlink(missing_ok=True)


def _checked_id(sample_id: str) -> str:
    """`sample_id` if it names a file inside the SampleSet, else ValueError."""
    if not sample_id or sample_id.startswith(".") or "/" in sample_id or "\\" in sample_id:
        raise ValueError(f"invalid sample id {sample_id!r}; sample ids come from samples.plan")
    return sample_id


def _check_unique(specs: Sequence[SampleSpec]) -> None:
    """Raise ValueError when two specs share a sample id."""
    duplicated = _duplicates(spec.sample_id for spec in specs)
    if duplicated:
        raise ValueError(f"duplicate sample ids in the plan: {duplicated[:20]}")


def _duplicates(ids: Iterable[str]) -> list[str]:
    """Sorted ids that occur more than once."""
    return sorted(key for key, count in Counter(ids).items() if count > 1)


def _check_matches(root: Path, record: dict[str, Any], spec: SampleSpec) -> None:
    """Raise SampleMismatchError when a stored record belongs to another configuration."""
    expected = {"prompt_id": spec.prompt.id, "prompt": spec.prompt.text,
                "image_index": spec.image_index, "seed": spec.seed}
    diffs = [
        f"{key}: stored {record.get(key)!r}, planned {value!r}"
        for key, value in expected.items() if record.get(key) != value
    ]
    if diffs:
        raise SampleMismatchError(
            f"sample {spec.sample_id} in {root} was generated for another configuration "
            f"({'; '.join(diffs)}). Use a fresh output directory, or the seed and dataset "
            "settings of the original run."
        )


def _clean_stats(sample_id: str, stats: dict[str, Any]) -> dict[str, Any]:
    """Stats as JSON scalars: NumPy / torch 0-d values become Python numbers."""
    clean: dict[str, Any] = {}
    for key, value in stats.items():
        if key == "sample_id":
            raise ValueError(f"stats of {sample_id} must not contain 'sample_id' (the key column)")
        if hasattr(value, "item") and not isinstance(value, (str, bytes)):
            try:
                value = value.item()
            except (ValueError, RuntimeError) as exc:
                raise TypeError(f"stats[{key!r}] of {sample_id} is not a scalar: {exc}") from exc
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise TypeError(
                f"stats[{key!r}] of {sample_id} must be a str, int, float, bool or None, got "
                f"{type(value).__name__}; write lists as space-separated strings (as_row())"
            )
        clean[key] = value
    return clean


def _records_frame(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The samples table (RECORD_COLUMNS) of `records`."""
    rows = [
        {**{key: record[key] for key in RECORD_COLUMNS if key != "meta"},
         "meta": json.dumps(record["meta"], sort_keys=True, ensure_ascii=False)}
        for record in records
    ]
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS))


def _stats_frame(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The stats table (sample_id + stats columns) of `records`."""
    rows = [{"sample_id": record["sample_id"], **record["stats"]} for record in records]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["sample_id"])
