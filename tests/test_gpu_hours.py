"""benchmarks/gpu_hours.py: its plans are the configs' own, the table in docs/methodology.md is what it prints, and
the paper's main table fits the 160 GPU-hour target on the assumed costs."""
from __future__ import annotations

import pytest

from benchmarks import gpu_hours
from tests.conftest import ROOT, compose_cfg


@pytest.mark.parametrize("protocol", sorted(gpu_hours.PROTOCOLS))
def test_protocol_plans_are_the_configs(protocol: str) -> None:
    cfg = compose_cfg(["+experiment=paper_main", f"protocol={protocol}"])
    plan = gpu_hours.PROTOCOLS[protocol]
    assert (plan.images_per_prompt, plan.batch_size, plan.warmup_batches) == (
        cfg.images_per_prompt, cfg.batch_size, cfg.warmup_batches)
    assert plan.timed == cfg.timing.images and cfg.timing.batch_size == 1
    assert gpu_hours.TIMING_REPS == cfg.timing.reps
    limit = cfg.dataset_limit if cfg.dataset_limit is not None else cfg.dataset.get("n")
    if limit is not None:
        assert plan.prompts == limit


@pytest.mark.parametrize("model", sorted(gpu_hours.MODELS))
def test_model_rows_are_the_runnable_rows_of_paper_main(model: str) -> None:
    """rows_by_model without the EAGLE-head rows of a model that has no head (Tar)."""
    cfg = compose_cfg(["+experiment=paper_main", f"model={model}"])
    head = cfg.model.get("eagle_head_file") or cfg.model.get("eagle_head_repo") or "llamagen" in model
    rows = [d for d in cfg.rows_by_model[model] if head or d not in ("eagle2", "lantern")]
    assert list(gpu_hours.MODELS[model].decoders) == rows
    assert cfg.model.get("target_size", 512) == gpu_hours.MODELS[model].px


def test_documented_table_is_the_estimate_and_fits_the_target() -> None:
    jobs = gpu_hours.estimate()
    assert gpu_hours.table(jobs) in (ROOT / "docs" / "methodology.md").read_text()
    assert gpu_hours.total(jobs) <= gpu_hours.TARGET_H
    before = gpu_hours.estimate(before=True)
    assert gpu_hours.total(before) == pytest.approx(390.5, abs=0.5)  # the table this one replaces
    # shared entries: the 1024 px models and latency compute no LLM entry
    assert all(one.condition_s == 0 for name in ("tar_1.5b_1024", "tar_7b_1024") for one in jobs[name].values())
    assert jobs["tar_1.5b_512"]["latency"].condition_s == 0 < jobs["tar_1.5b_512"]["coco5k"].condition_s
    assert jobs["tar_1.5b_1024"]["geneval"].lines[-1].startswith("tar_1.5b: 0 (")
