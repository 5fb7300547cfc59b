"""Per-image seeds, sample planning and sharding, and the SampleSet on disk (resume, corruption,
consolidation, completeness, writability)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import harness.store.samples as samples_module
from harness.api import Prompt
from harness.store.samples import (
    CorruptImageError,
    IncompleteSampleSetError,
    NotWritableError,
    SampleMismatchError,
    SampleSet,
    SampleSpec,
    plan,
    sample_id_for,
)
from harness.runtime.seeding import image_seed


def _prompts(n: int) -> list[Prompt]:
    return [
        Prompt(id=f"toy/{i:03d}", text=f"a red square, number {i}", meta={"tag": "colors", "i": i})
        for i in range(n)
    ]


def _image(spec: SampleSpec) -> np.ndarray:
    """A deterministic [12, 10, 3] uint8 image that depends only on the sample's seed."""
    return np.random.default_rng(spec.seed).integers(0, 256, (12, 10, 3), dtype=np.uint8)


def _stats(spec: SampleSpec) -> dict:
    return {"batch_id": "b0", "batch_size": 1, "batch_latency_s": 0.25, "decoder": "toy",
            "target_forwards": 3, "accepted_per_step": "1 2", "rejection_map": "0 1 0 0"}


class _Crash(RuntimeError):
    """Stands in for a job killed mid-run."""


def _generate(samples: SampleSet, specs: list[SampleSpec], crash_after: int | None = None) -> int:
    """The generate stage in miniature: write every pending sample; optionally die after k."""
    written = 0
    for spec in samples.pending(specs):
        if written == crash_after:
            raise _Crash
        samples.write(spec, _image(spec), _stats(spec))
        written += 1
    return written


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --- seeds -------------------------------------------------------------------------------------

def test_image_seed_is_pinned_and_63_bit() -> None:
    # A golden value: changes if the hash, the key layout or the mask ever change.
    assert image_seed(0, "geneval/00042", 0) == 4214946284353122462
    assert 0 <= image_seed(-7, "x", 123456) < 2**63


def test_image_seeds_are_distinct() -> None:
    seeds = {image_seed(g, f"p/{i}", k) for g in range(3) for i in range(50) for k in range(4)}
    assert len(seeds) == 3 * 50 * 4
    assert image_seed(0, "a", 1) != image_seed(0, "a1", 0)  # no ambiguity between the fields


@pytest.mark.parametrize("args", [(0, "", 0), (0, "a", -1), (0.5, "a", 0), (True, "a", 0)])
def test_image_seed_rejects_bad_input(args: tuple) -> None:
    with pytest.raises((TypeError, ValueError)):
        image_seed(*args)


# --- planning ----------------------------------------------------------------------------------

def test_sample_ids_are_safe_and_unique() -> None:
    ids = ["geneval/00042", "geneval-00042", "geneval_00042", "geneval~2d00042", "a b", "a.b",
           "a/b", "a-b", "a_b", "ü/ß", "x_05", "x", "/lead", "...", "long/" * 100]
    made = [sample_id_for(pid, k) for pid in ids for k in (0, 5, 123)]
    assert len(set(made)) == len(made)
    for sample_id in made:
        assert re.fullmatch(r"[A-Za-z0-9_~-]+", sample_id), sample_id
        assert len(sample_id) < 200
    assert sample_id_for("geneval/00042", 3) == "geneval-00042_03"


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_shards_cover_every_sample_exactly_once(num_shards: int) -> None:
    prompts = _prompts(7)
    full = plan(prompts, 2, global_seed=0)
    shards = [plan(prompts, 2, 0, shard=s, num_shards=num_shards) for s in range(num_shards)]
    ids = [spec.sample_id for shard in shards for spec in shard]
    assert sorted(ids) == sorted(spec.sample_id for spec in full)
    assert len(ids) == len(set(ids)) == 14
    for shard in shards:  # split by prompt: both images of a prompt land in the same shard
        prompt_ids = {spec.prompt.id for spec in shard}
        assert len(shard) == 2 * len(prompt_ids)
    again = [plan(prompts, 2, 0, shard=s, num_shards=num_shards) for s in range(num_shards)]
    assert shards == again  # deterministic
    by_id = {spec.sample_id: spec for spec in full}
    assert all(by_id[spec.sample_id] == spec for shard in shards for spec in shard)


def test_plan_rejects_bad_arguments() -> None:
    prompts = _prompts(2)
    with pytest.raises(ValueError, match="unique"):
        plan(prompts + prompts[:1], 1, 0)
    with pytest.raises(ValueError, match="shard"):
        plan(prompts, 1, 0, shard=2, num_shards=2)
    with pytest.raises(ValueError, match="images_per_prompt"):
        plan(prompts, 0, 0)


