"""A mirror for the files that do not come from the Hugging Face Hub (prompt lists on GitHub, the
GenEval detector on download.openmmlab.com, COCO's val2017.zip, ...).

With `assets.mirror: M` (or `$MULO_BENCH_MIRROR=M`) the URL `https://host/some/path` is read from
`M/host/some/path`: M is an http(s) URL of a server (e.g. `python -m http.server` in the folder) or a
local folder. `wget -x URL` run in the folder lays a file out that way. Hub files keep the hub's own
mirror setting, `HF_ENDPOINT`. Hashes are checked as for a direct download, so a mirror cannot
substitute a pinned file.
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

MIRROR_ENV = "MULO_BENCH_MIRROR"


def mirror() -> str | None:
    """The configured mirror ($MULO_BENCH_MIRROR), or None."""
    return os.environ.get(MIRROR_ENV) or None


def use(value: str | None) -> None:
    """Set the mirror for this process and the processes it starts (the config key `assets.mirror`;
    None keeps what the environment says)."""
    if value:
        os.environ[MIRROR_ENV] = str(value)


def mirrored(url: str) -> str:
    """`url` as read through the mirror: `<mirror>/<host>/<path>` (a `file://` URL for a folder), or
    `url` itself without a mirror."""
    base = mirror()
    if not base:
        return url
    parts = urlsplit(url)
    tail = f"{parts.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    if "://" in base:
        return f"{base.rstrip('/')}/{tail}"
    return (Path(base).expanduser().resolve() / tail).as_uri()
