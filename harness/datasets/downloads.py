"""Pinned, hash-checked, cached downloads of benchmark files (prompt lists, question graphs,
reference images) and the offline story around them.

A `Pinned` names one file: where it comes from (a URL at a fixed commit), how to check it (sha256,
git blob SHA-1, the md5 its publisher gives, or the sha256 prefix a publisher puts in the file name
where no full hash is published) and the file name it is cached under. `fetch(pinned)` returns the cached copy,
downloading it once (atomically, verified before it lands in the cache); `resolve(pinned, path)`
prefers a local file the user gives (verified the same way) and never touches the network then.

The cache lives in `$MULO_BENCH_CACHE` (default `~/.cache/mulo_bench`), `data/` below it. For
offline nodes: run `stages=[fetch]` (or the loader) once on a connected machine and copy that folder,
or pass the local path of each file in the dataset config. Behind a firewall, `$MULO_BENCH_MIRROR`
(config `assets.mirror`, harness/assets/mirror.py) reads every URL from a mirror instead; a file a
mirror serves is checked against the same pin, and a mismatch names the mirror and the pin.

Temporary files: a download is written to `.<name>.<hex>.tmp` beside its target and renamed once
verified; the next fetch of the same file removes what a killed one left (a fetch whose temporary
file a concurrent one removed uses that one's download, or downloads again).
"""
from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import shutil
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from harness.api import InputError
from harness.assets.mirror import MIRROR_ENV, mirror, mirrored

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
    """One pinned file. Exactly one of `sha256` / `git_sha1` (git blob SHA-1, `git hash-object`) /
    `md5` (where the publisher gives only that) / `sha256_prefix` (the leading hex digits of the
    sha256 a publisher puts in the file name, e.g. OpenMMLab's `-c9d0c4f2.pth`, where no full hash is
    published) should be set; with none the file is accepted unchecked and a warning names it."""

    name: str
    url: str
    sha256: str | None = None
    git_sha1: str | None = None
    md5: str | None = None
    sha256_prefix: str | None = None
    what: str = ""

    @property
    def checksum(self) -> str:
        """Human-readable pin, e.g. "git-sha1:98457fc9..."."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        if self.git_sha1:
            return f"git-sha1:{self.git_sha1}"
        if self.md5:
            return f"md5:{self.md5}"
        if self.sha256_prefix:
            return f"sha256:{self.sha256_prefix}..."
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


def md5_file(path: Path) -> str:
    """Hex md5 of a file (only to match a publisher's md5)."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def mismatch(path: Path, pinned: Pinned) -> str | None:
    """"<kind> <found>" when `path` does not have the pinned hash, else None (no pin: a warning)."""
    if pinned.sha256:
        found, ok, kind = sha256_file(path), None, "sha256"
        ok = found == pinned.sha256
    elif pinned.git_sha1:
        found, kind = git_blob_sha1(path), "git blob SHA-1"
        ok = found == pinned.git_sha1
    elif pinned.md5:
        found, kind = md5_file(path), "md5"
        ok = found == pinned.md5
    elif pinned.sha256_prefix:
        found, kind = sha256_file(path), "sha256"
        ok = found.startswith(pinned.sha256_prefix)
    else:
        log.warning("%s has no pinned hash: %s is accepted unchecked", pinned.what or pinned.name, path)
        return None
    return None if ok else f"{kind} {found}"


def verify(path: Path, pinned: Pinned) -> None:
    """Raise ChecksumError unless `path` has the pinned hash (no pin: a warning)."""
    found = mismatch(path, pinned)
    if found is not None:
        raise ChecksumError(
            f"{path} ({pinned.what or pinned.name}) has {found}, expected {pinned.checksum.split(':', 1)[1]}: it "
            f"is not the pinned file. Delete it (rm {path}) and let the harness download {pinned.url}, or give "
            "the path of an unmodified copy."
        )


def served_by(url: str) -> str:
    """Who served `url`: "the mirror M ($MULO_BENCH_MIRROR / assets.mirror) as U", or the URL."""
    base = mirror()
    if base:
        return f"the mirror {base} (${MIRROR_ENV} / assets.mirror) as {mirrored(url)}"
    return url


def fetch(pinned: Pinned, cache_dir: Path | None = None) -> Path:
    """Return the verified cached copy of `pinned`, downloading it on first use.

    Raises:
        DownloadError: no network (the message says how to pre-download for offline nodes).
        ChecksumError: the downloaded bytes do not match the pin (the message names who served them).
    """
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / "data"
    target = folder / pinned.name
    if target.is_file():
        verify(target, pinned)
        return target
    folder.mkdir(parents=True, exist_ok=True)
    _remove_temp_files(folder, pinned.name)
    try:
        _download(pinned, folder, target)
    except FileNotFoundError:  # a concurrent fetch removed our temporary file: use its copy, or again
        if not target.is_file():
            try:
                _download(pinned, folder, target)
            except FileNotFoundError as err:
                raise DownloadError(_offline_fix(pinned, mirrored(pinned.url), target,
                                                 "its temporary file was removed twice by concurrent fetches")) from err
    verify(target, pinned)
    return target


def _download(pinned: Pinned, folder: Path, target: Path) -> None:
    """Download `pinned` into `target` through a temporary file, verified before it is renamed.

    Raises:
        FileNotFoundError: the temporary file disappeared (a concurrent fetch removed it).
    """
    tmp = folder / f".{pinned.name}.{uuid.uuid4().hex[:12]}.tmp"
    url = mirrored(pinned.url)
    log.info("downloading %s from %s", pinned.what or pinned.name, url)
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, open(tmp, "wb") as out:
            expected = response.headers.get("Content-Length")
            shutil.copyfileobj(response, out, _CHUNK)
        if expected is not None and tmp.stat().st_size != int(expected):  # the connection dropped
            raise http.client.IncompleteRead(b"", int(expected) - tmp.stat().st_size)
        found = mismatch(tmp, pinned)
        if found is not None:
            where = urlsplit(pinned.url)
            fix = (f"Replace the mirror's copy ({mirror()}/{where.netloc}{where.path}) with "
                   f"the pinned file, or unset ${MIRROR_ENV} to read the origin {pinned.url}" if mirror()
                   else "The origin no longer serves the pinned file: download an unmodified copy elsewhere "
                        f"and place it at {target}")
            raise ChecksumError(f"{pinned.what or pinned.name}: the file served by {served_by(pinned.url)} has "
                                f"{found}, not the pinned {pinned.checksum}; nothing was kept. {fix}")
        os.replace(tmp, target)
    except FileNotFoundError:
        if tmp.exists() or not folder.is_dir():
            raise DownloadError(_offline_fix(pinned, url, target, "FileNotFoundError")) from None
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        raise DownloadError(_offline_fix(pinned, url, target, f"{type(exc).__name__}: {exc}")) from exc
    finally:
        tmp.unlink(missing_ok=True)


def _offline_fix(pinned: Pinned, url: str, target: Path, why: str) -> str:
    return (f"could not download {pinned.what or pinned.name} from {url} ({why}). On an offline "
            f"node, download it elsewhere ({pinned.checksum}) and either place it at {target} "
            f"(set ${CACHE_ENV} to choose the cache) or pass its local path in the dataset config.")


def _remove_temp_files(folder: Path, name: str) -> None:
    """Delete the temporary files a killed download of `name` left in `folder`."""
    pattern = re.compile(rf"^\.{re.escape(name)}\.[0-9a-f]{{12}}\.tmp$")
    for entry in os.listdir(folder):
        if pattern.match(entry):
            (folder / entry).unlink(missing_ok=True)


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