# --- SampleSet ---------------------------------------------------------------------------------

def test_resume_after_crashes_equals_uninterrupted_run(tmp_path: Path, monkeypatch) -> None:
    specs = plan(_prompts(4), 2, global_seed=3)
    reference = SampleSet(tmp_path / "reference")
    assert _generate(reference, specs) == 8

    resumed = SampleSet(tmp_path / "resumed")
    with pytest.raises(_Crash):
        _generate(resumed, specs, crash_after=3)
    # Second crash between the PNG and its record: the PNG lands, the completion marker does not.
    real_write = samples_module.write_atomic

    def dying_write(path: Path, data: bytes) -> None:
        if path.suffix == ".json":
            raise _Crash
        real_write(path, data)

    monkeypatch.setattr(samples_module, "write_atomic", dying_write)
    with pytest.raises(_Crash):
        _generate(resumed, specs)
    monkeypatch.setattr(samples_module, "write_atomic", real_write)
    orphan = specs[3]  # the sample the second crash was writing
    assert resumed.image_path(orphan.sample_id).exists()
    assert not resumed.record_path(orphan.sample_id).exists()
    (resumed.images_dir / f".{specs[5].sample_id}.png.0123abcd.tmp").write_bytes(b"partial")

    assert [s.sample_id for s in resumed.pending(specs)] == [s.sample_id for s in specs[3:]]
    assert _generate(resumed, specs) == 5
    assert resumed.pending(specs) == []
    assert _files(resumed.root) == _files(reference.root)  # same files, same bytes, no leftovers
    assert resumed.records()["sample_id"].is_unique


