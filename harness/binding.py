"""When a stored SampleSet's binding (harness/run.sample_binding) still describes this run.

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
"""
from __future__ import annotations

import functools
import inspect
import json
from typing import Any

from hydra.utils import get_object

TARGET = "_target_"


def without_defaults(tree: Any) -> Any:
    """`tree` (a binding or any part of it) with every key of a `_target_` node removed whose value
    equals that parameter's default in the target's signature, at any depth."""
    if isinstance(tree, list):
        return [without_defaults(item) for item in tree]
    if not isinstance(tree, dict):
        return tree
    defaults = signature_defaults(tree[TARGET]) if isinstance(tree.get(TARGET), str) else {}
    return {key: without_defaults(value) for key, value in tree.items()
            if not (key in defaults and _json(value) == defaults[key])}


@functools.lru_cache(maxsize=256)
def signature_defaults(target: str) -> dict[str, Any]:
    """{parameter: default in JSON form} of the callable `target` names (dotted path); {} when it
    cannot be imported or introspected. Cached: read it, never write it."""
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
