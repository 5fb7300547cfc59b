"""One thing a job downloads, described so that it can be listed (files, sizes, cached or not),
fetched ahead of time and checked offline.

- `HubFiles`: the files of a Hugging Face repository that a loader reads, by name or pattern
  (`allow_patterns`), into the hub cache, as `hf_hub_download` / `snapshot_download` do at run time;
- `UrlFile`: a pinned URL (harness/datasets/downloads.py), read through `assets.mirror` when set;
- `ModelScopeModel`: a ModelScope model (DPG-Bench's mPLUG), fetched with modelscope when installed.

Every kind answers `entries()` (online: what the source holds, with sizes), `missing()` (offline:
the files not on this machine) and `download()`.
"""
from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.api import InputError
from harness.assets.mirror import mirror, mirrored
from harness.datasets.downloads import DownloadError, Pinned, cache_root, fetch

log = logging.getLogger(__name__)

_TIMEOUT_S = 30


class AssetError(InputError, RuntimeError):
    """An asset cannot be listed or downloaded; the message names it and the fix."""


@dataclass(frozen=True)
class Entry:
    """One file of an asset: its name, size in bytes (None: unknown) and whether it is on this machine."""

    name: str
    size: int | None
    cached: bool


class Asset(Protocol):
    """What every kind of asset answers."""

    what: str  # who reads it, e.g. "model.text_encoder" or "evaluator hpsv2"

    def source(self) -> str: ...  # e.g. "hub google/flan-t5-xl"

    def entries(self) -> list[Entry]: ...

    def missing(self) -> list[str]: ...

    def download(self) -> None: ...

    def command(self) -> str: ...  # how to fetch it by hand


@dataclass(frozen=True)
class HubFiles:
    """Files of Hugging Face repo `repo` matching `patterns` (exact names or globs), in `cache_dir`
    (None: the default hub cache). The files named in `required` (None: every pattern without a
    wildcard) must be in the repo; the other patterns may match nothing (optional files).

    `weights`: the weight formats the loader reads, in its order (harness.models.hub.WEIGHT_ORDER:
    safetensors, else .bin): the first the repo holds is fetched with the files, the others not, and
    a repo holding none is refused."""

    what: str
    repo: str
    patterns: tuple[str, ...]
    cache_dir: str | None = None
    required: tuple[str, ...] | None = None
    weights: tuple[tuple[str, ...], ...] = ()

    @property
    def needed(self) -> tuple[str, ...]:
        """The file names that must exist in the repo."""
        if self.required is not None:
            return self.required
        return tuple(p for p in self.patterns if not _has_wildcard(p))

    def source(self) -> str:
        return f"hub {self.repo}"

    def _snapshot(self, patterns: tuple[str, ...] | None = None, **kwargs):
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id=self.repo, allow_patterns=list(patterns or self.patterns),
                                 cache_dir=self.cache_dir, **kwargs)

    def _chosen(self, names: list[str]) -> tuple[str, ...]:
        """The weight format (its patterns) the loader reads among the repo's files `names`; () when
        this asset names none.

        Raises:
            AssetError: the repo holds no weight file of any format.
        """
        from fnmatch import fnmatch

        if not self.weights:
            return ()
        for patterns in self.weights:
            if any(fnmatch(name, pattern) for name in names for pattern in patterns):
                return patterns
        order = ", then ".join(p[0] for p in self.weights)
        raise AssetError(f"{self.what}: the Hugging Face repo {self.repo} holds no weight file ({order}, the order "
                         "its loader reads them); check the repo id in the config (or the mirror behind HF_ENDPOINT)")

    def entries(self) -> list[Entry]:
        """The repo's files this asset reads, from the hub (a dry run: nothing is downloaded).

        Raises:
            AssetError: the hub cannot be reached, or a named file is not in the repo.
        """
        try:
            infos = self._snapshot(self.patterns + tuple(p for group in self.weights for p in group), dry_run=True)
        except Exception as err:  # noqa: BLE001 - network, missing repo, offline: reported alike
            hint = ("HF_HUB_OFFLINE is set, and fetching needs the network: unset it" if hub_offline()
                    else "check the network or HF_ENDPOINT")
            raise AssetError(f"{self.what}: cannot list the Hugging Face repo {self.repo} ({type(err).__name__}: "
                             f"{_first_line(err)}); {hint}, or fetch it by hand with `{self.command()}`") from err
        names = [info.filename for info in infos]
        absent = [p for p in self.needed if p not in names]
        if absent:
            raise AssetError(f"{self.what}: the Hugging Face repo {self.repo} has no file {', '.join(absent)}; "
                             "check the repo id and file names in the config (or the mirror behind HF_ENDPOINT)")
        if not names:
            raise AssetError(f"{self.what}: no file of the Hugging Face repo {self.repo} matches {list(self.patterns)}")
        keep = self._kept(names)
        return [Entry(info.filename, info.file_size, info.is_cached) for info in infos if info.filename in keep]

    def _kept(self, names: list[str]) -> set[str]:
        """Of the listed `names`, those this asset fetches: its own patterns' and the chosen weight format's."""
        from fnmatch import fnmatch

        chosen = self._chosen(names)
        other = {p for group in self.weights for p in group} - set(chosen) - set(self.patterns)
        return {n for n in names if not any(fnmatch(n, p) for p in other) or any(fnmatch(n, p) for p in chosen)}

    def missing(self) -> list[str]:
        """The files not in the cache (checked without the network). Names each exact file missing; for
        patterns, the cache's listing of the repo (written when it was fetched) decides."""
        from huggingface_hub import try_to_load_from_cache

        absent = [p for p in self.needed if not isinstance(
            try_to_load_from_cache(repo_id=self.repo, filename=p, cache_dir=self.cache_dir), str)]
        if not absent and self.weights and not self._cached_weights():
            return [" or ".join(group[0] for group in self.weights)]
        if absent or set(self.needed) == set(self.patterns):
            return absent
        try:
            self._snapshot(local_files_only=True)
        except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and kin: the snapshot is not complete
            return [p for p in self.patterns if p not in self.needed]
        return []

    def _cached_weights(self) -> bool:
        """Whether the cached snapshot holds a weight file of one of the formats (checked offline)."""
        from huggingface_hub import try_to_load_from_cache

        from harness.models.hub import weight_files

        anchor = try_to_load_from_cache(repo_id=self.repo, filename=self.needed[0], cache_dir=self.cache_dir) \
            if self.needed else None
        if not isinstance(anchor, str):
            return False
        return any(weight_files(Path(anchor).parent, group) for group in self.weights)

    def download(self) -> None:
        try:
            patterns = self.patterns
            if self.weights:
                patterns += self._chosen([info.filename for info in self._snapshot(
                    self.patterns + tuple(p for group in self.weights for p in group), dry_run=True)])
            self._snapshot(patterns)
        except AssetError:
            raise
        except Exception as err:  # noqa: BLE001
            raise AssetError(f"{self.what}: downloading {list(self.patterns)} from the Hugging Face repo "
                             f"{self.repo} failed ({type(err).__name__}: {_first_line(err)}); rerun stages=[fetch] "
                             "(what was fetched is kept) or fetch it by hand with "
                             f"`{self.command()}`") from err

    def command(self) -> str:
        if set(self.needed) == set(self.patterns) and not self.weights:
            return f"hf download {self.repo} {' '.join(self.patterns)}"
        weights = self.weights[0] if self.weights else ()
        return f"hf download {self.repo} " + " ".join(f"--include '{p}'" for p in (*self.patterns, *weights))