def test_truncated_png_is_detected_and_regenerated(tmp_path: Path) -> None:
    specs = plan(_prompts(3), 1, global_seed=0)
    samples = SampleSet(tmp_path)
    _generate(samples, specs)
    victim = samples.image_path(specs[1].sample_id)
    original = victim.read_bytes()
    victim.write_bytes(original[: len(original) // 2])

    with pytest.raises(CorruptImageError, match=re.escape(str(victim))):
        samples.load_image(specs[1].sample_id)
    assert specs[1].sample_id not in set(samples.records()["sample_id"])  # never counted
    assert samples.missing(specs) == [specs[1].sample_id]
    assert [s.sample_id for s in samples.pending(specs)] == [specs[1].sample_id]
    assert not victim.exists() and not samples.record_path(specs[1].sample_id).exists()
    assert _generate(samples, specs) == 1
    assert victim.read_bytes() == original


def test_corrupt_png_of_right_size_is_detected(tmp_path: Path) -> None:
    specs = plan(_prompts(2), 1, global_seed=0)
    samples = SampleSet(tmp_path)
    _generate(samples, specs)
    victim = samples.image_path(specs[0].sample_id)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert samples.missing(specs) == [specs[0].sample_id]
    assert [s.sample_id for s in samples.pending(specs)] == [specs[0].sample_id]


@pytest.mark.parametrize("path", ["images/elsewhere.png", "images/{other}.png", None])
def test_record_path_must_lead_to_its_image(tmp_path: Path, path: str | None) -> None:
    """A record naming another file (even another sample's image, which exists) or none is not a
    complete sample: the completeness check names the record file, and the generate stage redoes it."""
    specs = plan(_prompts(3), 1, global_seed=0)
    samples = SampleSet(tmp_path)
    _generate(samples, specs)
    record_path = samples.record_path(specs[1].sample_id)
    record = json.loads(record_path.read_text())
    record["path"] = None if path is None else path.format(other=specs[2].sample_id)
    record_path.write_text(json.dumps(record))
    assert samples.missing(specs) == [specs[1].sample_id]
    with pytest.raises(IncompleteSampleSetError) as error:
        samples.require_complete(specs)
    assert str(record_path) in str(error.value) and repr(record["path"]) in str(error.value)
    assert _generate(samples, specs) == 1
    samples.require_complete(specs)
    assert len(samples.records()) == 3


def test_round_trip_records_stats_prompts_images(tmp_path: Path) -> None:
    prompts = _prompts(3)
    specs = plan(prompts, 2, global_seed=5)
    samples = SampleSet(tmp_path)
    _generate(samples, specs)
    records = samples.records()
    assert list(records.columns) == [
        "sample_id", "prompt_id", "prompt", "image_index", "seed", "path", "meta"
    ]
    first = records.iloc[0]
    assert first["path"] == f"images/{first['sample_id']}.png"
    assert json.loads(first["meta"]) == {"i": 0, "tag": "colors"}
    assert records["seed"].tolist() == [s.seed for s in sorted(specs, key=lambda s: s.sample_id)]
    stats = samples.stats()
    assert list(stats.columns[:3]) == ["sample_id", "batch_id", "batch_size"]
    assert stats["accepted_per_step"].tolist() == ["1 2"] * 6
    assert samples.prompts() == prompts
    np.testing.assert_array_equal(samples.load_image(specs[4].sample_id), _image(specs[4]))


def test_consolidate_writes_sorted_complete_tables(tmp_path: Path) -> None:
    prompts = _prompts(5)
    # Two shard jobs write into one SampleSet, in an order unrelated to sample ids.
    for shard in (1, 0):
        specs = plan(prompts, 2, 0, shard=shard, num_shards=2)
        _generate(SampleSet(tmp_path), list(reversed(specs)))
    samples_csv, stats_csv = SampleSet(tmp_path).consolidate()
    table, stats = pd.read_csv(samples_csv), pd.read_csv(stats_csv)
    expected = sorted(spec.sample_id for spec in plan(prompts, 2, 0))
    assert table["sample_id"].tolist() == expected
    assert stats["sample_id"].tolist() == expected
    pairs = zip(table["prompt_id"], table["image_index"])
    assert table["seed"].tolist() == [image_seed(0, pid, k) for pid, k in pairs]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_require_complete_lists_missing_ids(tmp_path: Path) -> None:
    specs = plan(_prompts(25), 1, global_seed=0)
    samples = SampleSet(tmp_path)
    samples.write(specs[0], _image(specs[0]), _stats(specs[0]))
    samples.write(specs[3], _image(specs[3]), _stats(specs[3]))
    missing = [s.sample_id for s in specs if s not in (specs[0], specs[3])]
    assert samples.missing(specs) == missing
    with pytest.raises(IncompleteSampleSetError) as error:
        samples.require_complete(specs)
    message = str(error.value)
    assert "23 of 25" in message and ", ..." in message
    assert all(sample_id in message for sample_id in missing[:20])
    assert missing[20] not in message
    samples.require_complete(specs[:1])  # a complete subset passes


def test_root_under_a_regular_file_is_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    samples = SampleSet(blocker / "samples")
    spec = plan(_prompts(1), 1, 0)[0]
    expected = r"results directory .*file/samples is not writable: "
    with pytest.raises(NotWritableError, match=expected):
        samples.write(spec, _image(spec), _stats(spec))
    with pytest.raises(NotWritableError):
        samples.pending([spec])


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_root_is_not_writable(tmp_path: Path) -> None:
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(NotWritableError, match="is not writable"):
            SampleSet(tmp_path / "samples").ensure_writable()
    finally:
        tmp_path.chmod(0o755)


def test_samples_of_another_configuration_are_refused(tmp_path: Path) -> None:
    samples = SampleSet(tmp_path)
    _generate(samples, plan(_prompts(2), 1, global_seed=0))
    with pytest.raises(SampleMismatchError, match="seed"):
        samples.pending(plan(_prompts(2), 1, global_seed=1))


def test_write_validates_its_inputs(tmp_path: Path) -> None:
    spec = plan(_prompts(1), 1, 0)[0]
    samples = SampleSet(tmp_path)
    with pytest.raises(ValueError, match="uint8"):
        samples.write(spec, _image(spec).astype(np.float32), {})
    with pytest.raises(TypeError, match="accepted_per_step"):
        samples.write(spec, _image(spec), {"accepted_per_step": [1, 2]})
    samples.write(spec, _image(spec), {"latency": np.float32(0.5), "n": np.int64(3)})
    assert samples.stats()[["latency", "n"]].iloc[0].tolist() == [0.5, 3]


# --- samples_dir and the condition cache (issue 57) ---------------------------------------------

def test_samples_dir_inside_a_condition_cache_is_refused_but_a_folder_named_conditions_is_not(
        tmp_path: Path) -> None:
    """SampleSets written among a cache's entries would be read as neither; a user's own folder that
    happens to be called conditions/ (no context folders in it) is a valid samples_dir."""
    from harness.api import ConfigValueError
    from harness.checks import check_config
    from tests.conftest import compose_cfg

    cache = tmp_path / "samples" / "conditions"
    (cache / "0123abcd").mkdir(parents=True)
    (cache / "0123abcd" / "context.json").write_text("{}")
    for inside in (cache, cache / "0123abcd", cache / "0123abcd" / "deeper"):
        with pytest.raises(ConfigValueError) as refused:
            check_config(compose_cfg(["+experiment=smoke", f"samples_dir={inside}"]))
        assert f"samples_dir={tmp_path / 'samples'}" in str(refused.value)
    own = tmp_path / "mine" / "conditions"
    own.mkdir(parents=True)
    check_config(compose_cfg(["+experiment=smoke", f"samples_dir={own}"]))
