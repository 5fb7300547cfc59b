"""Reference image sets for FID/KID: the 5,000 COCO val2017 images (folder or the official zip),
any image folder, or the shapes world's ground-truth renders of a SampleSet's own prompts.

A reference set is a `ReferenceSet`: a fingerprint (content identity, part of the statistics
cache key), a count and a loader of image i as uint8 [H, W, 3]. Nothing is decoded until asked.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PIL import Image

from harness.datasets.downloads import Pinned, fetch
from harness.store.samples import SampleSet

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
KINDS = ("coco_val2017", "folder", "shapes")
COCO_VAL2017_ZIP = Pinned(
    name="val2017.zip", url="http://images.cocodataset.org/zips/val2017.zip",
    md5="442b8da7639aecaf257c1dceb8ba8c80",  # the md5 the download scripts of COCO users publish
    what="COCO 2017 val images (5,000 JPEGs, about 780 MB)",
)  # no sha256 is published; the zip's member CRCs make up the fingerprint
COCO_VAL2017_IMAGES = 5000


@dataclass(frozen=True)
class ReferenceSet:
    """`count` reference images; `load(i)` -> uint8 [H, W, 3] RGB; `fingerprint` identifies the content."""

    name: str
    fingerprint: str
    count: int
    load: Callable[[int], np.ndarray]


def reference_set(kind: str, path: str | None, samples: SampleSet | None = None,
                  seed_offset: int = 1) -> ReferenceSet:
    """Build the reference set `kind` (see KINDS); `path` is a folder or zip (coco_val2017, folder)."""
    if kind == "coco_val2017":
        source = Path(path).expanduser() if path else fetch(COCO_VAL2017_ZIP)
        ref = zip_set("coco_val2017", source) if source.suffix == ".zip" else folder_set("coco_val2017", source)
        if ref.count != COCO_VAL2017_IMAGES:
            log.warning("COCO val2017 reference %s holds %d images, the protocol uses %d", source, ref.count,
                        COCO_VAL2017_IMAGES)
        return ref
    if kind == "folder":
        if not path:
            raise ValueError("fid reference=folder needs reference_path (a folder or .zip of images)")
        source = Path(path).expanduser()
        return zip_set("folder", source) if source.suffix == ".zip" else folder_set("folder", source)
    if kind == "shapes":
        if samples is None:
            raise ValueError("fid reference=shapes renders the SampleSet's own prompts; no SampleSet given")
        return shapes_set(samples, seed_offset)
    raise ValueError(f"fid reference must be one of {KINDS}, got {kind!r}")


def folder_set(name: str, folder: Path) -> ReferenceSet:
    """Every png/jpg/jpeg directly in `folder`, sorted by name."""
    if not folder.is_dir():
        raise FileNotFoundError(f"FID reference folder {folder} does not exist; for COCO, unzip val2017.zip from "
                                "cocodataset.org there, or give the zip itself, or leave reference_path unset to "
                                "download it")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"FID reference folder {folder} holds no {IMAGE_SUFFIXES} images")
    listing = "\n".join(f"{p.name}:{p.stat().st_size}" for p in files)
    return ReferenceSet(name, _digest(listing), len(files), lambda i: _decode_file(files[i]))


def zip_set(name: str, archive: Path) -> ReferenceSet:
    """Every png/jpg/jpeg member of a zip, sorted by member name (fingerprint: names + CRC32s)."""
    if not archive.is_file():
        raise FileNotFoundError(f"FID reference archive {archive} does not exist")
    with zipfile.ZipFile(archive) as handle:
        members = sorted((m for m in handle.infolist() if m.filename.lower().endswith(IMAGE_SUFFIXES)),
                         key=lambda m: m.filename)
    if not members:
        raise FileNotFoundError(f"FID reference archive {archive} holds no {IMAGE_SUFFIXES} images")
    listing = "\n".join(f"{m.filename}:{m.CRC}:{m.file_size}" for m in members)
    names = [m.filename for m in members]
    state: dict[str, zipfile.ZipFile] = {}

    def load(i: int) -> np.ndarray:
        handle = state.setdefault("zip", zipfile.ZipFile(archive))
        return _decode_bytes(handle.read(names[i]), f"{archive}:{names[i]}")

    return ReferenceSet(name, _digest(listing), len(members), load)


def ground_truth(meta: dict[str, Any], seed: int, seed_offset: int, size: int) -> np.ndarray:
    """The ground-truth scene of a shapes sample (its record's meta and image seed) as uint8
    [size, size, 3]: scene_for_caption drawn with the generator seeded by (seed, seed_offset)."""
    from harness.shapes.scenes import render, scene_for_caption

    return render(scene_for_caption(meta, np.random.default_rng([seed, seed_offset])), size)


def shapes_set(samples: SampleSet, seed_offset: int = 1) -> ReferenceSet:
    """Ground-truth renders of each sample's prompt (scene_for_caption, seeded by (seed, seed_offset)),
    at the size of the SampleSet's first image."""
    records = samples.records()
    if records.empty:
        raise ValueError(f"{samples} has no complete samples to build a shapes reference for")
    size = samples.load_image(records["sample_id"].iloc[0]).shape[0]
    metas = [json.loads(m) for m in records["meta"]]
    seeds = [int(s) for s in records["seed"]]
    for sample_id, meta in zip(records["sample_id"], metas):
        if "include" not in meta:
            raise ValueError(f"sample {sample_id} has no shapes-world metadata; fid reference=shapes needs "
                             "dataset=shapes")
    listing = json.dumps({"size": size, "offset": seed_offset, "scenes": list(zip(metas, seeds))}, sort_keys=True)

    def load(i: int) -> np.ndarray:
        return ground_truth(metas[i], seeds[i], seed_offset, size)

    return ReferenceSet(f"shapes_gt{size}", _digest(listing), len(records), load)


def _decode_file(path: Path) -> np.ndarray:
    try:
        with Image.open(path) as handle:
            return np.asarray(handle.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise OSError(f"FID reference image {path} cannot be decoded ({exc})") from exc


def _decode_bytes(data: bytes, where: str) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as handle:
            return np.asarray(handle.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise OSError(f"FID reference image {where} cannot be decoded ({exc})") from exc


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
