"""What an in-process evaluator imports, checked before anything is generated (the evaluators'
`check()`, called by harness/run.py): a missing package stops the job naming it and the fix, not
the evaluate loop hours later."""
from __future__ import annotations

import importlib.util
from typing import Sequence

from harness.api import InputError


class MissingDependencyError(InputError, ImportError):
    """A package an evaluator imports is not installed; the message names it and the fix."""


def require_modules(who: str, modules: Sequence[str], fix: str) -> None:
    """MissingDependencyError naming the `modules` that cannot be imported here, unless all can.

    Args:
        who: the evaluator or backend, e.g. "evaluator geneval (detector mmdet)".
        fix: what to do instead, e.g. the command that installs them or the evaluator to use.
    """
    missing = [name for name in modules if _absent(name)]
    if missing:
        raise MissingDependencyError(f"{who} imports {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                                     f"not installed here; {fix}")


def _absent(name: str) -> bool:
    """Whether module `name` cannot be found (a parent that fails to import counts as absent)."""
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True
