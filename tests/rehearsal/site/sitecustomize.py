"""Loaded by Python at start-up when this folder is on PYTHONPATH (the rehearsal's harness runs):
registers tiny open_clip architectures under the names the evaluators use (ViT-L-14 for GenEval's
colour classifier and CLIP score, ViT-H-14 for HPSv2), so that the stand-in weight files the local
hub serves under the official repo ids load strictly."""
from __future__ import annotations

import copy

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


def _register_on_import() -> None:
    """Register as soon as open_clip is imported (importing it here would slow every start-up)."""
    import importlib.abc
    import sys

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):  # noqa: ANN001 - the import system's signature
            if name == "open_clip.factory":
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                loader = spec.loader
                original = loader.exec_module

                def exec_module(module):  # noqa: ANN001
                    original(module)
                    for key in ("ViT-L-14", "ViT-H-14"):
                        module._MODEL_CONFIGS[key] = copy.deepcopy(TINY)

                loader.exec_module = exec_module
                return spec
            return None

    import importlib.util

    sys.meta_path.insert(0, Hook())


_register_on_import()
