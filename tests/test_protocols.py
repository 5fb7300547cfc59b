"""The paper's protocol experiments on the real model configs: they compose, their plans hold the
protocol's prompt and image counts and the paper's rows for each model, every component they keep
instantiates, and what cannot run is refused (or skipped with its reason) before generation."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from harness import preflight
from harness.api import ConfigValueError
from harness.datasets.prompts import select
from harness.run import _build, run
from tests.conftest import compose_cfg

REAL = ("llamagen_xl_512", "tar_1.5b_512", "tar_7b_512", "tar_1.5b_1024", "tar_7b_1024")
PROTOCOLS = {  # protocol -> (dataset, prompts, images per prompt, evaluators, batch size)
    "geneval": ("geneval", 553, 4, ["speed", "geneval_official"], 16),
    "dpg_bench": ("dpg_bench", 1065, 4, ["speed", "dpg_bench_official"], 16),
    "coco5k": ("coco5k", 5000, 1, ["speed", "fid", "hpsv2"], 16),
    "latency": ("coco5k", 100, 1, ["speed"], 1),
}
RUNNABLE = {  # the paper's rows that run on each model (Tar releases no EAGLE head: no eagle2 / lantern)
    "llamagen_xl_512": ["raster", "eagle2", "lantern", "mulo_sd"],
    "tar_1.5b_512": ["raster", "zipar", "mulo_sd"],
    "tar_7b_512": ["raster", "mulo_sd"],
    "tar_1.5b_1024": ["raster", "zipar", "mulo_sd"],
    "tar_7b_1024": ["raster", "mulo_sd"],
}


def _local_data(cfg: DictConfig, shared: Path) -> None:
    """Point the prompt set at the benchmark files beside the checkout (no download)."""
    local = {
        "geneval": {"metadata": shared / "geneval" / "evaluation_metadata.jsonl"},
        "dpg_bench": {"prompts": shared / "dpg_bench" / "prompts"},
        "coco5k": {"captions": shared / "coco" / "captions_val2017.json"},
    }[cfg.dataset.name]
    for key, path in local.items():
        OmegaConf.update(cfg, f"dataset.{key}", str(path))


@pytest.mark.parametrize("model", REAL)
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_paper_main_plans_the_protocol_for_every_real_model(model: str, protocol: str) -> None:
    cfg = compose_cfg(["+experiment=paper_main", f"model={model}", f"protocol={protocol}"])
    dataset, _, images, evaluators, batch = PROTOCOLS[protocol]
    assert (cfg.dataset.name, cfg.images_per_prompt, cfg.batch_size) == (dataset, images, batch)
    jobs = preflight.plan(cfg)
    assert jobs.decoders == RUNNABLE[model] and jobs.evaluators == evaluators
    if model.startswith("tar"):
        assert "eagle_head" in jobs.skipped["lantern"] and "model.eagle_head_file" in jobs.skipped["lantern"]
    assert cfg.decoder.zipar.window == 16
    assert (cfg.decoder.lantern.accept.k, cfg.decoder.lantern.accept.delta) == (1000, 0.4)
    assert cfg.decoder.lantern.draft._target_ == "baselines.methods.eagle.EagleDraft"
    for name in jobs.decoders:
        decoder = _build(cfg.decoder[name], drop=("name", "requires"))
        assert decoder.sampling.cfg_scale == cfg.model.sampling.cfg_scale
    for name in jobs.evaluators:
        assert _build(cfg.evaluator[name], drop=("requires",)).name == name


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_protocol_prompt_counts(protocol: str, shared_data: Path) -> None:
    cfg = compose_cfg(["+experiment=paper_main", f"protocol={protocol}"])
    _local_data(cfg, shared_data)
    prompts = select(_build(cfg.dataset), cfg.dataset_limit)
    assert len(prompts) == PROTOCOLS[protocol][1]


@pytest.mark.parametrize("ablation", ["upsampling", "pooling", "local", "parallel"])
def test_paper_ablations_run_on_tar(ablation: str) -> None:
    cfg = compose_cfg([f"+experiment=paper_ablation_{ablation}"])
    assert cfg.model.name == "tar_1.5b_512" and cfg.dataset.name == "geneval"
    jobs = preflight.plan(cfg)
    assert "raster" in jobs.decoders and any(d.startswith("mulo") for d in jobs.decoders)
    if ablation == "upsampling":
        assert {"mulo_learned_ce", "mulo_learned_pixel", "mulo_learned_gan"} <= set(jobs.skipped)


def test_incompatible_decoder_fails_before_any_weight_is_read(tmp_path: Path) -> None:
    """llamagen_xl_512's weights are not on this machine: the error must come from the check."""
    cfg = compose_cfg(
        [
            "model=llamagen_xl_512",
            "decoder=[raster,sd,mulo_sd]",
            "evaluator=[speed,geneval_shapes]",
            "dataset_limit=2",
        ]
    )
    with pytest.raises(preflight.IncompatibleError) as err:
        run(cfg, tmp_path / "run")
    assert "sd: needs small_drafter" in str(err.value) and "mulo_sd" not in str(err.value)
    assert not (tmp_path / "run" / "samples").exists()


