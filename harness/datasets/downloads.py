"""Pinned, hash-checked, cached downloads of benchmark files (prompt lists, question graphs,
reference images) and the offline story around them.

A `Pinned` names one file: where it comes from (a URL at a fixed commit), how to check it (sha256
or git blob SHA-1) and the file name it is cached under. `fetch(pinned)` returns the cached copy,
downloading it once (atomically, verified before it lands in the cache); `resolve(pinned, path)`
prefers a local file the user gives (verified the same way) and never touches the network then.

The cache lives in `$MULO_BENCH_CACHE` (default `~/.cache/mulo_bench`), `data/` below it. For
offline nodes: run `stages=[fetch]` (or the loader) once on a connected machine and copy that folder,
or pass the local path of each file in the dataset config. Behind a firewall, `$MULO_BENCH_MIRROR`
(config `assets.mirror`, harness/assets/mirror.py) reads every URL from a mirror instead.
"""
from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from harness.api import InputError
from harness.assets.mirror import mirrored

log = logging.getLogger(__name__)

CACHE_ENV = "MULO_BENCH_CACHE"
_CHUNK = 1 << 20
_TIMEOUT_S = 60


class DownloadError(InputError, RuntimeError):
    """A pinned file could not be downloaded; the message names the URL and the offline fix."""


class MissingFileError(InputError, FileNotFoundError):
    """A local benchmark file named in the config does not exist."""


class ChecksumError(InputError, ValueError):
    """A file does not have its pinned hash; the message names the file and both hashes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pinned:
    """One pinned file. Exactly one of `sha256` / `git_sha1` (git blob SHA-1, `git hash-object`)
    should be set; with neither the file is accepted unchecked and its sha256 logged."""

    name: str
    url: str
    sha256: str | None = None
    git_sha1: str | None = None
    what: str = ""

    @property
    def checksum(self) -> str:
        """Human-readable pin, e.g. "git-sha1:98457fc9..."."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        if self.git_sha1:
            return f"git-sha1:{self.git_sha1}"
        return "unpinned"


def cache_root() -> Path:
    """The harness cache folder ($MULO_BENCH_CACHE or ~/.cache/mulo_bench)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mulo_bench")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """Hex git blob SHA-1 of a file (= `git hash-object FILE`)."""
    digest = hashlib.sha1()
    digest.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, pinned: Pinned) -> None:
    """Raise ChecksumError unless `path` has the pinned hash (no pin: log the sha256)."""
    if pinned.sha256:
        found, expected, kind = sha256_file(path), pinned.sha256, "sha256"
    elif pinned.git_sha1:
        found, expected, kind = git_blob_sha1(path), pinned.git_sha1, "git blob SHA-1"
    else:
        log.info("%s has no pinned hash; accepting %s", pinned.name, path)
        return
    if found != expected:
        raise ChecksumError(
            f"{path} ({pinned.what or pinned.name}) has {kind} {found}, expected {expected}: it is not "
            f"the pinned file. Delete it and let the harness download {pinned.url}, or give the "
            "path of an unmodified copy."
        )


def fetch(pinned: Pinned, cache_dir: Path | None = None) -> Path:
    """Return the verified cached copy of `pinned`, downloading it on first use.

    Raises:
        DownloadError: no network (the message says how to pre-download for offline nodes).
        ChecksumError: the downloaded bytes do not match the pin.
    """
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "data"
    target = folder / pinned.name
    if target.is_file():
        verify(target, pinned)
        return target
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{pinned.name}.{uuid.uuid4().hex[:12]}.tmp"
    url = mirrored(pinned.url)
    log.info("downloading %s from %s", pinned.what or pinned.name, url)
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, open(tmp, "wb") as out:
            expected = response.headers.get("Content-Length")
            shutil.copyfileobj(response, out, _CHUNK)
        if expected is not None and tmp.stat().st_size != int(expected):  # the connection dropped
            raise http.client.IncompleteRead(b"", int(expected) - tmp.stat().st_size)
        verify(tmp, pinned)
        os.replace(tmp, target)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise DownloadError(
            f"could not download {pinned.what or pinned.name} from {url} ({type(exc).__name__}: {exc}). On an offline "
            f"node, download it elsewhere ({pinned.checksum}) and either place it at {target} "
            f"(set ${CACHE_ENV} to choose the cache) or pass its local path in the dataset config."
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


def resolve(pinned: Pinned, local: str | Path | None, check: bool = True) -> Path:
    """`local` (verified unless check=False) when given, else the cached download of `pinned`."""
    if local is None:
        return fetch(pinned)
    path = Path(local).expanduser()
    if not path.is_file():
        raise MissingFileError(
            f"{pinned.what or pinned.name}: {path} does not exist. Give the path of {pinned.name} "
            f"(from {pinned.url}), or leave the path unset to download it."
        )
    if check:
        verify(path, pinned)
    return path
