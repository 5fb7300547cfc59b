"""Loaded by Python at start-up when this folder is on PYTHONPATH (the rehearsal's harness runs):
registers tiny open_clip architectures under the names the evaluators use (ViT-L-14 for GenEval's
colour classifier and CLIP score, ViT-H-14 for HPSv2), so that the stand-in weight files the local
hub serves under the official repo ids load strictly; and, where $REHEARSAL_STANDIN_PINS names the
stand-ins' hashes (tests/rehearsal/standins.py), checks the stand-in files the mirror serves for
pinned URLs (GenEval's detector, val2017.zip) against those instead of the real files' pins."""
from __future__ import annotations

import copy
import json
import os

TINY = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 224, "layers": 1, "width": 32, "head_width": 16, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def register() -> None:
    """Replace open_clip's ViT-L-14 and ViT-H-14 configs by TINY (in this process)."""
    from open_clip import factory

    for name in ("ViT-L-14", "ViT-H-14"):
        factory._MODEL_CONFIGS[name] = copy.deepcopy(TINY)


def _tiny_configs(module) -> None:  # noqa: ANN001
    for key in ("ViT-L-14", "ViT-H-14"):
        module._MODEL_CONFIGS[key] = copy.deepcopy(TINY)


def _standin_pins(module) -> None:  # noqa: ANN001
    """harness.datasets.downloads.mismatch with the stand-ins' sha256 for the URLs they replace."""
    with open(os.environ["REHEARSAL_STANDIN_PINS"], encoding="utf-8") as handle:
        pins = json.load(handle)
    original = module.mismatch

    def mismatch(path, pinned):  # noqa: ANN001
        if pinned.url in pins:
            found = module.sha256_file(path)
            return None if found == pins[pinned.url] else f"sha256 {found}"
        return original(path, pinned)

    module.mismatch = mismatch


def _patch_on_import(patches: dict) -> None:
    """Apply each patch as soon as its module is imported (importing them here would slow every start-up)."""
    import importlib.abc
    import importlib.util
    import sys

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # noqa: ANN001 - the import system's signature
            if name not in patches:
                return None
            patch = patches.pop(name)
            if not patches:
                sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            loader = spec.loader
            original = loader.exec_module

            def exec_module(module):  # noqa: ANN001
                original(module)
                patch(module)

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Hook())


_patch_on_import({"open_clip.factory": _tiny_configs,
                  **({"harness.datasets.downloads": _standin_pins} if os.environ.get("REHEARSAL_STANDIN_PINS") else {})})
