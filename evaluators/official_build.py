"""Build the environment an official evaluator runs its scripts in:

    python -m evaluators.official_build geneval|dpg_bench [HOME]      # installed: mulo-bench-official-env

The recipe is `evaluators/official_envs/build.sh`, shipped inside the package beside the pinned
constraints files it installs under, so an install from a wheel builds what a clone builds. It clones
the official repository at its pinned commit into HOME/repo and creates the conda environment
HOME/env, where the official backends look by default (HOME: `$MULO_BENCH_CACHE/official/<name>`);
it needs git, conda and, for GenEval, a CUDA toolkit and TORCH_CUDA_ARCH_LIST (docs/evaluators.md,
"GenEval's environment" and "DPG-Bench's environment"). Rerunning it resumes.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from harness.api import ConfigValueError, InputError

log = logging.getLogger(__name__)

ENVIRONMENTS = ("geneval", "dpg_bench")  # the official evaluators' environments, as build.sh names them
RECIPE_DIR = Path(__file__).with_name("official_envs")
SCRIPT = RECIPE_DIR / "build.sh"
SCRIPT_NAME = "mulo-bench-official-env"  # the console script (pyproject.toml)


def command_line(name: str) -> str:
    """The command that builds environment `name`, as errors and docs quote it."""
    return f"python -m evaluators.official_build {name}"


def build_command(name: str, home: str | None = None) -> list[str]:
    """The argv that runs the recipe for environment `name` into `home` (None: the default folder).

    Raises:
        ConfigValueError: `name` is not one of ENVIRONMENTS.
        InputError: the recipe or bash is missing (a broken install).
    """
    if name not in ENVIRONMENTS:
        raise ConfigValueError(f"official_build: no environment {name!r}; give one of {list(ENVIRONMENTS)}, "
                               f"e.g. {command_line('geneval')}")
    for needed in (SCRIPT, RECIPE_DIR / f"{name}.constraints.txt"):
        if not needed.is_file():
            raise InputError(f"official_build: {needed} is missing from the installed package; reinstall the "
                             f"harness (pip install --force-reinstall mulo-bench, or pip install -e . in a clone)")
    bash = shutil.which("bash")
    if bash is None:
        raise InputError("official_build: the recipe is a bash script and no `bash` is on PATH; install bash")
    return [bash, str(SCRIPT), name, *([home] if home else [])]


def main(argv: Sequence[str] | None = None) -> int:
    prog = SCRIPT_NAME if sys.argv[0].endswith(SCRIPT_NAME) else "python -m evaluators.official_build"
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("name", help="the environment: " + " or ".join(ENVIRONMENTS))
    ap.add_argument("home", nargs="?", default=None,
                    help="the folder to build in (default: $MULO_BENCH_CACHE/official/<name>)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        command = build_command(args.name, args.home)
    except InputError as err:
        log.error("%s", err)
        return 2
    log.info("building %s with %s", args.name, SCRIPT)
    return subprocess.call(command)


if __name__ == "__main__":
    raise SystemExit(main())
