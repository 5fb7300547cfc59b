"""`python -m evaluators.official_build`: the shipped recipe runs end to end against fake git and
conda (which record what they are asked), checks out the commit the evaluator's config pins and
installs under the constraints file shipped beside it; a wrong name stops with the choices."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from omegaconf import OmegaConf

from evaluators.official_build import ENVIRONMENTS, RECIPE_DIR, build_command, main
from harness.api import ConfigValueError, InputError
from tests.conftest import ROOT

# a fake git: `clone ... DIR` makes DIR a checkout; every call is recorded
FAKE_GIT = """#!/usr/bin/env bash
echo "git $*" >> "$FAKE_LOG"
if [ "$1" = clone ]; then mkdir -p "${@: -1}/.git"; fi
"""
# a fake conda: `... -p ENV ...` makes ENV/bin/python, a fake interpreter that records its arguments
FAKE_CONDA = """#!/usr/bin/env bash
echo "conda $*" >> "$FAKE_LOG"
while [ $# -gt 0 ]; do
  if [ "$1" = -p ]; then
    mkdir -p "$2/bin"
    printf '#!/usr/bin/env bash\\necho "python $*" >> "$FAKE_LOG"\\n' > "$2/bin/python"
    chmod +x "$2/bin/python"
  fi
  shift
done
"""


def _tool(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(shutil.which("bash") is None, reason="the recipe is a bash script: no bash here")
@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_the_shipped_recipe_clones_at_the_pin_and_installs_under_its_constraints(tmp_path: Path, name: str) -> None:
    tools, home, log = tmp_path / "bin", tmp_path / "home", tmp_path / "calls.log"
    tools.mkdir()
    _tool(tools, "git", FAKE_GIT)
    _tool(tools, "conda", FAKE_CONDA)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "FAKE_LOG": str(log),
           "TORCH_CUDA_ARCH_LIST": "8.0"}
    env.pop("CONDA_EXE", None)
    done = subprocess.run([sys.executable, "-m", "evaluators.official_build", name, str(home)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    commit = OmegaConf.load(ROOT / "conf" / "evaluator" / f"{name}_official.yaml").commit  # the evaluator's pin
    assert f"git -C {home}/repo checkout -q {commit}" in calls
    constraints = [c.split(" -c ", 1)[1].split()[0] for c in calls if c.startswith("python") and " -c /" in c]
    assert constraints == [str(RECIPE_DIR / f"{name}.constraints.txt")]
    assert Path(constraints[0]).is_file()
    assert any(c.startswith("conda ") and f"-p {home}/env" in c for c in calls)
    assert f"built {home}/env" in done.stdout


def test_an_unknown_environment_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigValueError, match="no environment 'hps'.*geneval.*dpg_bench"):
        build_command("hps")
    assert main(["hps"]) == 2


def test_without_the_recipe_the_error_says_to_reinstall(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import evaluators.official_build as official_build

    monkeypatch.setattr(official_build, "SCRIPT", tmp_path / "build.sh")
    with pytest.raises(InputError, match="build.sh is missing.*reinstall"):
        build_command("geneval")
