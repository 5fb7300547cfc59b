"""harness/assets: the mirror's URL mapping, downloads through a mirror (HTTP and folder), a dropped
connection, and the hub listing of a repo through the real huggingface_hub client against the local
hub (tests/rehearsal/hub.py). The whole fetch-then-offline path is tests/test_rehearsal.py."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from harness.assets import mirror
from harness.assets.asset import AssetError, HubFiles, UrlFile
from harness.assets.fetching import fetch_assets, offline_missing, table
from harness.datasets.downloads import DownloadError, Pinned, fetch
from tests.rehearsal.hub import serve

URL = "https://raw.example.org/org/repo/abc123/data/file.txt"


def test_mirror_maps_host_and_path_for_servers_and_folders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(mirror.MIRROR_ENV, raising=False)
    assert mirror.mirrored(URL) == URL
    monkeypatch.setenv(mirror.MIRROR_ENV, "http://127.0.0.1:8000/m/")
    assert mirror.mirrored(URL) == "http://127.0.0.1:8000/m/raw.example.org/org/repo/abc123/data/file.txt"
    monkeypatch.setenv(mirror.MIRROR_ENV, str(tmp_path))
    assert mirror.mirrored(URL) == (tmp_path / "raw.example.org/org/repo/abc123/data/file.txt").as_uri()


def _served(root: Path, data: bytes) -> Pinned:
    target = root / "mirror" / "raw.example.org" / "org" / "repo" / "abc123" / "data" / "file.txt"
    target.parent.mkdir(parents=True)
    target.write_bytes(data)
    return Pinned(name="file.txt", url=URL, sha256=hashlib.sha256(data).hexdigest(), what="a pinned file")


def test_pinned_download_through_a_folder_mirror_keeps_the_pin(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    pinned = _served(tmp_path, b"hello")
    monkeypatch.setenv(mirror.MIRROR_ENV, str(tmp_path / "mirror"))
    assert fetch(pinned, tmp_path / "cache").read_bytes() == b"hello"
    (tmp_path / "mirror" / "raw.example.org" / "org" / "repo" / "abc123" / "data" / "file.txt").write_bytes(b"evil")
    with pytest.raises(Exception, match="is not the pinned file"):  # a mirror cannot substitute it
        fetch(pinned, tmp_path / "other")


def test_dropped_connection_is_a_download_error_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    pinned = _served(tmp_path, b"x" * 100_000)
    hub = serve(tmp_path)
    try:
        monkeypatch.setenv(mirror.MIRROR_ENV, f"{hub.url}/mirror")
        hub.truncate = {"file.txt"}
        with pytest.raises(DownloadError, match="file.txt"):
            fetch(pinned, tmp_path / "cache")
        assert not list((tmp_path / "cache").iterdir())  # no partial file in the cache
        hub.truncate = set()
        assert fetch(pinned, tmp_path / "cache").stat().st_size == 100_000
    finally:
        hub.shutdown()


def test_hub_listing_sizes_patterns_and_a_missing_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "org" / "model"
    repo.mkdir(parents=True)
    (repo / "config.json").write_text("{}")
    (repo / "model.safetensors").write_bytes(b"w" * 1234)
    (repo / "pytorch_model.bin").write_bytes(b"another format")
    hub = serve(tmp_path)
    try:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        import huggingface_hub.constants as constants

        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # read at import: an earlier test may have set it
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        asset = HubFiles("a model", "org/model", ("config.json", "*.safetensors"), str(tmp_path / "cache"))
        entries = {e.name: e for e in asset.entries()}
        assert set(entries) == {"config.json", "model.safetensors"} and entries["model.safetensors"].size == 1234
        assert not any(e.cached for e in entries.values())
        assert asset.missing() == ["config.json"]
        listed = fetch_assets([asset])
        assert "to download: 2 files" in table(listed)
        assert offline_missing([asset]) == [] and all(e.cached for e in asset.entries())
        gone = HubFiles("a model", "org/model", ("tokenizer.json",), str(tmp_path / "cache"))
        with pytest.raises(AssetError, match="org/model has no file tokenizer.json"):
            gone.entries()
    finally:
        hub.shutdown()


def test_unreachable_mirror_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(mirror.MIRROR_ENV, "http://127.0.0.1:9/m")
    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path))
    with pytest.raises(AssetError, match=r"127.0.0.1:9/m/raw.example.org.*check that the mirror"):
        UrlFile("a file", Pinned(name="file.txt", url=URL)).entries()


def test_fetch_with_the_hub_offline_says_to_unset_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(AssetError, match="HF_HUB_OFFLINE is set, and fetching needs the network: unset it"):
        HubFiles("a model", "org/model", ("config.json",), str(tmp_path)).entries()
