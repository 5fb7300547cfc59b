"""A SampleSet's binding: what made its images, and when a stored binding still describes a run.

`sample_binding` is what a decoder's SampleSet is bound to (binding.json): the model config and
weights digest, the decoder's config, sampling, seed, engine and device type.

Two bindings are equal when their JSON forms are. Decoders gain options over time (an acceptance
rule's `below`, `confident`, ...), and a set stored before an option existed has no entry for it,
while a run today binds the option's value. Comparing the raw forms would refuse every such set,
and on a real model that throws away hours of GPU time for images the new code would draw the same
way.

So bindings are compared without their *defaulted* leaves: a key of a config node with a
`_target_` whose value equals the default of that parameter in the target's signature (for
`PooledThresholdRule(..., below: int = 0)`, `below: 0`). A set made before `below` existed and one
made today with `below: 0` compare equal; one made with `below: 1` does not. This rests on one
convention, stated in docs/extending.md: **a new option's default reproduces the decoder as it was
before the option existed.** An option with no default, a node whose target cannot be imported, or a
value other than the default always takes part in the comparison.

Comparison reads `_target_` paths under the current layout (harness/moved.py), so a set bound before
a module moved is still recognised. To read a signature the target is imported, and only a target
within the project's packages (harness, baselines, evaluators) or a package the run itself
instantiates is: a stored binding.json cannot make the harness import code of its choosing.
"""
from __future__ import annotations

import functools
import inspect
import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from harness.api import INFO_KEYS, InputError
from harness.moved import TARGET, canonical

log = logging.getLogger(__name__)

BINDING_FILE = "binding.json"
BINDING_FORMAT = 1
PROJECT_PACKAGES = frozenset({"harness", "baselines", "evaluators"})
# Model config keys that say where or how weights are loaded, not which weights: left out of a
# SampleSet's binding (the weights themselves are bound by their digest).
_LOCATION_KEYS = frozenset({"sampling", "device", "cache_dir", "local_dir", "local_path", "small_drafter_local_dir",
                            "trust_pickle", "name"})
# Informational keys of the model and decoder nodes (harness.api.INFO_KEYS: what a model lacks, what a
# decoder requires, a decoder's paper setting, the model's operating points for decoders, which reach
# the binding through the decoders' own keys): no image depends on them, so bindings leave them out
# and comparisons ignore them in sets stored before they were left out.
_INFO_KEYS = frozenset(INFO_KEYS)
SAMPLING_TARGET = "harness.api.SamplingParams"  # what the run's `sampling` node instantiates
ABSENT = object()  # dotted()'s answer for a key a tree does not have
_trusted: frozenset[str] = PROJECT_PACKAGES


class BindingMismatchError(InputError, ValueError):
    """A SampleSet holds samples made under another configuration than the one asking to add to it,
    or than the one a run labels its rows with."""


