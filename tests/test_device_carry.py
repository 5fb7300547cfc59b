"""What a device call carries (benchmarks/gpu_first_run.sh, docs/methodology.md): the tracked tree
plus the ignored .whl/ stays under the 64 MiB a call may carry, .whl/ is ignored and holds only the
three wheels the lent image lacks, at the lock's versions."""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

CARRY_LIMIT = 64 << 20  # bytes a device call carries: the working tree and the carried paths
WHEELS = ("hydra_core", "omegaconf", "antlr4_python3_runtime")
WHEELS_ALLOWANCE = 1 << 20  # .whl/ when it is not built here: the three wheels are about 0.4 MB


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def checkout() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")


def _carried_tree() -> int:
    """Bytes of the files a call copies: tracked, plus untracked files git does not ignore."""
    names = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file())


def test_the_tree_and_the_wheels_fit_a_device_call(checkout: None) -> None:
    wheels = sorted((ROOT / ".whl").rglob("*")) if (ROOT / ".whl").is_dir() else []
    carried = sum(p.stat().st_size for p in wheels if p.is_file()) if wheels else WHEELS_ALLOWANCE
    total = _carried_tree() + carried
    assert total <= CARRY_LIMIT, (f"the tree ({_carried_tree() / 2**20:.1f} MiB) and .whl/ ({carried / 2**20:.1f} "
                                  f"MiB) exceed the {CARRY_LIMIT >> 20} MiB a device call carries")


def test_whl_is_ignored_and_holds_only_the_three_wheels(checkout: None) -> None:
    assert _git("check-ignore", ".whl/hydra_core-1.3.8-py3-none-any.whl").strip()
    folder = ROOT / ".whl"
    if not folder.is_dir():
        pytest.skip(".whl/ not built here (bash benchmarks/build_wheels.sh)")
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 3 and all(name.endswith("-py3-none-any.whl") for name in names), names
    assert sorted(name.split("-")[0] for name in names) == sorted(WHEELS)


def test_the_gpu_requirements_are_the_locks_pins() -> None:
    lock = (ROOT / "harness" / "data" / "requirements.lock").read_text()
    wanted = [line for line in (ROOT / "benchmarks" / "gpu_requirements.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    assert [re.split("==", line)[0] for line in wanted] == ["hydra-core", "omegaconf", "antlr4-python3-runtime"]
    for line in wanted:
        assert re.search(rf"^{re.escape(line)}$", lock, re.M), line


def test_the_first_gpu_run_is_two_calls_within_eight_minutes() -> None:
    """Each call's parts' time limits sum to at most 8 minutes less a minute for the install and
    the machine's start; the script calls python3, as the image documents."""
    script = (ROOT / "benchmarks" / "gpu_first_run.sh").read_text()
    limits = {k: int(v) for k, v in re.findall(r"^LIMIT_(\w+)=\$\{LIMIT_\w+:-(\d+)\}", script, re.M)}
    assert limits["STEPS"] + limits["SYNCS"] <= 7 * 60 and limits["CHECKS"] <= 7 * 60
    assert "call1) for p in steps:llamagen_xl_512 syncs;" in script and "call2) part checks" in script
    assert "PY=${PYTHON:-python3}" in script
