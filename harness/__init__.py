"""mulo-bench: a reproducible benchmark harness for accelerated autoregressive text-to-image
generation. Public contracts live in `harness.api`."""
from __future__ import annotations

import re as _re
import warnings as _warnings
from importlib import metadata as _metadata

# The torch range the project tests (pyproject.toml holds the same; docs/install.md says what ran
# at each end). Below it `import harness` fails; above it, it warns.
TORCH_SUPPORTED = ">=2.5.1,<2.15"
_TORCH_FLOOR = (2, 5, 1)
_TORCH_CEILING = (2, 15)


def check_torch_version(version: str) -> None:
    """Raise ImportError for a torch release below the tested range; warn above it. Versions that
    do not start with `major.minor` (unusual source builds) are let through."""
    found = _re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if found is None:
        return
    release = tuple(int(part or 0) for part in found.groups())
    if release < _TORCH_FLOOR:
        raise ImportError(
            f"mulo-bench supports torch {TORCH_SUPPORTED} (the tested range); this environment has "
            f"torch {version}. Install a supported build, e.g. pip install 'torch{TORCH_SUPPORTED}' "
            "(or the matching build for your CUDA from pytorch.org); see docs/install.md."
        )
    if release[:2] >= _TORCH_CEILING:
        _warnings.warn(f"mulo-bench is tested with torch {TORCH_SUPPORTED}; torch {version} is newer and "
                       "untested", stacklevel=2)


def _installed_torch() -> str | None:
    try:
        return _metadata.version("torch")
    except _metadata.PackageNotFoundError:
        return None  # modules that need torch fail on their own import


if (_torch := _installed_torch()) is not None:
    check_torch_version(_torch)
