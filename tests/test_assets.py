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
from harness.datasets.downloads import ChecksumError, DownloadError, Pinned, fetch, verify
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
    with pytest.raises(ChecksumError) as refused:  # a mirror cannot substitute it
        fetch(pinned, tmp_path / "other")
    message = str(refused.value)
    # the mirror and its variable named, the pin given, no temporary file (already deleted) named
    assert str(tmp_path / "mirror") in message and mirror.MIRROR_ENV in message and pinned.sha256 in message
    assert ".tmp" not in message and "nothing was kept" in message
    assert not list((tmp_path / "other").iterdir())


def test_every_fetched_file_that_decides_a_score_is_pinned(tmp_path: Path) -> None:
    """GenEval's detectors, FID's Inception weights and reference zip, and the prompt and question
    files: each has a hash the download is checked against (a prefix pin only where the publisher
    gives no more, and then the digits its file name carries)."""
    from evaluators.fid import FIDEvaluator
    from evaluators.geneval_detectors import MMDET_CHECKPOINT, OBJECT_NAMES
    from evaluators.geneval_official import DETECTOR, DETECTOR_SHA256, detector_pin
    from harness.datasets import official

    from evaluators.hpsv2 import CHECKPOINTS, hub_pin

    fid_assets = FIDEvaluator(reference="coco_val2017", weights_source="torch_fidelity").assets()
    pins = [OBJECT_NAMES, MMDET_CHECKPOINT, detector_pin(tmp_path), official.COCO_CAPTIONS, official.GENEVAL_METADATA,
            official.DPG_QUESTIONS, official.PARTI_PROMPTS_FILE, *(a.pinned for a in fid_assets),
            *(hub_pin(name) for name in CHECKPOINTS.values())]
    assert len(fid_assets) == 2
    for pinned in pins:
        assert pinned.checksum != "unpinned", pinned.name
        if pinned.sha256_prefix:
            assert pinned.name.rsplit("-", 1)[1].startswith(pinned.sha256_prefix), pinned.name
    assert detector_pin(tmp_path).name == f"{DETECTOR}.pth" and DETECTOR_SHA256.startswith("743b7d99")


def test_prefix_and_md5_pins_check_the_file(tmp_path: Path) -> None:
    data = b"weights"
    path = tmp_path / "w.pth"
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    verify(path, Pinned(name="w.pth", url=URL, sha256_prefix=digest[:8]))
    verify(path, Pinned(name="w.pth", url=URL, md5=hashlib.md5(data).hexdigest()))
    for wrong in (Pinned(name="w.pth", url=URL, sha256_prefix="00000000"), Pinned(name="w.pth", url=URL, md5="0" * 32)):
        with pytest.raises(ChecksumError, match=f"rm {path}"):
            verify(path, wrong)


def test_a_killed_download_leaves_the_cache_as_an_uninterrupted_one(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """The temporary file of a download killed before its rename is removed by the next fetch."""
    pinned = _served(tmp_path, b"hello")
    monkeypatch.setenv(mirror.MIRROR_ENV, str(tmp_path / "mirror"))
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    killed.mkdir()
    (killed / ".file.txt.0123456789ab.tmp").write_bytes(b"hel")  # what SIGKILL leaves mid-download
    (killed / ".other.txt.0123456789ab.tmp").write_bytes(b"x")  # another file's download: not ours to remove
    fetch(pinned, killed)
    fetch(pinned, whole)
    assert sorted(p.name for p in killed.iterdir()) == [".other.txt.0123456789ab.tmp", "file.txt"]
    assert (killed / "file.txt").read_bytes() == (whole / "file.txt").read_bytes()


def test_a_damaged_cached_checkpoint_says_delete_and_fetch_again(tmp_path: Path) -> None:
    """A truncated .pth is not met with trust_pickle (which cannot help); a truncated safetensors
    file is named. A checkpoint holding other objects still names trust_pickle."""
    import pathlib

    import torch
    from safetensors.torch import save_file

    from harness.models.eagle_head import has_head_metadata
    from harness.models.hub import WeightsError, read_checkpoint

    pth, safe = tmp_path / "model.pth", tmp_path / "head.safetensors"
    torch.save({"w": torch.ones(64, 64)}, pth)
    save_file({"w": torch.ones(64, 64)}, str(safe))
    for path in (pth, safe):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(WeightsError) as refused:
            read_checkpoint(path)
        message = str(refused.value)
        assert str(path) in message and f"rm {path}" in message and "fetch it again" in message
        assert "trust_pickle" not in message
    with pytest.raises(WeightsError, match=f"rm {safe}"):
        has_head_metadata(safe)
    odd = tmp_path / "odd.pth"
    torch.save({"w": torch.ones(2), "path": pathlib.PurePosixPath("x")}, odd)
    with pytest.raises(WeightsError, match="trust_pickle: true"):
        read_checkpoint(odd)


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


def test_hpsv2_refuses_a_hub_checkpoint_without_its_pinned_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub's HPS checkpoint decides every hpsv2 score: another file in its place (a stand-in,
    a truncated download) is refused naming it, before any model is built."""
    import evaluators.hpsv2 as hpsv2
    from evaluators.clip_models import MissingModelError

    substitute = tmp_path / "HPS_v2.1_compressed.pt"
    substitute.write_bytes(b"not the checkpoint")
    monkeypatch.setattr(hpsv2, "hf_hub_file", lambda repo, filename, local=None: substitute)
    with pytest.raises(MissingModelError) as refused:
        hpsv2.HPSv2Evaluator(device="cpu").load()
    message = str(refused.value)
    assert f"rm {substitute}" in message and hpsv2.CHECKPOINT_SHA256["HPS_v2.1_compressed.pt"] in message
