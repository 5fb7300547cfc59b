"""The official prompt-set loaders on ../shared/data, plus their bad-input errors and the pinned download."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.datasets import downloads
from harness.datasets.prompts import PromptFileError
from harness.datasets.official import (DPG_PROMPTS, GENEVAL_PROMPTS, coco5k, dpg_bench, geneval,
                                       prompt_set_digest, read_dpg_prompts)
from harness.datasets.downloads import ChecksumError, DownloadError, Pinned
from harness.run import _build
from tests.conftest import compose_cfg


def test_coco_longest_reproduces_lantern_list_exactly(shared_data: Path) -> None:
    prompts = coco5k(captions=str(shared_data / "coco" / "captions_val2017.json"))
    lantern = json.loads((shared_data / "coco" / "captions_val2017_longest.json").read_text())
    assert [p.text for p in prompts] == lantern
    assert len({p.id for p in prompts}) == 5000


def test_coco_first_matches_lowest_annotation_id_list(shared_data: Path) -> None:
    prompts = coco5k(captions=str(shared_data / "coco" / "captions_val2017.json"), caption_rule="first")
    rows = [json.loads(line) for line in (shared_data / "coco" / "coco2017_val_5k.jsonl").read_text().splitlines()]
    expected = {row["image_id"]: row["caption"] for row in rows}
    assert {p.meta["image_id"]: p.text.strip() for p in prompts} == expected
    assert {p.meta["file_name"] for p in prompts} == {row["file_name"] for row in rows}


def test_coco_random_is_seeded_and_order_independent(shared_data: Path) -> None:
    path = str(shared_data / "coco" / "captions_val2017.json")
    a, b = coco5k(captions=path, caption_rule="random", seed=1), coco5k(captions=path, caption_rule="random", seed=1)
    c = coco5k(captions=path, caption_rule="random", seed=2)
    assert [p.text for p in a] == [p.text for p in b]
    assert sum(x.text != y.text for x, y in zip(a, c)) > 1000
    assert coco5k(captions=path, caption_rule="random", seed=1, limit=3) == a[:3]


def test_geneval_loader(shared_data: Path) -> None:
    prompts = geneval(metadata=str(shared_data / "geneval" / "evaluation_metadata.jsonl"))
    assert len(prompts) == GENEVAL_PROMPTS
    assert prompts[42].id == "geneval/00042"
    lines = (shared_data / "geneval" / "generation_prompts.txt").read_text().splitlines()
    assert [p.text for p in prompts] == lines
    assert {p.meta["tag"] for p in prompts} == {"single_object", "two_object", "counting", "colors",
                                                "position", "color_attr"}


def test_dpg_loader_folder_and_jsonl_agree(shared_data: Path) -> None:
    folder = dpg_bench(prompts=str(shared_data / "dpg_bench" / "prompts"))
    jsonl = dpg_bench(prompts=str(shared_data / "dpg_bench" / "dpg_prompts.jsonl"))
    assert len(folder) == DPG_PROMPTS and folder == jsonl
    rows = [json.loads(line) for line in (shared_data / "dpg_bench" / "dpg_prompts.jsonl").read_text().splitlines()]
    assert [p.meta["item_id"] for p in folder] == [r["item_id"] for r in rows]  # the file's order


def test_dpg_loader_rejects_a_modified_set(shared_data: Path, tmp_path: Path) -> None:
    items = read_dpg_prompts(shared_data / "dpg_bench" / "prompts")
    items["0"] += " extra"
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"item_id": k, "prompt": v}) + "\n" for k, v in items.items()))
    with pytest.raises(PromptFileError, match="not the official set"):
        dpg_bench(prompts=str(path))
    assert len(dpg_bench(prompts=str(path), verify=False)) == DPG_PROMPTS
    assert prompt_set_digest(items) != prompt_set_digest(read_dpg_prompts(shared_data / "dpg_bench" / "prompts"))


def test_bad_rows_name_the_line(tmp_path: Path) -> None:
    meta = tmp_path / "meta.jsonl"
    meta.write_text('{"tag": "single_object", "include": [{"class": "cow", "count": 1}], "prompt": "a cow"}\n'
                    '{"tag": "single_object", "include": [{"class": "cow"}], "prompt": "a cow"}\n')
    with pytest.raises(PromptFileError, match=r"meta.jsonl:2: 'include'"):
        geneval(metadata=str(meta), verify=False)
    meta.write_text('{"tag": "x", "include": [], "prompt": "p"}\nnot json\n')
    with pytest.raises(PromptFileError, match=r"meta.jsonl:1"):
        geneval(metadata=str(meta), verify=False)
    jsonl = tmp_path / "dpg.jsonl"
    jsonl.write_text('{"item_id": "a", "prompt": "x"}\n{"item_id": 3}\n')
    with pytest.raises(PromptFileError, match=r"dpg.jsonl:2"):
        dpg_bench(prompts=str(jsonl), verify=False)


def test_local_file_with_wrong_hash_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "captions_val2017.json"
    bad.write_text('{"images": [], "annotations": []}')
    with pytest.raises(ChecksumError, match="expected afe3b30e"):
        coco5k(captions=str(bad))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        geneval(metadata=str(tmp_path / "absent.jsonl"))


def test_fetch_caches_verifies_and_explains_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "src.txt"
    source.write_bytes(b"hello\n")
    sha1 = downloads.git_blob_sha1(source)
    assert sha1 == "ce013625030ba8dba906f756967f9e9ca394464a"  # git hash-object of "hello\n"
    cache = tmp_path / "cache"
    good = Pinned(name="f.txt", url=source.as_uri(), git_sha1=sha1)
    assert downloads.fetch(good, cache).read_bytes() == b"hello\n"
    source.unlink()  # cached now: no download needed
    assert downloads.fetch(good, cache).read_bytes() == b"hello\n"
    with pytest.raises(DownloadError, match="offline node"):
        downloads.fetch(Pinned(name="g.txt", url=source.as_uri(), git_sha1=sha1), cache)
    source.write_bytes(b"tampered\n")
    with pytest.raises(ChecksumError):
        downloads.fetch(Pinned(name="h.txt", url=source.as_uri(), git_sha1=sha1), cache)
    assert not (cache / "h.txt").exists() and not list(cache.glob(".*.tmp"))


def test_dataset_configs_compose(shared_data: Path) -> None:
    cfg = compose_cfg(["dataset=geneval", f"dataset.metadata={shared_data}/geneval/evaluation_metadata.jsonl"])
    assert len(_build(cfg.dataset)) == GENEVAL_PROMPTS
    cfg = compose_cfg(["dataset=coco5k", f"dataset.captions={shared_data}/coco/captions_val2017.json",
                       "dataset.limit=4"])
    assert len(_build(cfg.dataset)) == 4
    cfg = compose_cfg(["dataset=dpg_bench", f"dataset.prompts={shared_data}/dpg_bench/prompts", "dataset.limit=2"])
    assert [p.id for p in _build(cfg.dataset)] == ["dpg_bench/0", "dpg_bench/1"]


def test_evaluator_configs_instantiate_without_loading_models(shared_data: Path, tmp_path: Path) -> None:
    names = f"{shared_data}/geneval/object_names.txt"
    overrides = {"fid": ["evaluator.fid.weights_source=torch_fidelity"],
                 "hpsv2": [], "clip_score": [], "dpg_bench": [],
                 "geneval": [f"evaluator.geneval.detector.object_names_path={names}"],
                 "geneval_hf": [f"evaluator.geneval_hf.detector.object_names_path={names}"]}
    for name, extra in overrides.items():
        cfg = compose_cfg([f"evaluator=[{name}]", *extra])
        evaluator = _build(cfg.evaluator[name], drop=())
        assert evaluator.name == name and isinstance(evaluator.version, str)
