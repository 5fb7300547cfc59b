"""Results that cannot lie: a SampleSet is bound to what made it, evaluation scores exactly the
planned samples, a failing evaluator leaves the other rows, and the bindings of shard jobs agree."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from omegaconf import DictConfig

from harness.api import EvalResult, metric_rows
from harness.run import EvaluationFailedError, run
from harness.store.binding import sample_binding
from harness.store.samples import BindingMismatchError, SampleSet
from tests.conftest import compose_cfg

BASE = ["+experiment=smoke", "decoder=[raster]"]


class Broken:
    """An evaluator that always fails (a stand-in for one whose weights are missing)."""

    name = "broken"
    version = "0"

    def evaluate(self, samples: SampleSet) -> EvalResult:
        raise RuntimeError("the broken evaluator failed on purpose")


class CountingEvaluator:
    """Counts the samples it is shown (the real evaluators read them through the same methods)."""

    name = "counting"
    version = "0"

    def evaluate(self, samples: SampleSet) -> EvalResult:
        records, stats = samples.records(), samples.stats()
        return EvalResult(
            summary=metric_rows(
                [
                    {"metric": "records", "value": len(records), "n": len(records)},
                    {"metric": "stats", "value": len(stats), "n": len(stats)},
                    {"metric": "prompts", "value": len(samples.prompts()), "n": len(records)},
                ]
            )
        )


def _cfg(overrides: list[str]) -> DictConfig:
    return compose_cfg([*BASE, *overrides])


def test_evaluation_scores_only_the_planned_samples(tmp_path: Path) -> None:
    run(_cfg(["evaluator=[speed]", "stages=[generate]"]), tmp_path / "gen")  # 4 images
    samples = tmp_path / "gen" / "samples"
    cfg = _cfg(
        [
            "evaluator=[speed]",
            "stages=[evaluate]",
            f"samples_dir={samples}",
            "dataset_limit=2",
            "+evaluator.counting._target_=tests.test_run_integrity.CountingEvaluator",
        ]
    )
    summary = run(cfg, tmp_path / "eval")
    counted = summary[summary.evaluator == "counting"].set_index("metric").value
    assert counted.to_dict() == {"records": 2, "stats": 2, "prompts": 2}
    latency = summary[(summary.metric == "latency_s") & (summary.subset == "all")]
    assert int(latency.n.iloc[0]) == 2
    assert len(pd.read_csv(samples / "raster" / "stats.csv")) == 4  # the set itself keeps all 4


def test_a_failing_evaluator_leaves_the_other_rows(tmp_path: Path) -> None:
    cfg = _cfg(
        [
            "decoder=[raster,zipar]",
            "evaluator=[speed]",
            "+evaluator.broken._target_=tests.test_run_integrity.Broken",
        ]
    )
    with pytest.raises(EvaluationFailedError) as err:
        run(cfg, tmp_path / "run")
    assert "broken on raster, zipar (" in str(err.value)  # one cause, said once for both decoders
    assert "stages=[evaluate]" in str(err.value)
    summary = pd.read_csv(tmp_path / "run" / "summary.csv")
    assert set(summary.decoder) == {"raster", "zipar"} and set(summary.evaluator) == {"speed"}
    assert "speedup_vs_raster" in set(summary.metric)
    # a rerun without the failing evaluator completes, reusing the images
    summary = run(_cfg(["decoder=[raster,zipar]", "evaluator=[speed]"]), tmp_path / "run")
    assert set(summary.decoder) == {"raster", "zipar"}


def test_binding_names_what_makes_images_and_nothing_else() -> None:
    cpu = torch.device("cpu")
    base = sample_binding(_cfg([]), "raster", "w", cpu)
    assert base == sample_binding(
        _cfg(
            [
                "batch_size=1",
                "warmup_batches=3",
                "threads=1",
                "shard.count=2",
                "dataset_limit=3",
                "name=other",
                "timing.reps=5",
                "timing.order=sequential",
                "timing.images=1",
                "timing.batch_size=1",
                "dataset_start=1",
            ]
        ),
        "raster",
        "w",
        cpu,
    )
    for change in (["seed=1"], ["sampling.temperature=0.5"], ["model.grid=16"]):
        assert sample_binding(_cfg(change), "raster", "w", cpu) != base, change
    assert sample_binding(_cfg([]), "raster", "other-weights", cpu) != base


def _shard(samples: Path, index: int, *extra: str) -> DictConfig:
    """A generate-only shard job (index of 2) writing into the shared `samples`."""
    return _cfg(["evaluator=[speed]", "stages=[generate]", f"samples_dir={samples}", "shard.count=2",
                 f"shard.index={index}", *extra])


def test_shard_jobs_share_one_sample_set(tmp_path: Path) -> None:
    samples = tmp_path / "samples"
    for index in (0, 1):
        run(_shard(samples, index), tmp_path / f"shard{index}")
    summary = run(_cfg(["evaluator=[speed]", "stages=[evaluate]", f"samples_dir={samples}"]), tmp_path / "eval")
    assert int(summary[(summary.metric == "latency_s") & (summary.subset == "all")].n.iloc[0]) == 4
    # a shard job under another sampling may not join the set
    with pytest.raises(BindingMismatchError, match="sampling.top_k"):
        run(_shard(samples, 0, "sampling.top_k=3"), tmp_path / "shard_bad")


def test_options_at_their_defaults_leave_the_binding_unchanged() -> None:
    from harness.store.binding import without_defaults

    rule = {"_target_": "baselines.methods.pooled.PooledThresholdRule", "k": 16, "tau": 0.1, "below": 0,
            "confident": None}
    assert without_defaults(rule) == {"_target_": "baselines.methods.pooled.PooledThresholdRule"}
    assert without_defaults({**rule, "below": 2})["below"] == 2
    assert without_defaults({**rule, "tau": 0.3})["tau"] == 0.3
    unknown = {"_target_": "baselines.no_such_module.Rule", "below": 0}
    assert without_defaults(unknown) == unknown  # no signature to read: every key counts
    plain = {"below": 0}  # no _target_: not an option of a callable
    assert without_defaults(plain) == plain
    old = {"format": 1, "decoder": {"accept": {k: v for k, v in rule.items() if k != "below"}}}
    now = {"format": 1, "decoder": {"accept": rule}}
    assert without_defaults(old) == without_defaults(now)
    now["decoder"]["accept"] = {**rule, "below": 1}
    assert without_defaults(old) != without_defaults(now)


def test_a_set_stored_before_an_option_existed_is_resumed(tmp_path: Path) -> None:
    """A set whose binding lacks an option (made before it existed) is resumed by a run that binds
    the option at its default, and refused by one that binds another value, naming the key."""
    cfg = ["decoder=[mulo_sd]", "evaluator=[speed]", "stages=[generate]", "dataset_limit=2"]
    run(_cfg(cfg), tmp_path / "run")
    samples = SampleSet(tmp_path / "run" / "samples" / "mulo_sd")
    binding = samples.binding()
    assert binding is not None and binding["decoder"]["accept"]["below"] == 0
    del binding["decoder"]["accept"]["below"]  # as stored before accept.below existed
    (samples.root / "binding.json").write_text(json.dumps(binding))
    made = {p.name: p.stat().st_mtime_ns for p in samples.images_dir.iterdir()}
    run(_cfg(cfg), tmp_path / "run")
    assert {p.name: p.stat().st_mtime_ns for p in samples.images_dir.iterdir()} == made  # nothing redrawn
    assert "below" not in samples.binding()["decoder"]["accept"]  # the stored file is kept as it was
    with pytest.raises(BindingMismatchError, match="decoder.accept.below"):
        run(_cfg([*cfg, "decoder.mulo_sd.accept.below=1"]), tmp_path / "run")


def test_a_set_bound_before_filter_order_existed_matches_the_default_order() -> None:
    from harness.store.binding import compared

    old = {"sampling": {"temperature": 1.0, "top_k": None, "top_p": 1.0, "cfg_scale": 1.5}}
    now = {"sampling": {**old["sampling"], "filter_order": "top_k_first"}}
    assert compared(old) == compared(now)
    assert compared(old) != compared({"sampling": {**now["sampling"], "filter_order": "top_p_first"}})
    assert compared(old)["sampling"]["cfg_scale"] == 1.5  # keys off their default stay


def test_informational_keys_leave_the_binding_and_old_sets_holding_them_resume(tmp_path: Path) -> None:
    """What a model lacks or a decoder requires makes no image: changing it keeps the binding, and a
    set stored while bindings still held those keys is resumed without a redraw."""
    cpu = torch.device("cpu")
    base = sample_binding(_cfg([]), "raster", "w", cpu)
    for change in (["+model.lacks={drafter: none here}"], ["+decoder.raster.requires=[draft_tree]"],
                   ["+decoder.raster.paper_setting={k: 1}"]):
        assert sample_binding(_cfg(change), "raster", "w", cpu) == base, change
    assert "lacks" not in base["model"] and "requires" not in base["decoder"]
    cfg = ["evaluator=[speed]", "stages=[generate]", "dataset_limit=2"]
    run(_cfg(cfg), tmp_path / "run")
    samples = SampleSet(tmp_path / "run" / "samples" / "raster")
    binding = samples.binding()
    binding["model"]["lacks"] = {"drafter": "as stored before"}  # as bound before INFO_KEYS left bindings
    binding["decoder"]["requires"] = ["draft_tree"]
    (samples.root / "binding.json").write_text(json.dumps(binding))
    made = {p.name: p.stat().st_mtime_ns for p in samples.images_dir.iterdir()}
    run(_cfg(cfg), tmp_path / "run")
    assert {p.name: p.stat().st_mtime_ns for p in samples.images_dir.iterdir()} == made  # nothing redrawn
    with pytest.raises(BindingMismatchError, match="seed"):
        run(_cfg([*cfg, "seed=7"]), tmp_path / "run")
