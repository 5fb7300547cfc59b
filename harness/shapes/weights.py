"""The shipped shapes-world weights: a manifest (sha256 of every file, training config, commit,
final losses) and hash-checked, strict loading."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from safetensors import safe_open

from harness.api import InputError
from harness.shapes.gpt import ShapesConfig, ShapesGPT

WEIGHTS_DIR = Path(__file__).parent / "weights"
# The shipped worlds: x1 (16x16 target, 8x8 drafter) and x2 (32x32 target whose drafter is x1's target).
WORLDS = {"x1": WEIGHTS_DIR, "x2": WEIGHTS_DIR.parent / "weights_x2"}
MANIFEST = "manifest.json"


class WeightsError(InputError, RuntimeError):
    """A weights file is missing, corrupt or does not match the manifest."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(folder: Path = WEIGHTS_DIR) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        raise WeightsError(f"no {MANIFEST} in {folder}: the shapes weights are not installed; "
                           "train them with `python -m harness.shapes.recipe --out DIR`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise WeightsError(f"weights manifest {path} is unreadable or corrupt ({err}); reinstall the "
                           "package or retrain with `python -m harness.shapes.recipe --out DIR`") from err
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise WeightsError(f"weights manifest {path} has no 'files' table; it is not a shapes weights "
                           "manifest (reinstall the package or retrain the weights)")
    return manifest


def write_manifest(folder: Path, files: list[str], info: dict[str, Any],
                   links: dict[str, str] | None = None) -> dict[str, Any]:
    """Hash `files` (names inside `folder`) and write the manifest atomically. `links` lists files
    kept in another folder: name -> path relative to `folder`, hashed like the others."""
    entries = {n: n for n in files} | dict(links or {})
    manifest = {"files": {n: {"sha256": sha256(folder / rel), "bytes": (folder / rel).stat().st_size}
                          | ({"path": rel} if rel != n else {}) for n, rel in entries.items()},
                **info}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def add_to_manifest(folder: Path, name: str, key: str, metrics: dict[str, Any],
                    recipe: dict[str, Any]) -> dict[str, Any]:
    """List file `name` of `folder` in its manifest (sha256 and size) with its training `metrics`
    and `recipe` under `key`, keeping every other entry (a weights file trained after the rest,
    e.g. the EAGLE head: python -m baselines.train_eagle --ship)."""
    manifest = read_manifest(folder)
    path = folder / name
    manifest["files"][name] = {"sha256": sha256(path), "bytes": path.stat().st_size}
    manifest.setdefault("metrics", {})[key] = metrics
    manifest.setdefault("recipe", {})[key] = recipe
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def verified(name: str, folder: Path = WEIGHTS_DIR) -> Path:
    """Path of weights file `name` after checking its sha256 against the manifest (a file the
    manifest links to another folder is read there)."""
    entry = read_manifest(folder)["files"].get(name)
    path = folder / (entry or {}).get("path", name)
    if entry is None:
        raise WeightsError(f"{path} is not listed in {folder / MANIFEST}")
    if not path.is_file():
        raise WeightsError(f"missing weights file {path} (expected sha256 {entry['sha256']})")
    actual = sha256(path)
    if actual != entry["sha256"]:
        raise WeightsError(f"weights file {path} is corrupt or was replaced: sha256 {actual}, "
                           f"expected {entry['sha256']}; restore it (git checkout) or retrain")
    return path


def load_gpt(path: Path, device: str = "cpu") -> ShapesGPT:
    """Rebuild a ShapesGPT from `train_gpt.save_gpt`'s safetensors; strict."""
    with safe_open(str(path), framework="pt", device=device) as f:
        meta = f.metadata() or {}
        if "config" not in meta:
            raise WeightsError(f"{path} has no 'config' metadata; not a shapes GPT file")
        state = {k: f.get_tensor(k) for k in f.keys()}
    cfg = json.loads(meta["config"])
    cfg["grid"] = tuple(cfg["grid"])
    gpt = ShapesGPT(ShapesConfig(**cfg))
    try:
        gpt.load_state_dict(state, strict=True)  # copies (and casts fp16 files) into fp32 parameters
    except RuntimeError as err:
        raise WeightsError(f"{path} does not match the GPT architecture in its metadata: {err}") from err
    return gpt.eval()
