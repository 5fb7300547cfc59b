"""`+experiment=field`: the field's decoders beside MuLo-SD on every model config, under the method
papers' protocols (COCO 2017 for FID and CLIP, PartiPrompts for speed), with what a model cannot run
skipped with its reason, and PartiPrompts read from its pinned source.

The rows need conf/decoder/{sjd_pac,scd,gsd,lantern_pp}.yaml; sjd_entropy is a row only where its
config exists (skipped with a reason otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import preflight
from harness.datasets import downloads
from harness.datasets.downloads import ChecksumError
from harness.datasets.official import PARTI_PROMPTS, PARTI_PROMPTS_FILE, parti
from harness.datasets.prompts import PromptFileError
from harness.run import _build
from tests.conftest import CONF, compose_cfg

REAL = ("llamagen_xl_512", "tar_1.5b_512", "tar_7b_512", "tar_1.5b_1024", "tar_7b_1024")
TINY = ("llamagen_tiny", "tar_tiny", "shapes", "shapes_x2", "random")
BACKBONES = ("lumina_mgpt_512", "lumina_mgpt_1024", "lumina_tiny", "janus_pro_7b", "janus_pro_1b", "janus_tiny",
             "emu3_gen", "emu3_tiny")
EAGLE_ROWS = ("lantern_pp", "eagle2", "lantern")
HAS_ENTROPY = (CONF / "decoder" / "sjd_entropy.yaml").is_file()
ROWS = ["raster", "sjd", "sjd_pac", "scd", "gsd", "lantern_pp", *(["sjd_entropy"] if HAS_ENTROPY else []),
        "eagle2", "lantern", "zipar", "mulo_sd"]
PROTOCOLS = {  # protocol -> (dataset, evaluators, batch size, timing.images, CLIP arch)
    "field_coco": ("coco5k", ["speed", "fid", "clip_score"], 16, 100, "ViT-B-16"),
    "field_parti": ("parti", ["speed", "clip_score"], 1, None, "ViT-B-16"),
}


def _runnable(model: str) -> list[str]:
    """The rows model `model` runs: no EAGLE head on Tar's real configs, Janus-Pro, Emu3 or Lumina-mGPT
    but its 768 px model (LANTERN's head; the stand-ins carry random heads); no MuLo-SD drafter for
    Janus-Pro or Lumina-mGPT below 1024 px."""
    no_head = ((model.startswith(("tar_", "lumina", "janus", "emu3")) and not model.endswith("_tiny"))
               and model != "lumina_mgpt_768")
    no_drafter = model.startswith("janus") or model in ("lumina_mgpt_512", "lumina_mgpt_768")
    return [r for r in ROWS if not (no_head and r in EAGLE_ROWS) and not (no_drafter and r == "mulo_sd")]


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@pytest.mark.parametrize("model", REAL + TINY + BACKBONES)
def test_field_plans_every_row_under_the_protocol(model: str, protocol: str) -> None:
    cfg = compose_cfg(["+experiment=field", f"model={model}", f"protocol={protocol}"])
    dataset, evaluators, batch, timed, arch = PROTOCOLS[protocol]
    assert (cfg.name, cfg.dataset.name, cfg.images_per_prompt, cfg.batch_size) == ("field", dataset, 1, batch)
    assert (cfg.timing.images, cfg.timing.batch_size, cfg.dataset_limit) == (timed, 1, None)
    assert cfg.evaluator.clip_score.arch == arch and cfg.evaluator.clip_score.pretrained == "openai"
    jobs = preflight.plan(cfg)
    assert jobs.decoders == _runnable(model) and jobs.evaluators == evaluators
    assert cfg.decoder.zipar.window == 16
    assert (cfg.decoder.lantern.accept.k, cfg.decoder.lantern.accept.delta) == (1000, 0.4)
    for name, window in (("sjd", 15), ("scd", 15), ("sjd_pac", 53)):  # the released settings (docs/field.md)
        draft = cfg.decoder[name].draft
        assert (draft.window, draft.head, draft.tail) == (window, 3, 10), name
    if not HAS_ENTROPY:
        assert "ARsample" in jobs.skipped["sjd_entropy"]  # the stated reason, not a missing file
    for name in jobs.evaluators:
        assert _build(cfg.evaluator[name], drop=("requires",)).name == name


@pytest.mark.parametrize("model", [m for m in REAL if m.startswith("tar_")])
def test_a_model_without_an_eagle_head_skips_the_tree_rows_with_a_reason(model: str) -> None:
    cfg = compose_cfg(["+experiment=field", f"model={model}"])
    jobs = preflight.plan(cfg)
    for row in EAGLE_ROWS:
        assert row not in jobs.decoders
        assert "eagle_head" in jobs.skipped[row] and "model.eagle_head_file" in jobs.skipped[row]
    assert {"raster", "sjd", "sjd_pac", "scd", "gsd", "mulo_sd"} <= set(jobs.decoders)
    cfg.model.eagle_head_file = "head.safetensors"  # a head trained with baselines.training.train_eagle
    assert set(EAGLE_ROWS) <= set(preflight.plan(cfg).decoders)


def test_field_on_geneval_keeps_the_rows() -> None:
    cfg = compose_cfg(["+experiment=field", "model=llamagen_xl_512", "protocol=geneval"])
    jobs = preflight.plan(cfg)
    assert cfg.dataset.name == "geneval" and cfg.images_per_prompt == 4
    assert jobs.decoders == _runnable("llamagen_xl_512") and jobs.evaluators == ["speed", "geneval_official"]


def test_a_protocol_evaluator_left_out_on_the_command_line_is_skipped() -> None:
    cfg = compose_cfg(["+experiment=field", "model=random", "protocol=field_parti", "evaluator=[speed]"])
    assert "_target_" not in cfg.evaluator.clip_score  # only the protocol's arch / pretrained
    jobs = preflight.plan(cfg)
    assert jobs.evaluators == ["speed"] and "evaluator=[...]" in jobs.skipped["clip_score"]


def test_a_model_the_table_does_not_list_is_refused() -> None:
    cfg = compose_cfg(["+experiment=field"])
    cfg.model.name = "my_model"
    with pytest.raises(preflight.ConfigValueError, match="model=my_model"):
        preflight.plan(cfg)


# ------------------------------------------------------------------------------------------ PartiPrompts


def test_parti_reads_the_official_file(shared_data: Path) -> None:
    path = shared_data / "parti" / "PartiPrompts.tsv"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the PartiPrompts copy of the development setup)")
    prompts = parti(path=str(path))
    assert len(prompts) == PARTI_PROMPTS and len({p.id for p in prompts}) == PARTI_PROMPTS
    assert (prompts[0].id, prompts[0].text, prompts[0].meta["category"]) == ("parti/00000", "bond", "Abstract")
    assert len({p.meta["category"] for p in prompts}) == 12 and len({p.meta["challenge"] for p in prompts}) == 11
    quoted = [p.text for p in prompts if p.text.startswith('"')]
    assert quoted and all(p.text.strip() for p in prompts)  # text as written: no CSV unquoting
    cfg = compose_cfg(["dataset=parti", f"dataset.path={path}", "dataset.limit=3"])
    assert [p.id for p in _build(cfg.dataset)] == ["parti/00000", "parti/00001", "parti/00002"]


def test_parti_pins_the_official_hash(tmp_path: Path) -> None:
    assert PARTI_PROMPTS_FILE.sha256 == "fab29e41bb512a169b56acab4cf2a41dcb675e285df2efcde6640c7dd3c440eb"
    assert "5a657978134374ce28973948331b319adef164bd" in PARTI_PROMPTS_FILE.url
    edited = tmp_path / "PartiPrompts.tsv"
    edited.write_text("Prompt\tCategory\tChallenge\tNote\na cat\tAnimals\tBasic\t\n", encoding="utf-8")
    with pytest.raises(ChecksumError, match="expected fab29e41"):
        parti(path=str(edited))
    assert [p.text for p in parti(path=str(edited), verify=False)] == ["a cat"]
    assert downloads.sha256_file(edited) != PARTI_PROMPTS_FILE.sha256


@pytest.mark.parametrize("text, where", [
    ("prompt,category\nx,y\n", ":1: expected the PartiPrompts header"),
    ("Prompt\tCategory\tChallenge\tNote\na cat\tAnimals\n", ":2: a PartiPrompts row needs 4 tab-separated"),
    ("Prompt\tCategory\tChallenge\tNote\n\tAnimals\tBasic\t\n", ":2: a PartiPrompts row needs 4"),
    ("Prompt\tCategory\tChallenge\tNote\n", "holds no PartiPrompts row"),
])
def test_a_malformed_parti_file_is_refused_naming_the_line(tmp_path: Path, text: str, where: str) -> None:
    bad = tmp_path / "parti.tsv"
    bad.write_text(text, encoding="utf-8")
    with pytest.raises(PromptFileError, match=where):
        parti(path=str(bad), verify=False)


def test_parti_without_the_file_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="leave the path unset to download it"):
        parti(path=str(tmp_path / "absent.tsv"))
