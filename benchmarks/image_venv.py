"""A virtualenv holding only what the lent GPU image has (its packages and their dependencies), for
the CPU rehearsal of benchmarks/gpu_first_run.sh (benchmarks/rehearse_gpu_first_run.sh).

    python benchmarks/image_venv.py DEST

The packages are not installed again: DEST's site-packages gets a `.pth` file naming a folder of
links to exactly those distributions' files in the running interpreter's environment (as .ci/run's
installed-wheel check borrows them), so hydra-core, omegaconf and antlr4-python3-runtime, which the
image lacks, are absent unless the rehearsal installs them from .whl/.
"""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

log = logging.getLogger("benchmarks.image_venv")

# what the lent image brings (the device tool's description of it)
IMAGE = ("torch", "numpy", "pandas", "PyYAML", "pillow", "tqdm", "safetensors", "transformers", "pytest")
# what it lacks: never borrowed, even as a dependency
LACKED = ("hydra-core", "omegaconf", "antlr4-python3-runtime")


def closure(names: tuple[str, ...] = IMAGE) -> dict[str, metadata.Distribution]:
    """The installed distributions of `names` and of their dependencies (markers evaluated, extras
    not followed), by canonical name.

    Raises:
        SystemExit: one of them is not installed here, or would bring a LACKED package.
    """
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        if name in {canonicalize_name(n) for n in LACKED}:
            raise SystemExit(f"{name} is not in the GPU image, yet an image package depends on it")
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as err:
            raise SystemExit(f"{name} is not installed in {sys.prefix}; install the lock first") from err
        found[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def top_level(dist: metadata.Distribution) -> set[Path]:
    """The entries of site-packages a distribution installed (packages, modules, its .dist-info)."""
    site = Path(str(dist.locate_file("")))
    entries = {site / Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    return {e for e in entries if e.exists() and e.name != "__pycache__"}


def build(dest: Path) -> Path:
    """A fresh virtualenv at `dest` seeing only the image's distributions; returns its python."""
    dists = closure()
    subprocess.run([_base_python(), "-m", "venv", "--clear", str(dest)], check=True)
    python = dest / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    links = dest / "image-packages"
    links.mkdir()
    for dist in dists.values():
        for entry in top_level(dist):
            if not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry)
    (Path(purelib) / "_image_packages.pth").write_text(f"{links}\n")
    log.info("%s: %d distributions of the image (%s)", dest, len(dists), ", ".join(sorted(dists)))
    return python


def _base_python() -> str:
    """The interpreter the running virtualenv was made from (the same Python version)."""
    return str(Path(sys._base_executable))  # noqa: SLF001 (the documented way to reach the base)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/image_venv.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path, help="where to create the virtualenv")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.stdout.write(f"{build(a.dest)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
