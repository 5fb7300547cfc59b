"""run.json: what produced a run (git state, package versions, platform, device, resolved config).

Written next to every result table so a number can be traced back to the code and environment that
made it (following lm-evaluation-harness's result schema).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from harness.api import ModelBundle
from harness.store.samples import write_atomic

log = logging.getLogger(__name__)
HEAD_PREFIX = "eagle_head."  # the target's EAGLE head in its state dict (harness/models/eagle_head.attach_head)

RUN_JSON_FORMAT = 1
PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "mulo-bench", "torch", "torchvision", "numpy", "pandas", "pillow", "hydra-core", "omegaconf",
    "hydra-submitit-launcher", "open_clip_torch", "torch-fidelity",
)
UNKNOWN = "unknown"
# The exact package set CI installs (docs/install.md); shipped in the wheel, so installed runs name it too.
LOCK_FILE = Path(__file__).resolve().parents[1] / "data" / "requirements.lock"
_SUBPROCESS_TIMEOUT_S = 10


def write_run_json(
    path: Path | str, cfg_resolved: Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Write the provenance record of a run to `path` atomically and return it.

    Args:
        path: destination, usually <run dir>/run.json.
        cfg_resolved: the fully resolved config (e.g. `OmegaConf.to_container(cfg, resolve=True)`).
        extra: anything else worth keeping (seeds, shard, stage timings, ...).

    Returns:
        The record as written. When `path` already holds a record, its `created_utc` is kept, so
        a job that rewrites run.json on completion still shows when the run started.
    """
    path = Path(path)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record = {
        "format": RUN_JSON_FORMAT,
        "created_utc": _previous_created(path) or now,
        "updated_utc": now,
        "git": git_state(PROJECT_ROOT),
        "packages": package_versions(PACKAGES),
        "lock": lock_state(LOCK_FILE),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "device": device_info(),
        "config": dict(cfg_resolved),
        "extra": dict(extra or {}),
    }
    # default=str keeps odd config leaves (paths, enums) readable instead of failing the run; NaN and
    # infinities become null, so the file is strict JSON that every parser reads.
    text = json.dumps(strict_json(record), indent=2, sort_keys=False, default=str, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode("utf-8"))
    log.info("wrote provenance to %s (commit %s)", path, record["git"]["commit"])
    return json.loads(text)


def git_state(repo: Path) -> dict[str, Any]:
    """Return {"commit": sha, "dirty": bool} of the checkout at `repo`, "unknown" outside git.

    `dirty` counts modified tracked files and untracked files that are not git-ignored.
    """
    commit = _git(repo, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": UNKNOWN, "dirty": UNKNOWN}
    status = _git(repo, "status", "--porcelain")
    return {"commit": commit, "dirty": UNKNOWN if status is None else bool(status)}


def lock_state(path: Path = LOCK_FILE) -> dict[str, Any]:
    """The lock file's sha256 and how the running environment departs from its pins.

    Returns {"file", "sha256", "pins": number of pinned packages, "differs": {name: installed
    version or None} for every pin the environment does not match}; an empty `differs` means this
    run used exactly the locked set (besides packages the lock does not name).
    """
    try:
        data = path.read_bytes()
    except OSError:
        return {"file": path.name, "sha256": UNKNOWN, "pins": 0, "differs": UNKNOWN}
    pins = dict(_LOCK_PIN.findall(data.decode("utf-8", errors="replace")))
    installed = package_versions(tuple(pins))
    return {
        "file": f"harness/data/{path.name}" if path == LOCK_FILE else str(path),
        "sha256": hashlib.sha256(data).hexdigest(),
        "pins": len(pins),
        "differs": {name: installed[name] for name, version in pins.items() if installed[name] != version},
    }


_LOCK_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", re.MULTILINE)


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Return the installed version of each distribution in `names` (None when absent)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_info() -> dict[str, Any]:
    """Return the CPU model and, with CUDA, the GPU names and CUDA, cuDNN and driver versions."""
    info: dict[str, Any] = {"cpu": _cpu_model(), "cuda_available": False, "gpus": []}
    try:
        import torch  # deferred: provenance must work, and stay cheap, without torch
    except ImportError:
        return info
    info["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["cuda_available"] = True
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cudnn"] = torch.backends.cudnn.version()
        info["driver"] = _nvidia_driver()
    return info


def _previous_created(path: Path) -> str | None:
    """`created_utc` of an earlier record at `path`, if there is a readable one."""
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return previous.get("created_utc") if isinstance(previous, dict) else None


def _git(repo: Path, *args: str) -> str | None:
    """Stripped stdout of `git -C repo args`, or None when git or the repository is unavailable."""
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True, text=True, timeout=_SUBPROCESS_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("git %s failed in %s: %s", " ".join(args), repo, exc)
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or UNKNOWN


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version reported by nvidia-smi, if it is installed."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=_SUBPROCESS_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float (NaN, +-inf) replaced by None, containers walked."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def weights_digest(modules: Iterable[Any], skip: tuple[str, ...] = ()) -> str:
    """blake2b digest of the parameters and buffers of `modules` (torch modules; None skipped):
    names, dtypes, shapes and bytes, in order, leaving out the entries whose names start with one of
    `skip`. Identifies the weights a SampleSet was made with when a bundle declares no `weights_id`
    (e.g. random or hub weights)."""
    digest = hashlib.blake2b(digest_size=16)
    for index, module in enumerate(modules):
        if module is None:
            continue
        for name, tensor in sorted(module.state_dict().items()):
            if name.startswith(skip):
                continue
            digest.update(f"{index}:{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()


def weights_ids(bundle: ModelBundle) -> tuple[str, str]:
    """What the images of `bundle` depend on: (the weights id every SampleSet is bound to, and the
    `;eagle_head:<digest>` that the sets of decoders drafting with the target's EAGLE head append;
    "" without a head). The weights id is the bundle's declared one (e.g. its manifest's digest),
    else a digest of its image models' parameters without the head: a job without EAGLE rows does
    not load the head (harness.preflight.model_for), so its sets are shared with jobs that do."""
    head = "" if bundle.eagle_head is None else ";eagle_head:" + weights_digest([bundle.eagle_head])
    if bundle.weights_id:
        return bundle.weights_id, head
    models = [bundle.target, bundle.drafter, bundle.small_drafter]
    return "params:" + weights_digest(models, skip=(HEAD_PREFIX,)), head