def sample_binding(cfg: DictConfig, decoder: str, weights: str, device: torch.device) -> dict[str, Any]:
    """What a decoder's SampleSet is bound to: the model (config and weights digest), the decoder
    configuration, sampling, seed, engine and device type. Timing-only keys (batch size, warm-up,
    threads) and where the weights are read from are left out, so a resumed or sharded run with
    other timing settings shares the set."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    return {
        "format": BINDING_FORMAT,
        "model": {"name": cfg.model.get("name", "model"),
                  **_without(resolved["model"], _LOCATION_KEYS | _INFO_KEYS)},
        "weights": weights,
        "decoder": {"name": decoder, **_top_without(resolved["decoder"][decoder], _INFO_KEYS)},
        "sampling": _without(resolved["sampling"], frozenset({TARGET})),
        "seed": cfg.seed,
        "engine": str(cfg.get("engine") or "eager"),
        "device": device.type,
    }


def _without(tree: Any, keys: frozenset[str]) -> Any:
    """`tree` with every dict key in `keys` removed, at any depth."""
    if isinstance(tree, dict):
        return {k: _without(v, keys) for k, v in tree.items() if k not in keys}
    return tree


def _top_without(node: Any, keys: frozenset[str]) -> Any:
    """A config node (dict) without its top-level keys in `keys`."""
    return {k: v for k, v in node.items() if k not in keys} if isinstance(node, dict) else node


def trust_targets_of(cfg: Any) -> None:
    """Allow signature reads of the packages whose targets the run's own config (`cfg`, a plain or
    OmegaConf tree) instantiates, besides the project's: a user's rule from a config folder on the
    search path is compared by its defaults too."""
    global _trusted
    plain = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    _trusted = PROJECT_PACKAGES | frozenset(path.split(".")[0] for path in _targets(plain))


def _targets(tree: Any) -> Iterable[str]:
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == TARGET and isinstance(value, str):
                yield value
            else:
                yield from _targets(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _targets(item)


def compared(tree: Any) -> Any:
    """The view of a binding that bindings are compared in: targets under the current layout,
    options at their defaults left out (also the run's sampling keys, stored without their target:
    a set bound before `sampling.filter_order` existed matches the default order)."""
    view = without_defaults(canonical(tree))
    if isinstance(view, dict):
        for part in ("model", "decoder"):
            if part in view:
                view[part] = _top_without(view[part], _INFO_KEYS)
    sampling = view.get("sampling") if isinstance(view, dict) else None
    if isinstance(sampling, dict):
        view["sampling"] = without_defaults({TARGET: SAMPLING_TARGET, **sampling})
        view["sampling"].pop(TARGET)
    return view


def without_defaults(tree: Any) -> Any:
    """`tree` (a binding or any part of it) with every key of a `_target_` node removed whose value
    equals that parameter's default in the target's signature, at any depth."""
    if isinstance(tree, list):
        return [without_defaults(item) for item in tree]
    if not isinstance(tree, dict):
        return tree
    target = tree.get(TARGET)
    defaults = signature_defaults(target, _trusted) if isinstance(target, str) else {}
    return {key: without_defaults(value) for key, value in tree.items()
            if not (key in defaults and _json(value) == defaults[key])}


@functools.lru_cache(maxsize=256)
def signature_defaults(target: str, trusted: frozenset[str] = PROJECT_PACKAGES) -> dict[str, Any]:
    """{parameter: default in JSON form} of the callable `target` names (dotted path); {} when it
    cannot be imported or introspected, or lies outside the `trusted` top-level packages (then it is
    never imported). Cached: read it, never write it."""
    if target.split(".")[0] not in trusted:
        return {}
    try:
        params = inspect.signature(get_object(target)).parameters.values()
    except (ImportError, AttributeError, ValueError, TypeError):  # unknown or not introspectable
        return {}
    found = {}
    for param in params:
        if param.default is inspect.Parameter.empty:
            continue
        try:
            found[param.name] = _json(param.default)
        except TypeError:  # a default with no JSON form never matches a bound value
            continue
    return found


def _json(value: Any) -> Any:
    """`value` as it reads back from a binding file (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value, sort_keys=True))


def differing_keys(stored: dict[str, Any] | None, wanted: dict[str, Any],
                   view: Callable[[Any], Any] | None = None) -> list[str]:
    """The dotted leaf keys whose values differ between two bindings (in the views `view` makes of
    both, when given)."""
    see = view or (lambda tree: tree)
    old, new = leaves(see(stored or {})), leaves(see(wanted))
    return [key for key in sorted(old.keys() | new.keys()) if old.get(key, ABSENT) != new.get(key, ABSENT)]


def binding_differences(stored: dict[str, Any] | None, wanted: dict[str, Any],
                        view: Callable[[Any], Any] | None = None) -> list[str]:
    """'key: stored X, now Y' for every differing key (`differing_keys`; the values shown are the
    bindings' own)."""
    return _described(stored, wanted, differing_keys(stored, wanted, view))


def _described(stored: dict[str, Any] | None, wanted: dict[str, Any], keys: list[str]) -> list[str]:
    old, new = leaves(stored or {}), leaves(wanted)
    return [f"{key}: stored {old.get(key, '<absent>')!r}, now {new.get(key, '<absent>')!r}" for key in keys]


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts into {"a.b.c": leaf}; lists are leaves."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def refusal(root: Path, stored: dict[str, Any] | None, wanted: dict[str, Any],
            view: Callable[[Any], Any] | None = None) -> str:
    """The refusal of a generate stage into a set made under another configuration."""
    if stored is None:
        what = f"holds samples but no {BINDING_FILE}, so what made them is unknown"
    else:
        diffs = binding_differences(stored, wanted, view)
        shown = "; ".join(diffs[:8]) + (f"; and {len(diffs) - 8} more" if len(diffs) > 8 else "")
        what = f"was generated under another configuration ({shown})"
    return (f"sample set {root} {what}. Its images would be reused as if this run had made them. "
            "Either write into a fresh directory (a new hydra.run.dir, or samples_dir=<new folder>), "
            "or rerun with overwrite_samples=true to delete its samples and generate them again.")


