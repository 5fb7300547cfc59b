"""Official evaluation scripts run in their own Python environment, as subprocesses.

GenEval's detector stack (mmdet 2.x, mmcv-full 1.7, torch 1.12-era) and DPG-Bench's VQA stack
(ModelScope + fairseq, Python <= 3.10) cannot be installed beside the harness's torch. The official
backends (evaluators/geneval_official.py, evaluators/dpg_bench_official.py) therefore export a
SampleSet in the official folder layout, run the official script with the `env_python` of an
environment built for it (docs/evaluators.md), and read its output back into the evaluator's rows.

Everything lives under `<SampleSet root>/official/<evaluator name>/`: the export, its manifest
`export.json` (exported file -> digest of what it was made from and sha256 of the file written), the
script's output files and its log (stdout and stderr). A rerun exports only what changed, and
reuses an exported file only when its own bytes still have the sha256 recorded (a file changed in
place is exported again, with a warning); a failed run keeps the export. Temporary files a killed
export left behind are removed by the next one, so the folder ends as an uninterrupted export's.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from harness.api import InputError
from harness.datasets.downloads import sha256_file
from harness.store.samples import write_atomic

log = logging.getLogger(__name__)

OFFICIAL_DIR = "official"
MANIFEST = "export.json"
TAIL_LINES = 20
_TAIL_CHARS = 300  # per line of the tail quoted in an error
_TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # write_atomic's temporary files
_UNSET = "???"  # a value the config file leaves open; check_config refuses it in a run
# Variables of the harness's own environment that would make another Python import the harness's
# packages (or none of its own): removed from the script's environment.
_FOREIGN_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "CONDA_PREFIX",
                      "PYTHONNOUSERSITE", "PYTHONUSERBASE")


class OfficialEnvError(InputError, FileNotFoundError):
    """The environment, the repository checkout or a file the official script needs is not where
    the config says."""


class OfficialScriptError(InputError, RuntimeError):
    """The official script exited with a non-zero status."""


class OfficialOutputError(InputError, ValueError):
    """The official script's output file is missing or not in the official format."""


def given(value: object) -> bool:
    """Whether a config value is set: not null and not left open (`???`). The official backends
    check unset paths when they evaluate, so that their configs instantiate for inspection; in a run
    check_config has already refused `???` before anything started."""
    return value is not None and value != _UNSET


@dataclass(frozen=True)
class OfficialEnv:
    """A checked Python environment plus the official repository checkout it runs scripts from.

    key: the evaluator's config key (e.g. "evaluator.geneval_official"), named in errors.
    python: the environment's interpreter; repo: the checkout; commit: the checkout's commit.
    """

    key: str
    python: Path
    repo: Path
    commit: str

    def script(self, relative: str) -> Path:
        """The path of a script of the checkout (checked by `open_env`)."""
        return self.repo / relative


def open_env(key: str, env_python: str, repo: str, scripts: Sequence[str], commit: str | None,
             recipe: str) -> OfficialEnv:
    """Check `env_python` (a file that runs as Python) and `repo` (a folder holding every one of
    `scripts`, paths relative to it); find the checkout's commit.

    Args:
        key: the evaluator's config key, named in errors ("evaluator.<name>").
        commit: the configured commit (used when `repo` is not a git checkout; checked against
            HEAD when it is).
        recipe: where the environment's recipe is, for the fixes ("docs/evaluators.md, ...").

    Raises:
        OfficialEnvError: naming the config key, the path and the fix.
    """
    python = Path(env_python).expanduser().absolute()
    if python.is_dir():
        raise OfficialEnvError(f"{key}.env_python={python} is a folder; give the environment's interpreter, "
                               f"e.g. {python / 'bin' / 'python'} ({recipe})")
    if not python.is_file() or not os.access(python, os.X_OK):
        what = "is not executable" if python.is_file() else "does not exist"
        raise OfficialEnvError(f"{key}.env_python={python} {what}; give the python of the environment "
                               f"built as {recipe}, e.g. /path/to/env/bin/python")
    _check_runs(key, python)
    checkout = Path(repo).expanduser().absolute()
    if not checkout.is_dir():
        raise OfficialEnvError(f"{key}.repo={checkout} is not a folder; give the path of the official "
                               f"repository checkout ({recipe})")
    for relative in scripts:
        if not (checkout / relative).is_file():
            raise OfficialEnvError(f"{key}.repo={checkout} has no {relative}; give the root of an unmodified "
                                   f"checkout of the official repository ({recipe})")
    return OfficialEnv(key=key, python=python, repo=checkout, commit=checkout_commit(key, checkout, commit))


def official_home(name: str, home: str | None) -> Path:
    """The folder `python -m evaluators.official_build <name>` builds an official environment in (`env/`, its
    interpreter `env/bin/python`; `repo/`, the checkout at the pinned commit) and fetch fills with
    what the script reads: `home`, else `$MULO_BENCH_CACHE/official/<name>`."""
    from harness.datasets.downloads import cache_root

    return (Path(home).expanduser() if given(home) else cache_root() / OFFICIAL_DIR / name).absolute()


