"""A local model hub and download mirror on 127.0.0.1 for the rehearsal of the real-model path.

The hub speaks the part of the Hugging Face Hub's HTTP API that the real `huggingface_hub` client
uses in `hf_hub_download` and `snapshot_download`:

- `GET /api/models/<org>/<name>[/revision/<rev>]`: the repo's info (`id`, `sha`, `siblings`);
- `GET /api/models/<org>/<name>/tree/<rev>[/<path>]?recursive=...`: its files (path, size, blob id,
  LFS sha256), one page;
- `HEAD|GET /<org>/<name>/resolve/<rev>/<path>`: a file, with `X-Repo-Commit`, `ETag` (the sha256,
  as the hub gives LFS files) and `Content-Length`; `Range: bytes=N-` resumes.

Repositories are folders `<root>/hub/<org>/<name>/`; the commit of a repo is a digest of its listing,
so removing or changing a file makes a new revision, as a push would. Everything else is the mirror
(`assets.mirror`): `GET|HEAD /mirror/<host>/<path>` serves `<root>/mirror/<host>/<path>`.
`truncate` names files whose body is cut short after the headers promised all of it (a dropped
connection); `requests` counts what was served, per path.

Run in a thread (`serve(root)`) or as `python -m tests.rehearsal.hub ROOT PORT_FILE`.
"""
from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub(ThreadingHTTPServer):
    """The server: `root` holds `hub/` and `mirror/`."""

    daemon_threads = True

    def __init__(self, root: Path, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.root = Path(root)
        self.truncate: set[str] = set()
        self.requests: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def repo(self, repo_id: str) -> Path:
        return self.root / "hub" / repo_id

    def files(self, repo_id: str) -> list[str]:
        folder = self.repo(repo_id)
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())

    def commit(self, repo_id: str) -> str:
        listing = "\n".join(f"{name}:{_sha256(self.repo(repo_id) / name)}" for name in self.files(repo_id))
        return hashlib.sha1(f"{repo_id}\n{listing}".encode()).hexdigest()


class Handler(BaseHTTPRequestHandler):
    server: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._route(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._route(body=True)

    def _route(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["mirror"]:
            return self._file(self.server.root.joinpath(*parts), body, {}, path)
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id = "/".join(parts[2:4])
            if not self.server.repo(repo_id).is_dir():
                return self._error(404, "Repository not found", {"X-Error-Code": "RepoNotFound"})
            if len(parts) >= 6 and parts[4] == "tree":
                return self._json(self._tree(repo_id, "/".join(parts[6:])))
            return self._json(self._info(repo_id))
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, name = "/".join(parts[:2]), "/".join(parts[4:])
            if not self.server.repo(repo_id).is_dir():
                return self._error(404, "Repository not found", {"X-Error-Code": "RepoNotFound"})
            file = self.server.repo(repo_id) / name
            if not file.is_file():
                return self._error(404, "Entry not found", {"X-Error-Code": "EntryNotFound"})
            headers = {"X-Repo-Commit": self.server.commit(repo_id), "ETag": f'"{_sha256(file)}"'}
            return self._file(file, body, headers, path)
        return self._error(404, "not found", {})

    def _info(self, repo_id: str) -> dict:
        return {"id": repo_id, "modelId": repo_id, "sha": self.server.commit(repo_id), "private": False,
                "siblings": [{"rfilename": name} for name in self.server.files(repo_id)]}

    def _tree(self, repo_id: str, below: str) -> list[dict]:
        entries = []
        for name in self.server.files(repo_id):
            if below and not name.startswith(below.rstrip("/") + "/"):
                continue
            file = self.server.repo(repo_id) / name
            size = file.stat().st_size
            entries.append({"type": "file", "path": name, "size": size, "oid": _blob_sha1(file),
                            "lfs": {"oid": _sha256(file), "size": size, "pointerSize": 134}})
        return entries

    def _json(self, value) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, headers: dict[str, str]) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        for key, value in {**headers, "X-Error-Message": message}.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _file(self, file: Path, body: bool, headers: dict[str, str], path: str) -> None:
        if not file.is_file():
            return self._error(404, "not found", {})
        data = file.read_bytes()
        start = 0
        span = self.headers.get("Range", "")
        if body and span.startswith("bytes=") and span[6:].split("-")[0].isdigit():
            start = int(span[6:].split("-")[0])
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        self.server.requests[path] += 1
        if path in self.server.truncate or Path(path).name in self.server.truncate:
            self.wfile.write(data[start:start + max(1, (len(data) - start) // 2)])
            self.close_connection = True
            return
        self.wfile.write(data[start:])


def serve(root: Path, port: int = 0) -> Hub:
    """Start the hub on 127.0.0.1 in a daemon thread; `hub.shutdown()` stops it."""
    hub = Hub(root, port)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    return hub


if __name__ == "__main__":
    server = Hub(Path(sys.argv[1]))
    Path(sys.argv[2]).write_text(server.url)
    server.serve_forever()
