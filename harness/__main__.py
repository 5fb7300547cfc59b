"""`python -m harness [+experiment=NAME] [overrides]`: run one Hydra job (or a sweep with -m).

Installed as the console script `mulo-bench`. The configs come from `harness/conf` inside an
installed wheel (the build maps the repository's `conf/` there, see pyproject.toml) or from the
clone's `conf/` in an editable install or a checkout, so the command runs from any directory.
Users add config groups and experiments of their own with `hydra.searchpath=[file:///my/configs]`
(docs/install.md); a search-path folder that does not exist is named in the error.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path
from typing import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

_PACKAGE = Path(__file__).resolve().parent
# Where the primary config may lie, first match wins: the copy inside an installed wheel, then the
# repository's conf/ beside the package (editable install, PYTHONPATH=clone).
CONFIG_CANDIDATES = (_PACKAGE / "conf", _PACKAGE.parent / "conf")
CONFIG_NAME = "config"


def config_dir() -> Path:
    """The folder holding `config.yaml` and the config groups (model/, decoder/, experiment/, ...)."""
    for candidate in CONFIG_CANDIDATES:
        if (candidate / f"{CONFIG_NAME}.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        "mulo-bench's configs are missing: none of "
        + ", ".join(str(c / f"{CONFIG_NAME}.yaml") for c in CONFIG_CANDIDATES)
        + " exists. Reinstall the package (pip install mulo-bench / pip install .) or run from a clone."
    )


def missing_search_paths(argv: Sequence[str]) -> list[str]:
    """The `hydra.searchpath` entries on the command line whose folder (file://) or package (pkg://)
    does not exist, each as "entry (what is missing)". Hydra itself only warns about them and then
    fails to find the config they were meant to provide."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    entries: list[str] = []
    for arg in argv:
        if not arg.lstrip("+").startswith("hydra.searchpath="):
            continue
        try:
            value = OverridesParser.create().parse_overrides([arg])[0].value()
        except OverrideParseException:
            continue  # Hydra reports the malformed override itself
        entries.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    missing = []
    for entry in entries:
        scheme, sep, rest = entry.partition("://")
        if not sep:  # Hydra reads a bare path as a file path
            scheme, rest = "file", entry
        if scheme == "file":
            folder = Path(rest).expanduser()
            if not folder.is_dir():
                missing.append(f"{entry} (no folder {folder.absolute()})")
        elif scheme == "pkg":
            try:
                found = importlib.util.find_spec(rest) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                missing.append(f"{entry} (no importable package {rest!r})")
    return missing


def _config_path() -> str:
    try:
        return str(config_dir())
    except FileNotFoundError:
        return str(CONFIG_CANDIDATES[0])  # main() names every candidate before Hydra would fail


@hydra.main(config_path=_config_path(), config_name=CONFIG_NAME, version_base="1.3")
def _hydra_app(cfg: DictConfig) -> None:
    from harness.cli import report_errors  # deferred: argument errors above come before torch's import
    from harness.run import EvaluationFailedError, run

    logging.getLogger("harness").setLevel(logging.INFO)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    report_errors(lambda: run(cfg, out_dir), failed=(EvaluationFailedError,))


def main() -> None:
    """Console script `mulo-bench` and `python -m harness`: Hydra's command line."""
    missing = missing_search_paths(sys.argv[1:])
    if missing:
        sys.stderr.write("mulo-bench: hydra.searchpath names a config folder that does not exist:\n"
                         + "".join(f"  {m}\n" for m in missing))
        raise SystemExit(2)
    try:
        config_dir()
    except FileNotFoundError as err:  # a clear message instead of Hydra's
        sys.stderr.write(f"mulo-bench: {err}\n")
        raise SystemExit(2) from None
    from harness.cli import check_overrides

    check_overrides(sys.argv[1:], __file__, _config_path())  # unknown group options, run directory
    _hydra_app()


if __name__ == "__main__":
    main()
