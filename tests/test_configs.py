"""Every config group option and every experiment composes and instantiates."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.api import SamplingParams
from harness.run import _build
from tests.conftest import CONF, ROOT, SHARED_DATA, compose_cfg


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_primary_config_composes_with_documented_keys() -> None:
    cfg = compose_cfg()
    assert cfg.name == "default"
    assert "experiment" not in OmegaConf.to_container(cfg)
    assert list(cfg.decoder.keys()), "at least one decoder by default"
    params = instantiate(cfg.sampling)
    assert isinstance(params, SamplingParams)


@pytest.mark.parametrize("name", _options("decoder"))
def test_decoder_options_instantiate(name: str) -> None:
    cfg = compose_cfg([f"decoder=[{name}]", "model=random"])
    decoder = _build(cfg.decoder[name])
    assert hasattr(decoder, "generate") and isinstance(decoder.sampling, SamplingParams)


@pytest.mark.parametrize("name", _options("evaluator"))
def test_evaluator_options_instantiate(name: str) -> None:
    cfg = compose_cfg([f"evaluator=[{name}]", "model=random"])
    ev = _build(cfg.evaluator[name])
    assert ev.name and ev.version and hasattr(ev, "evaluate")


# Official prompt sets read the shared benchmark files (a user's clone downloads them instead).
OFFICIAL_DATASET_PATHS = {
    "coco5k": ("captions", "coco/captions_val2017.json"),
    "geneval": ("metadata", "geneval/evaluation_metadata.jsonl"),
    "dpg_bench": ("prompts", "dpg_bench/prompts"),
    "parti": ("path", "parti/PartiPrompts.tsv"),
}


@pytest.mark.parametrize("name", _options("dataset"))
def test_dataset_options_compose(name: str, tmp_path: Path) -> None:
    overrides = [f"dataset={name}", "model=random"]
    if name == "prompt_file":
        f = tmp_path / "p.txt"
        f.write_text("a red circle\n")
        overrides.append(f"dataset.path={f}")
    if name in OFFICIAL_DATASET_PATHS:
        if not SHARED_DATA.is_dir():
            pytest.skip(f"{SHARED_DATA} is absent; dataset={name} would download its prompt file")
        key, rel = OFFICIAL_DATASET_PATHS[name]
        overrides.append(f"dataset.{key}={SHARED_DATA / rel}")
    cfg = compose_cfg(overrides)
    prompts = _build(cfg.dataset)
    assert prompts and all(p.text for p in prompts)


@pytest.mark.parametrize("name", _options("model"))
def test_model_options_compose(name: str) -> None:
    cfg = compose_cfg([f"model={name}"])
    assert {"temperature", "top_k", "top_p", "cfg_scale"} <= set(cfg.model.sampling.keys())
    if name == "random":
        bundle = _build(cfg.model, drop=("name", "sampling"))
        assert bundle.target.grid == (cfg.model.grid, cfg.model.grid)


@pytest.mark.parametrize("name", _options("experiment"))
def test_experiments_compose(name: str) -> None:
    cfg = compose_cfg([f"+experiment={name}"])
    assert cfg.name == name
    for dec in cfg.decoder.values():
        assert "_target_" in dec


@pytest.mark.parametrize("group", ["decoder", "model", "evaluator", "dataset"])
def test_unknown_option_lists_the_choices(group: str) -> None:
    with pytest.raises((MissingConfigException, ConfigCompositionException)) as err:
        compose_cfg([f"{group}=no_such_option"])
    assert "no_such_option" in str(err.value)
    assert _options(group)[0] in str(err.value), "Hydra lists the available options"


def test_single_decoder_override_replaces_the_list() -> None:
    cfg = compose_cfg(["decoder=raster"])
    assert list(cfg.decoder.keys()) == ["raster"]


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("top_k", 0)])
def test_invalid_sampling_values_name_the_field(field: str, value: float) -> None:
    cfg = compose_cfg([f"sampling.{field}={value}"])
    with pytest.raises(Exception) as err:
        instantiate(cfg.sampling)
    assert f"sampling.{field}" in str(err.value)


@pytest.mark.parametrize("launcher,target", [("local", "BasicLauncher"), ("slurm", "SlurmLauncher"),
                                             ("local_submitit", "LocalLauncher")])
def test_launchers_compose(launcher: str, target: str) -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)


_KEY_LINE = re.compile(r"^\s*([A-Za-z_][\w-]*):(.*)$")
_UNEXPLAINED_OK = {"defaults", "_target_", "name"}  # Hydra's own keys and the option's name


def _key_lines(path: Path) -> list[tuple[int, str, bool]]:
    """(line number, key, explained here) of every block-mapping key of a config file: explained
    when the key's line or the line above it carries a comment. Keys inside flow mappings
    (`arch: {dim: 64, ...}`) belong to their parent's line."""
    found, depth = [], 0
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        match = _KEY_LINE.match(code) if depth == 0 else None
        if match and match.group(1) not in _UNEXPLAINED_OK:
            above = lines[number - 2].strip() if number > 1 else ""
            found.append((number, match.group(1), " #" in line or above.startswith("#")))
        depth += code.count("{") + code.count("[") - code.count("}") - code.count("]")
    return found


def test_every_config_key_is_explained() -> None:
    """Every key of conf/ (experiments aside: they set keys explained where they are defined) is
    explained by a comment in some config file, or named in backquotes in README.md or docs/."""
    files = [p for p in sorted(CONF.rglob("*.yaml")) if not {"local", "experiment"} & set(p.relative_to(CONF).parts)]
    keys = {path: _key_lines(path) for path in files}
    explained = {key for found in keys.values() for _, key, here in found if here}
    docs = "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    quoted = {word for span in re.findall(r"`([^`]+)`", docs) for word in re.findall(r"[A-Za-z_][\w-]*", span)}
    unexplained = [f"{path.relative_to(ROOT)}:{number} {key}" for path, found in keys.items()
                   for number, key, _ in found if key not in explained and key not in quoted]
    assert not unexplained, "config keys without a comment or a mention in the docs:\n" + "\n".join(unexplained)