def test_evaluator_on_the_wrong_prompt_set_fails_before_generation(tmp_path: Path) -> None:
    cfg = compose_cfg(["+experiment=smoke", "evaluator=[speed,dpg_bench]"])
    with pytest.raises(preflight.IncompatibleError, match="dpg_bench: scores only the prompt sets"):
        run(cfg, tmp_path / "run")


def test_skip_mode_runs_the_rest(tmp_path: Path) -> None:
    cfg = compose_cfg(
        ["+experiment=smoke", "decoder=[raster,mulo_sd]", "model.provides=[]", "incompatible=skip"]
    )
    summary = run(cfg, tmp_path / "run")
    assert set(summary.decoder) == {"raster"}


def test_real_model_offline_without_weights_names_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_cfg(
        [
            "model=tar_1.5b_512",
            "decoder=[raster]",
            "evaluator=[speed]",
            "dataset_limit=2",
            f"model.cache_dir={tmp_path / 'hf'}",
        ]
    )
    missing = preflight.missing_weights(cfg.model)
    assert any("ar_dtok_lp_512px.pth" in m and "hf download csuhan/TA-Tok" in m for m in missing)
    assert any("vq_ds16_t2i.pt" in m and "peizesun/llamagen_t2i" in m for m in missing)
    with pytest.raises(preflight.MissingWeightsError) as err:
        run(cfg, tmp_path / "run")
    assert "ar_dtok_lp_512px.pth" in str(err.value)
    assert not (tmp_path / "run" / "samples").exists()


def test_fetch_stage_reads_the_prompt_set_and_stops(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    summary = run(compose_cfg(["+experiment=smoke", "stages=[fetch]"]), tmp_path / "run")
    assert summary.empty and not (tmp_path / "run" / "samples").exists()
    assert "fetched dataset shapes: 64 prompts" in caplog.text  # the whole set, not only the limit


def test_paper_experiment_without_cuda_stops_before_loading_weights(tmp_path: Path) -> None:
    """paper_main requires a GPU: on this CPU machine the generate stage stops with the reason before
    any weight is looked for (llamagen_xl_512's files are not here, so reading one would fail otherwise)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is usable here")
    cfg = compose_cfg(["+experiment=paper_main", "model=llamagen_xl_512", "protocol=latency", "dataset_limit=1"])
    with pytest.raises(ConfigValueError) as err:
        run(cfg, tmp_path / "run")
    text = str(err.value)
    assert "require_cuda" in text and "torch.cuda.is_available() is False" in text
    assert f"torch {torch.__version__}" in text and "download.pytorch.org" in text
    assert not (tmp_path / "run" / "samples").exists()
    fetch_only = compose_cfg(["+experiment=paper_main", "model=tar_tiny", "protocol=latency", "dataset=shapes",
                             "stages=[fetch]"])
    assert run(fetch_only, tmp_path / "fetch").empty  # fetch on a CPU login node is fine