@dataclass(frozen=True)
class UrlFile:
    """A pinned file fetched into the harness cache (or `folder` below it)."""

    what: str
    pinned: Pinned
    folder: str | None = None

    def source(self) -> str:
        return mirrored(self.pinned.url)

    def _target(self) -> Path:
        return (Path(self.folder).expanduser() if self.folder else cache_root() / "data") / self.pinned.name

    @property
    def path(self) -> Path:
        """Where the file lands (and is read from)."""
        return self._target()

    def entries(self) -> list[Entry]:
        """The file with its size (a HEAD request, through the mirror), or its cached size."""
        target = self._target()
        if target.is_file():
            return [Entry(self.pinned.name, target.stat().st_size, True)]
        request = urllib.request.Request(mirrored(self.pinned.url), method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                length = response.headers.get("Content-Length")
        except (urllib.error.URLError, OSError) as err:
            raise AssetError(f"{self.what}: cannot reach {mirrored(self.pinned.url)} ({err}); "
                             f"{_url_fix()}") from err
        return [Entry(self.pinned.name, int(length) if length else None, False)]

    def missing(self) -> list[str]:
        return [] if self._target().is_file() else [self.pinned.name]

    def download(self) -> None:
        try:
            fetch(self.pinned, Path(self.folder).expanduser() if self.folder else None)
        except DownloadError as err:
            raise AssetError(f"{self.what}: {err}") from err

    def command(self) -> str:
        return f"wget -O {self._target()} {self.pinned.url}"


@dataclass(frozen=True)
class ModelScopeModel:
    """A ModelScope model, downloaded by modelscope itself: with this interpreter's modelscope into
    its default cache (`python` None), or with the modelscope of another environment's `python`
    (DPG-Bench's) into `cache_dir`, where it lands as `<cache_dir>/<model_id>/` (ModelScope's own
    layout; a mirror: that client's MODELSCOPE_DOMAIN)."""

    what: str
    model_id: str
    python: str | None = None
    cache_dir: str | None = None

    def source(self) -> str:
        return f"modelscope {self.model_id}"

    @property
    def folder(self) -> Path | None:
        """The model's folder in `cache_dir` (None: modelscope's default cache)."""
        return None if self.cache_dir is None else Path(self.cache_dir).expanduser() / self.model_id

    def _marker(self) -> Path:
        """Written once a download into `cache_dir` completed (a partial one leaves files behind)."""
        assert self.cache_dir is not None
        return Path(self.cache_dir).expanduser() / f".fetched--{self.model_id.replace('/', '--')}.json"

    def _modelscope(self):
        try:
            from modelscope.hub.snapshot_download import snapshot_download
        except ImportError as err:
            raise AssetError(f"{self.what}: the ModelScope model {self.model_id} is fetched with modelscope, "
                             "which is not installed; install it (docs/evaluators.md) or choose another VQA "
                             "backend") from err
        return snapshot_download

    def _run(self, code: str, *args: str) -> str:
        """stdout of `python -c code args` in the environment of `python`, MODELSCOPE_CACHE set."""
        import subprocess

        from evaluators.official_env import script_environment

        python = Path(str(self.python)).expanduser()
        env = {**script_environment(python), "MODELSCOPE_CACHE": str(Path(str(self.cache_dir)).expanduser())}
        try:
            done = subprocess.run([str(python), "-c", code, *args], capture_output=True, text=True, env=env,
                                  timeout=24 * 3600)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise AssetError(f"{self.what}: {python} does not run ({err}); the ModelScope model {self.model_id} is "
                             "fetched with the modelscope of that environment: build it first "
                             "(docs/evaluators.md)") from err
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise AssetError(f"{self.what}: modelscope in {python} could not fetch {self.model_id} ({said}); check "
                             f"the network (or MODELSCOPE_DOMAIN for a mirror) and rerun, or `{self.command()}`")
        return done.stdout

    def entries(self) -> list[Entry]:
        if self.python is None:
            self._modelscope()
            return [Entry(self.model_id, None, False)]
        if not self.missing():
            files = json.loads(self._marker().read_text(encoding="utf-8"))
            return [Entry(f"{self.model_id}/{name}", size, True) for name, size in files]
        listing = ("import json, sys; from modelscope.hub.api import HubApi; "
                   "files = HubApi().get_model_files(sys.argv[1], recursive=True); "
                   "print(json.dumps([[f['Path'], f.get('Size')] for f in files if f.get('Type') != 'tree']))")
        files = json.loads(self._run(listing, self.model_id).strip().splitlines()[-1])
        return [Entry(f"{self.model_id}/{name}", size, False) for name, size in files]

    def missing(self) -> list[str]:
        if self.python is not None:
            folder = self.folder
            found = folder is not None and (folder / "configuration.json").is_file() and self._marker().is_file()
            return [] if found else [self.model_id]
        try:
            self._modelscope()(self.model_id, local_files_only=True)
        except Exception:  # noqa: BLE001 - not installed, or not cached
            return [self.model_id]
        return []

    def download(self) -> None:
        if self.python is None:
            self._modelscope()(self.model_id)
            return
        fetch = ("import sys; from modelscope.hub.snapshot_download import snapshot_download; "
                 "print(snapshot_download(sys.argv[1], cache_dir=sys.argv[2]))")
        self._run(fetch, self.model_id, str(Path(str(self.cache_dir)).expanduser()))
        folder = self.folder
        assert folder is not None
        if not (folder / "configuration.json").is_file():
            raise AssetError(f"{self.what}: modelscope fetched {self.model_id} but {folder} has no configuration.json; "
                             "remove the folder and fetch again")
        files = sorted([p.relative_to(folder).as_posix(), p.stat().st_size] for p in folder.rglob("*") if p.is_file())
        self._marker().write_text(json.dumps(files), encoding="utf-8")

    def command(self) -> str:
        if self.python is None:
            return f"modelscope download --model {self.model_id}"
        return (f"{self.python} -c \"from modelscope.hub.snapshot_download import snapshot_download; "
                f"snapshot_download('{self.model_id}', cache_dir='{self.cache_dir}')\"")


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE forbids the hub client the network."""
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() not in ("", "0", "false", "no", "off")


def _has_wildcard(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else ""


def _url_fix() -> str:
    if mirror():
        return f"check that the mirror {mirror()} is up and holds the file under <host>/<path>"
    return "check the network, or set assets.mirror to a mirror that holds it (docs/install.md)"