def missing_modules(key: str, python: Path, modules: Sequence[str], fix: str) -> None:
    """OfficialEnvError naming the `modules` the environment's python cannot find (the packages the
    official script imports), and `fix`."""
    probe = ("import importlib.util, sys; "
             "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    try:
        done = subprocess.run([str(python), "-c", probe, *modules], capture_output=True, text=True, timeout=300,
                              env=script_environment(python))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OfficialEnvError(f"{key}.env_python={python} does not run ({exc}); {fix}") from exc
    absent = done.stdout.split()
    if done.returncode != 0 or absent:
        said = ", ".join(absent) or (done.stderr.strip().splitlines() or ["no output"])[-1][:_TAIL_CHARS]
        raise OfficialEnvError(f"{key}.env_python={python} cannot import what the official script imports "
                               f"({said}); {fix}")


def _check_runs(key: str, python: Path) -> None:
    """OfficialEnvError unless `python -c ...` runs (a broken environment, a non-Python file)."""
    try:
        done = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[0])"],
                              capture_output=True, text=True, timeout=120, env=script_environment(python))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OfficialEnvError(f"{key}.env_python={python} does not run ({exc}); give the python of the "
                               "environment built for it (docs/evaluators.md)") from exc
    if done.returncode != 0 or done.stdout.strip() != "3":
        said = (done.stderr.strip().splitlines() or ["no output"])[-1][:_TAIL_CHARS]
        raise OfficialEnvError(f"{key}.env_python={python} does not run as Python 3 (exit status "
                               f"{done.returncode}: {said}); give the python of the environment built for it "
                               "(docs/evaluators.md)")


def checkout_commit(key: str, repo: Path, configured: str | None) -> str:
    """HEAD of the git checkout `repo` ("-dirty" appended when tracked files differ from it), else
    the configured commit.

    Raises:
        OfficialEnvError: `repo` is not a git checkout and no commit is configured, or the configured
            commit is not the checkout's HEAD.
    """
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        if not given(configured):
            raise OfficialEnvError(f"{key}.repo={repo} is not a git checkout, so its commit is unknown; set "
                                   f"{key}.commit=<the commit its scripts were taken from>")
        return str(configured)
    if given(configured) and not head.startswith(str(configured)):
        raise OfficialEnvError(f"{key}.repo={repo} is at commit {head}, not {key}.commit={configured}; check "
                               f"out {configured} there (git -C {repo} checkout {configured}), or set "
                               f"{key}.commit=null to record the checkout's own commit")
    changed = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return f"{head}-dirty" if changed else head


