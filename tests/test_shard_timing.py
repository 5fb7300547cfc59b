"""One timing job per protocol: in a sharded job only shard 0 times (harness/run.py, shard_timing);
the merged summary holds one timing per decoder."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.generate import Timing
from harness.run import run, shard_timing
from harness.store.samples import SampleSet
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

DECODERS = ["raster", "zipar", "mulo_sd"]
JOB = ["model=tar_tiny", f"decoder=[{','.join(DECODERS)}]", "dataset_limit=4", "images_per_prompt=1", "batch_size=2",
       "warmup_batches=1", "timing.reps=2", "timing.images=2", "timing.batch_size=1", "evaluator=[speed]",
       "device=cpu", "report=false"]


def test_shard_timing_rule() -> None:
    timing = Timing(images=16)
    assert shard_timing(timing, 0, 8).images == 16
    assert shard_timing(timing, 3, 8).images == 0
    assert shard_timing(timing, 0, 1).images == 16
    assert shard_timing(Timing(images=None), 3, 8).images is None  # every image timed: each shard its own


def test_two_shards_of_a_three_decoder_job_time_once(tmp_path: Path) -> None:
    samples = tmp_path / "samples"
    for index in (0, 1):
        run(compose_cfg([*JOB, "shard.count=2", f"shard.index={index}", "stages=[generate]",
                         f"samples_dir={samples}"]), tmp_path / f"shard{index}")
    run(compose_cfg([*JOB, "stages=[evaluate]", f"samples_dir={samples}"]), tmp_path / "evaluate")
    for decoder in DECODERS:
        sample_set = SampleSet(samples / decoder)
        records = sample_set.records().merge(sample_set.stats(), on="sample_id")
        assert len(records) == 4  # both shards' images
        timed = records[records["timed"].astype(str).str.lower() == "true"]
        # shard 0 holds prompts 0 and 2 (round-robin): its first two images are the timed ones
        assert list(timed["prompt_id"].astype(str)) == list(records["prompt_id"].astype(str))[0::2], decoder
    summary = pd.read_csv(tmp_path / "evaluate" / "summary.csv")
    latency = summary[(summary.metric == "latency_s") & (summary.subset == "all")]
    assert sorted(latency.decoder) == sorted(DECODERS)
