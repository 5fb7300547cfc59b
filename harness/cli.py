"""The command line around the Hydra app: checks Hydra cannot explain well, made before it
composes anything, and the reporting of input errors.

Hydra lists the options of a single-choice group (`model=nope`) but not of a multi-select one
(`decoder=[rastr]`), and a run directory it cannot create fails inside its logging set-up with a
traceback. Both are caught here first. An `InputError` raised by the run (a bad config value, file
or folder) is printed as one line without a traceback, and the process exits with status 2.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from hydra._internal.config_repository import ConfigRepository
from hydra._internal.utils import compute_search_path_dir, create_config_search_path
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from harness.api import InputError

log = logging.getLogger(__name__)

EXIT_INPUT_ERROR = 2
EXIT_FAILED = 1
CHECKED_GROUPS = ("model", "decoder", "dataset", "evaluator", "protocol")
DEFAULT_RUN_DIR = "results"


def fail(message: str, status: int = EXIT_INPUT_ERROR) -> None:
    """Print `error: message` to stderr and exit with `status`."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(status)


def input_error_of(err: BaseException) -> InputError | None:
    """The InputError that caused `err` (Hydra wraps errors of instantiated targets), or None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, InputError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def report_errors(task: Callable[[], object], failed: tuple[type[BaseException], ...] = ()) -> None:
    """Run `task`; an InputError anywhere in the cause chain exits 2 with its message, an error of
    a type in `failed` exits 1 with its message; anything else propagates with its traceback."""
    try:
        task()
    except Exception as err:  # noqa: BLE001 - re-raised unless it is a reported kind
        cause = input_error_of(err)
        if cause is not None:
            fail(str(cause))
        if isinstance(err, failed):
            fail(str(err), EXIT_FAILED)
        raise


def check_overrides(argv: Sequence[str], calling_file: str, config_path: str) -> None:
    """Fail with a clear message for unknown options of the checked config groups, an empty
    decoder list, and a run directory that cannot be created. Only what is certain is refused:
    anything the parser does not understand is left to Hydra."""
    overrides = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return  # Hydra reports its own syntax errors
    extra_paths: list[str] = []
    for override in parsed:
        if override.key_or_group == "hydra.searchpath" and isinstance(override.value(), list):
            extra_paths = [str(v) for v in override.value()]
    repo = _repository(calling_file, config_path, extra_paths)
    for override in parsed:
        group = override.key_or_group
        if group not in CHECKED_GROUPS or override.package or override.is_delete():
            continue
        value = override.value()
        chosen = value if isinstance(value, list) else [value]
        if group == "decoder" and not chosen:
            fail("no decoder selected (decoder=[]): choose one or more, e.g. decoder=[raster,mulo_sd]")
        if repo is None or not all(isinstance(c, str) for c in chosen):
            continue
        options = repo.get_group_options(group)
        unknown = [c for c in chosen if c not in options]
        if unknown:
            fail(f"unknown {group} {', '.join(map(repr, unknown))}; available {group} options: "
                 f"{', '.join(sorted(options))}")
    _check_run_dir(parsed)


def _repository(calling_file: str, config_path: str, extra: list[str]) -> ConfigRepository | None:
    """Hydra's view of the config groups (its search path, plugins and `hydra.searchpath`)."""
    try:
        search_path = create_config_search_path(compute_search_path_dir(calling_file, None, config_path))
        for entry in extra:
            search_path.append("user", entry)
        return ConfigRepository(search_path)
    except (HydraException, OSError, ValueError) as err:
        log.debug("config groups not checked: %s", err)
        return None


def _check_run_dir(parsed: list) -> None:
    """The run directory (hydra.run.dir, else results/ here) must be creatable: its nearest
    existing ancestor is a writable folder."""
    given = [o.value() for o in parsed if o.key_or_group == "hydra.run.dir"]
    raw = str(given[-1]) if given and isinstance(given[-1], str) else DEFAULT_RUN_DIR
    literal = raw.split("${", 1)[0] or "."  # up to the first interpolation, e.g. ${now:...}
    folder = Path(literal).expanduser()
    ancestor = folder if folder.exists() else next((p for p in folder.parents if p.exists()), Path("."))
    if not ancestor.is_dir():
        fail(f"run directory {raw} cannot be created: {ancestor} is a file, not a folder; set "
             "hydra.run.dir to a writable folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        fail(f"run directory {raw} cannot be created: {ancestor} is not writable; set hydra.run.dir "
             "to a writable folder")
