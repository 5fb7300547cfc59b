"""Stand-in official environments: a Python environment of its own (`python -m venv`, its own
interpreter and site-packages) that reaches this interpreter's packages (pandas, PIL, numpy) through
a .pth file, and holds empty stand-in packages for the official stacks' imports (mmdet, mmcv,
open_clip, clip_benchmark; accelerate, modelscope, fairseq) so that the evaluators' import checks
pass. The stand-in scripts themselves are the official paths of a stand-in checkout
(tests/test_official_env.py)."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Mapping, Sequence

GENEVAL_MODULES = ("mmdet", "mmcv", "open_clip", "clip_benchmark")
DPG_MODULES = ("accelerate", "modelscope", "fairseq")


def standin_env(prefix: Path, modules: Sequence[str], sources: Mapping[str, str] | None = None) -> Path:
    """A venv at `prefix` with stand-in packages `modules` (each an empty package, or the module
    text `sources[name]` for a dotted file path such as "modelscope/hub/snapshot_download.py");
    returns its interpreter."""
    python = prefix / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True)
    site = Path(done.stdout.strip())
    site.mkdir(parents=True, exist_ok=True)
    (site / "_borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for name in modules:
        (site / name).mkdir(exist_ok=True)
        (site / name / "__init__.py").touch()
    for relative, text in (sources or {}).items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(site).parents:
            if str(parent) != ".":
                (site / parent / "__init__.py").touch(exist_ok=True)
        path.write_text(text)
    return python