STORED_PARTS = ("decoder", "sampling", "seed", "model", "engine")  # what a set's images depend on


def check_stored(cfg: DictConfig, decoder: str, root: Path, stored: dict[str, Any] | None) -> None:
    """Before an evaluate-only run scores a stored set. The rows describe what the set holds, and
    each row is labelled with the job's values of `swept_keys`: refuse a swept key that describes
    the decoder's images (sampling, seed, model, engine, its own options) where the set was made
    with another value, or where the set has no binding to check it against (`_check_unbound`);
    warn about every other difference between the set's binding and this job's (run.json records
    the stored binding under sample_sets)."""
    keys = [str(k) for k in cfg.get("swept_keys") or [] if _binding_key(str(k), decoder) is not None]
    if stored is None:
        _check_unbound(decoder, root, keys)
        return
    now = sample_binding(cfg, decoder, str(stored.get("weights", "")), torch.device(str(stored.get("device", "cpu"))))
    old, new = {k: stored.get(k) for k in STORED_PARTS}, {k: now[k] for k in STORED_PARTS}
    differ = differing_keys(old, new, compared)
    for key in keys:
        bound_as = str(_binding_key(key, decoder))
        hit = [d for d in differ if d == bound_as or d.startswith(f"{bound_as}.")]  # a swept node covers its leaves
        if not hit:
            continue
        value = dotted(stored, bound_as)
        fix = (f"set {key}={_override(value)} (the stored value)" if value is not ABSENT
               else f"set {key} to its default (the set was made before the option existed)")
        label = f"{key}={_override(OmegaConf.select(cfg, key))}"
        raise BindingMismatchError(
            f"swept_keys labels the rows of {decoder} with {label}, but the samples in {root} were made "
            f"with another value ({'; '.join(_described(old, new, hit)[:3])}; {root / BINDING_FILE}): the "
            f"rows would carry a value their images were not made with. To re-score these images, {fix}; "
            "to score that value, generate its samples (stages=[generate,evaluate] with a fresh samples_dir)")
    if differ:
        log.warning("[%s] the samples were made under another configuration than this job's (%s); "
                    "the rows describe the stored samples (their binding is in run.json)",
                    decoder, "; ".join(_described(old, new, differ)[:5]))


def _check_unbound(decoder: str, root: Path, keys: list[str]) -> None:
    """A set without binding.json: what made it is unknown. Refuse swept `keys` that would label
    its images with values nothing can check; otherwise warn, naming the folder."""
    if keys:
        raise BindingMismatchError(
            f"swept_keys labels the rows of {decoder} with {', '.join(keys)}, but the samples in {root} "
            f"have no {BINDING_FILE} (made before bindings existed, or the file was removed): what made "
            "them is unknown, so the labels cannot be checked. Regenerate the set so it is bound "
            f"(stages=[generate,evaluate] samples_dir={root.parent} overwrite_samples=true), or score "
            "it without those labels (swept_keys=[])")
    log.warning("[%s] the samples in %s have no %s (made before bindings existed, or the file was "
                "removed): the configuration that made them cannot be checked against this job's, and "
                "the rows describe whatever the set holds. Regenerate it with overwrite_samples=true to "
                "bind it", decoder, root, BINDING_FILE)


def _binding_key(key: str, decoder: str) -> str | None:
    """The dotted key under which config key `key` is bound in `decoder`'s SampleSet binding
    (sample_binding), or None when it does not describe that decoder's images (another decoder's
    options, timing, where weights are read from)."""
    head, _, rest = key.partition(".")
    if head == "decoder":
        name, _, option = rest.partition(".")
        return f"decoder.{option}" if name == decoder and option else None
    if head == "model":
        return key if rest and not set(rest.split(".")) & _LOCATION_KEYS else None
    return key if head == "sampling" or key in ("seed", "engine") else None


def dotted(tree: Any, key: str) -> Any:
    """The value at dotted `key` of nested dicts, or ABSENT."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return ABSENT
        tree = tree[part]
    return tree


def _override(value: Any) -> str:
    """`value` as written in a command-line override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