def _git(repo: Path, *args: str) -> str | None:
    """Output of `git -C repo <args>` (stripped), or None when git or the checkout is absent."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def script_environment(python: Path) -> dict[str, str]:
    """The environment a script runs in: the harness's, without the variables that point Python at
    the harness's own packages, with the environment's bin folder first on PATH (its console scripts
    and compilers)."""
    env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_VARIABLES}
    prefix = python.parent.parent
    if (prefix / "conda-meta").is_dir():  # a conda environment: as `conda activate` would set it
        env["CONDA_PREFIX"] = str(prefix)
    env["PATH"] = os.pathsep.join([str(python.parent), env.get("PATH", "")])
    env.setdefault("PYTHONUNBUFFERED", "1")  # the log shows progress as it is made
    return env


def run_script(env: OfficialEnv, script: str, args: Sequence[str], log_path: Path,
               launcher: Sequence[str] = (), cwd: Path | None = None,
               variables: Mapping[str, str] | None = None) -> None:
    """Run `env.python [launcher...] <repo>/<script> args...` in `cwd` (None: the checkout), stdout
    and stderr into `log_path`, with `variables` added to the script's environment.

    Raises:
        OfficialScriptError: a non-zero exit status; the message names the script, the log and
            quotes the log's last TAIL_LINES lines (on one line, joined by " | ").
    """
    command = [str(env.python), *launcher, str(env.script(script)), *map(str, args)]
    log.info("running %s (%s @%s) in %s; its output goes to %s", script, env.key, env.commit[:12], env.python,
             log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        out.write((" ".join(command) + "\n").encode())
        out.flush()
        try:
            status = subprocess.run(command, cwd=cwd or env.repo, stdout=out, stderr=subprocess.STDOUT,
                                    env={**script_environment(env.python), **(variables or {})}).returncode
        except OSError as exc:
            raise OfficialEnvError(f"{env.key}.env_python={env.python} could not start {script} ({exc})") from exc
    if status != 0:
        lines = tail(log_path, TAIL_LINES)
        raise OfficialScriptError(
            f"{script} of {env.repo} (@{env.commit[:12]}) exited with status {status} in {env.python}; its last "
            f"{len(lines)} lines (all in {log_path}): {' | '.join(lines)}. Fix the environment "
            "(docs/evaluators.md) and rerun with stages=[evaluate]: the exported images are kept")


def tail(path: Path, count: int) -> list[str]:
    """The last `count` non-empty lines of a text file (carriage-return progress bars split into
    lines), each cut to _TAIL_CHARS characters."""
    text = path.read_bytes()[-200_000:].decode("utf-8", errors="replace")
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    return [line if len(line) <= _TAIL_CHARS else line[:_TAIL_CHARS] + "..." for line in lines[-count:]]


@dataclass(frozen=True)
class ExportItem:
    """One file of an export: `digest` identifies what it is made from; `content` makes its bytes."""

    digest: str
    content: Callable[[], bytes]


def text_digest(*parts: str) -> str:
    """sha256 (hex) of the parts, each ended by a newline."""
    return hashlib.sha256("".join(f"{p}\n" for p in parts).encode("utf-8")).hexdigest()


def sync_export(folder: Path, items: Mapping[str, ExportItem], manifest_path: Path) -> int:
    """Make `folder` hold exactly `items` (POSIX path relative to `folder` -> item); return how many
    files were written.

    A file is reused only when the manifest (kept outside `folder`, which the official scripts list)
    records the item's digest for it and the file still has the sha256 recorded when it was written;
    otherwise it is written (again). Files the manifest lists that `items` no longer has are
    deleted (files it does not list are left alone), as are temporary files a killed export left.
    The manifest is rewritten at the end, so a killed export is finished by the next one.
    """
    _remove_temp_files(folder)
    _remove_temp_files(manifest_path.parent, recursive=False)
    known = _read_manifest(manifest_path)
    written = 0
    files: dict[str, str] = {}  # relative path -> sha256 of the file exported there
    for relative, item in items.items():
        path = folder / relative
        entry = known.get(relative)
        if entry is not None and entry["from"] == item.digest and path.is_file():
            found = sha256_file(path)
            if found == entry["sha256"]:
                files[relative] = found
                continue
            log.warning("exported file %s was changed after it was exported (sha256 %s, exported as %s); "
                        "exporting it again", path, found, entry["sha256"])
        data = item.content()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        files[relative] = hashlib.sha256(data).hexdigest()
        written += 1
    for stale in sorted(set(known) - set(items)):
        (folder / stale).unlink(missing_ok=True)
        _remove_empty_parents(folder, folder / stale)
    manifest = {relative: {"from": item.digest, "sha256": files[relative]} for relative, item in sorted(items.items())}
    if manifest != known:
        write_atomic(manifest_path, json.dumps(manifest, indent=1).encode("utf-8"))
    log.info("%s: %d of %d exported files written, %d reused", folder, written, len(items), len(items) - written)
    return written


def _remove_temp_files(folder: Path, recursive: bool = True) -> None:
    """Delete the temporary files (write_atomic's `.<name>.<hex>.tmp`) that a killed writer left in
    `folder` (and its subfolders when `recursive`)."""
    if not folder.is_dir():
        return
    for path in (folder.rglob(".*.tmp") if recursive else folder.glob(".*.tmp")):
        if _TEMP_NAME.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)


def _remove_empty_parents(folder: Path, path: Path) -> None:
    """Remove the folders between `path` and `folder` that are left empty (an official script would
    read an empty prompt folder as a prompt without its files)."""
    parent = path.parent
    while parent != folder and folder in parent.parents:
        try:
            parent.rmdir()
        except OSError:  # not empty (or already gone): the folders above are not empty either
            return
        parent = parent.parent


def _read_manifest(path: Path) -> dict[str, dict[str, str]]:
    """The manifest's path -> {"from": digest of the source, "sha256": of the exported file}; empty
    (everything exported again) when absent, unreadable or of another format."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("export manifest %s is unreadable (%s); exporting everything again", path, exc)
        return {}
    if not isinstance(data, dict) or not all(
            isinstance(v, dict) and set(v) == {"from", "sha256"} and all(isinstance(x, str) for x in v.values())
            for v in data.values()):
        log.warning("export manifest %s is not a path -> {from, sha256} map; exporting everything again", path)
        return {}
    return data


def work_dir(root: Path, name: str) -> Path:
    """`<SampleSet root>/official/<evaluator name>/`, created, as an absolute path (the script runs in
    another working directory, and `samples_dir` may be relative)."""
    folder = (root / OFFICIAL_DIR / name).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def fresh(path: Path) -> Path:
    """`path` with any earlier file there removed, so that an output the script did not write is
    never an old run's."""
    path.unlink(missing_ok=True)
    return path


def unset_keys(key: str, values: Mapping[str, object]) -> None:
    """OfficialEnvError naming every option of `values` (option -> value) that is not set."""
    missing = [name for name, value in values.items() if not given(value)]
    if missing:
        raise OfficialEnvError(f"{', '.join(f'{key}.{m}' for m in missing)} must be set for the official "
                               f"scripts to run; add {' '.join(f'{key}.{m}=<path>' for m in missing)} "
                               "(docs/evaluators.md, 'Official scripts in their own environments')")
