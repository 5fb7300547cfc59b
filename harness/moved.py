"""Import paths that moved, honoured for one release where a config or a stored binding names them.

The layout of `harness/` and `baselines/` changed (docs/layout.md): modules went into `runtime/`,
`store/`, model family folders and `baselines/framework|methods|training/`. A user's config whose
`_target_` names an old path (`baselines.speculative.SpeculativeDecoder`) still runs: `current`
rewrites the path and the run logs a FutureWarning naming the old and new path once per path. A
SampleSet bound under an old path is compared under its current one (harness/store/binding.py), so
sets made before the move are resumed. Python imports of the old modules are not redirected.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

log = logging.getLogger(__name__)

TARGET = "_target_"
_FRAMEWORK = ("canvas", "recorder", "drafts", "acceptance", "scope", "speculative", "neighbours", "draft_tree")
_METHODS = ("raster", "zipar", "eagle", "tree_decoding", "lowres", "upsamplers", "latent_upsampler", "pooled",
            "local", "islands", "resampling")
# old module -> new module
MOVED: dict[str, str] = {
    **{f"harness.{m}": f"harness.runtime.{m}" for m in ("engine", "hostsync", "randomness", "sampling", "seeding")},
    **{f"harness.{m}": f"harness.store.{m}" for m in ("samples", "binding", "provenance")},
    "harness.results": "harness.store.summary",
    "harness.models.llamagen": "harness.models.llamagen.bundle",
    "harness.models.t5_captions": "harness.models.llamagen.t5_captions",
    "harness.models.tar": "harness.models.tar.bundle",
    "harness.models.tar_llm": "harness.models.tar.llm",
    "harness.models.tatok": "harness.models.tar.tatok",
    "harness.models.random_init": "harness.models.random.bundle",
    "harness.models.patch_tokenizer": "harness.models.random.patch_tokenizer",
    **{f"baselines.{m}": f"baselines.framework.{m}" for m in _FRAMEWORK},
    **{f"baselines.{m}": f"baselines.methods.{m}" for m in _METHODS},
    **{f"baselines.{m}": f"baselines.training.{m}" for m in ("train_eagle", "train_upsampler")},
}
_warned: set[str] = set()


def current(path: str) -> str:
    """`path` (a dotted `module.attribute`) under the current layout: the old module part replaced by
    its new one, or `path` itself when nothing moved. `harness.models.tar.build` is the old Tar
    loader, not the package `harness.models.tar`: only a path's module part (all but its last name)
    is looked up."""
    module, _, name = path.rpartition(".")
    new = MOVED.get(module)
    return f"{new}.{name}" if new and name else path


def canonical(tree: Any) -> Any:
    """`tree` (a plain config or binding) with every `_target_` under the current layout."""
    if isinstance(tree, list):
        return [canonical(item) for item in tree]
    if not isinstance(tree, dict):
        return tree
    return {key: current(value) if key == TARGET and isinstance(value, str) else canonical(value)
            for key, value in tree.items()}


def updated(node: Any, where: str = "") -> None:
    """Rewrite, in place, every old `_target_` of an OmegaConf node (a run's composed config), with a
    FutureWarning per old path naming the config key, the old and the new path."""
    from omegaconf import DictConfig, ListConfig  # local: keep this module free of heavy imports

    if isinstance(node, DictConfig):
        items = [(str(k), node._get_node(k)) for k in node.keys()]
    elif isinstance(node, ListConfig):
        items = [(str(i), node._get_node(i)) for i in range(len(node))]
    else:
        return
    for key, child in items:
        full = f"{where}.{key}" if where else key
        if key == TARGET and isinstance(node, DictConfig) and not child._is_interpolation():
            old = node[key]
            if isinstance(old, str) and current(old) != old:
                _check_exists(full, old, current(old))
                node[key] = current(old)
                _warn(full, old, current(old))
        elif isinstance(child, (DictConfig, ListConfig)):
            updated(child, full)


def _check_exists(key: str, old: str, new: str) -> None:
    """ConfigValueError when the moved module has no attribute of that name: the config names a
    class that exists under neither path, and neither a "moved" warning nor an error naming the new
    path (which the user never wrote) would say so."""
    import importlib

    from harness.api import ConfigValueError  # local: keep this module free of heavy imports

    module, _, name = new.rpartition(".")
    try:
        found = importlib.import_module(module)
    except ImportError:  # a module that does not import here fails at instantiation with its own error
        return
    if not hasattr(found, name):
        old_module = old.rpartition(".")[0]
        raise ConfigValueError(f"{key}={old}: module {old_module} (now {module}) has no {name!r}; check the "
                               f"class name and write its current path, {module}.<name> (docs/extending.md, "
                               "'Moved paths')")


def _warn(key: str, old: str, new: str) -> None:
    if old in _warned:
        return
    _warned.add(old)
    message = (f"{key}: {old} moved to {new}; the old path works in this release only, "
               f"update the config (docs/extending.md, 'Moved paths')")
    warnings.warn(message, FutureWarning, stacklevel=3)
    log.warning(message)
