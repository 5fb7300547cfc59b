"""The field's lossless decoders on every backbone's stand-in (`lumina_tiny`, `janus_tiny`,
`emu3_tiny`): greedy SJD, SCD (both couplings) and SJD-PAC give raster's tokens through each model's
own layout (end-of-row slots, left-padded prompts, draft-tree scratch slots), and a sampled image
does not depend on its batch. SJD-PAC is refused at composition where a model config's `lacks`
names draft-tree slots, with the reason."""
from __future__ import annotations

import pytest
import torch
from omegaconf import open_dict

from baselines.methods.raster import RasterDecoder
from harness import preflight
from harness.api import ModelBundle
from harness.run import _build, guided
from tests.conftest import compose_cfg
from tests.single_thread import single_thread  # noqa: F401  (autouse)

BACKBONES = ("lumina_tiny", "janus_tiny", "emu3_tiny")
PROMPTS = ["a red cube on a table", "two dogs", "a blue bird over a river at dusk"]
LOSSLESS = {"sjd": [], "scd": [], "scd_maximal": ["decoder.scd.draft.coupling=maximal"], "sjd_pac": []}


def _decoder_name(label: str) -> str:
    return "scd" if label.startswith("scd") else label


def _cfg(model: str, label: str, extra: list[str]):
    name = _decoder_name(label)
    return compose_cfg([f"model={model}", f"decoder=[{name}]", *LOSSLESS[label], *extra])


@pytest.fixture(scope="module", params=BACKBONES)
def backbone(request) -> tuple[str, ModelBundle]:
    model = request.param
    return model, _build(compose_cfg([f"model={model}"]).model, drop=("name", "sampling"))


def _runnable(model: str, label: str) -> bool:
    cfg = _cfg(model, label, [])
    name = _decoder_name(label)
    return preflight.decoder_problem(name, cfg.decoder[name], cfg.model) is None


@pytest.mark.parametrize("label", list(LOSSLESS))
def test_lossless_decoders_greedy_equal_raster_on_each_backbone(backbone, label: str) -> None:
    model, bundle = backbone
    if not _runnable(model, label):
        pytest.skip(f"{label} is refused on {model} at composition (test_sjd_pac_is_refused_where_no_tree_slots)")
    cfg = _cfg(model, label, ["sampling.temperature=0.0"])
    decoder = _build(cfg.decoder[_decoder_name(label)])
    models = guided(bundle, decoder.sampling)
    cond = models.condition(PROMPTS)
    raster = RasterDecoder(decoder.sampling).generate(models, cond, [0, 1, 2])
    out = decoder.generate(models, cond, [3, 4, 5])
    assert torch.equal(out.tokens, raster.tokens), f"{label} on {model}"
    assert len(set(raster.tokens.flatten().tolist())) > 4  # not one repeated code


@pytest.mark.parametrize("label", ["scd", "sjd_pac"])
def test_lossless_decoders_sampled_images_do_not_depend_on_the_batch(backbone, label: str) -> None:
    model, bundle = backbone
    if not _runnable(model, label):
        pytest.skip(f"{label} is refused on {model} at composition")
    cfg = _cfg(model, label, ["sampling.temperature=1.0"])
    decoder = _build(cfg.decoder[_decoder_name(label)])
    models = guided(bundle, decoder.sampling)
    seeds = [11, 12, 13]
    together = decoder.generate(models, models.condition(PROMPTS), seeds)
    for i, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
        alone = decoder.generate(models, models.condition([prompt]), [seed])
        assert torch.equal(alone.tokens[0], together.tokens[i]), f"{label} on {model}, image {i}"
        assert alone.stats[0].target_forwards == together.stats[i].target_forwards


def test_sjd_pac_is_refused_where_no_tree_slots() -> None:
    """A model config whose `lacks` names draft_tree refuses SJD-PAC with its reason; every
    backbone's stand-in (Lumina-mGPT's included) has the slots."""
    cfg = _cfg("lumina_tiny", "sjd_pac", [])
    with open_dict(cfg.model):
        cfg.model.lacks = {"draft_tree": "no scratch cache slots for draft-tree nodes"}
    reason = preflight.decoder_problem("sjd_pac", cfg.decoder.sjd_pac, cfg.model)
    assert reason is not None and "draft_tree" in reason and "scratch cache slots" in reason
    for model in (*BACKBONES, "shapes"):
        cfg = _cfg(model, "sjd_pac", [])
        assert preflight.decoder_problem("sjd_pac", cfg.decoder.sjd_pac, cfg.model) is None, model


@pytest.mark.parametrize("model", ["lumina_mgpt_512", "lumina_mgpt_1024", "janus_pro_7b", "emu3_gen"])
def test_paper_main_composes_for_each_backbone(model: str) -> None:
    """The paper's table on a later backbone: raster, ZipAR and MuLo-SD where the model has its
    drafter; the EAGLE-head rows skipped with the reason."""
    jobs = preflight.plan(compose_cfg(["+experiment=paper_main", f"model={model}"]))
    drafter = model in ("lumina_mgpt_1024", "emu3_gen")
    assert jobs.decoders == ["raster", "zipar", *(["mulo_sd"] if drafter else [])]
    assert all("eagle_head" in jobs.skipped[row] for row in ("eagle2", "lantern"))
    assert drafter or "drafter" in jobs.skipped["mulo_sd"]
