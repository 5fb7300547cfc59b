"""The checks of a job's configuration before anything is built: run-level keys (types, ranges,
stages, device, samples_dir, swept_keys), decoder options by their full key, evaluator names. Each
refusal is a ConfigValueError naming the key and the fix (harness/cli.py prints it as one line)."""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import torch
from hydra.errors import HydraException
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from harness.api import INFO_KEYS, ConfigValueError, Decoder, checked_number
from harness.generate import Timing
from harness.runtime import engine
from harness.store.binding import BINDING_FILE

STAGES = ("fetch", "generate", "evaluate")
_ABSENT = object()  # OmegaConf.select's answer for a key a node does not have
_FILE_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.+-]*"  # a plain file name: no folder, not hidden, no ".."


def build(node: DictConfig, drop: tuple[str, ...] = ("name",)) -> Any:
    """Instantiate a config node without its informational keys (`name`; a model's `sampling`
    holds its recommended sampling defaults, which `conf/config.yaml` reads, and its
    `operating_points` the decoders' settings on its world; `requires`, `provides` and `lacks` are
    read by harness/preflight.py; a decoder's `paper_setting` labels rows run otherwise)."""
    conf = OmegaConf.to_container(node, resolve=True)
    assert isinstance(conf, dict)
    for key in (*drop, *INFO_KEYS):
        conf.pop(key, None)
    return instantiate(conf)


def timing_of(cfg: DictConfig) -> Timing:
    """The `timing` node as a Timing (defaults where the config has no such node)."""
    node = cfg.get("timing")
    return Timing.from_config(OmegaConf.to_container(node, resolve=True) if node is not None else {})


def check_config(cfg: DictConfig) -> None:
    """Refuse run-level config values of the wrong type or range, naming the key and the fix."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:  # `???` in a config file: a value only the user can give (dataset.path)
        raise ConfigValueError(f"{', '.join(missing)} must be set (the config leaves it open: ???); add "
                               f"{' '.join(f'{key}=<value>' for key in missing)} to the command line")
    if not isinstance(cfg.get("name"), str) or not cfg.name:
        raise ConfigValueError(f"name must be a non-empty string, got {cfg.get('name')!r}")
    checked_number("seed", cfg.seed, integer=True)
    for key, low in (("batch_size", 1), ("images_per_prompt", 1), ("warmup_batches", 0),
                     ("shard.index", 0), ("shard.count", 1)):
        checked_number(key, OmegaConf.select(cfg, key), integer=True, low=low)
    if cfg.shard.index >= cfg.shard.count:
        raise ConfigValueError(f"shard.index ({cfg.shard.index}) must be below shard.count ({cfg.shard.count}); "
                               "shards are numbered 0 .. count-1")
    for key in ("threads", "dataset_limit"):
        if cfg.get(key) is not None:
            checked_number(key, cfg.get(key), integer=True, low=1)
    checked_number("dataset_start", cfg.get("dataset_start") or 0, integer=True, low=0)
    timing_of(cfg)
    check_published_protocol(cfg)
    if cfg.get("engine", "eager") not in engine.ENGINES:
        raise ConfigValueError(f"engine must be one of {engine.ENGINES}, got {cfg.get('engine')!r}")
    if not isinstance(cfg.device, str):
        raise ConfigValueError(f"device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    _check_device_name(cfg.device)
    stages = list(cfg.get("stages") or [])
    unknown = [s for s in stages if s not in STAGES]
    if not stages or unknown or len(set(stages)) != len(stages):
        problem = f"unknown stage(s) {unknown}" if unknown else "an empty list" if not stages else "repeats"
        raise ConfigValueError(f"stages must be a non-empty list of distinct names from {list(STAGES)}, "
                               f"got {stages} ({problem}); e.g. stages=[generate,evaluate]")
    build(cfg.sampling, drop=())  # SamplingParams checks its own fields
    if not isinstance(cfg.get("overwrite_samples", False), bool):
        raise ConfigValueError(f"overwrite_samples must be true or false, got {cfg.overwrite_samples!r}")
    if not isinstance(cfg.get("report", True), bool):
        raise ConfigValueError(f"report must be true or false, got {cfg.report!r}")
    _check_swept_keys(cfg)
    check_operating_points(cfg)
    samples_dir = cfg.get("samples_dir")
    if samples_dir is not None and (not isinstance(samples_dir, str) or Path(samples_dir).is_file()):
        raise ConfigValueError(f"samples_dir {samples_dir!r} is not a folder; point it at a folder "
                               "of per-decoder SampleSets (or null: <run dir>/samples)")
    inside = _sample_set_files(Path(samples_dir)) if isinstance(samples_dir, str) else []
    if inside:  # one level too deep: the sets would be looked for (or made) inside this set
        raise ConfigValueError(
            f"samples_dir {samples_dir} is itself a SampleSet (it holds {' and '.join(inside)}); "
            "samples_dir names the folder of per-decoder SampleSets, so pass its parent: "
            f"samples_dir={Path(samples_dir).parent}")
    cache = _condition_cache_of(Path(samples_dir).expanduser().absolute()) if isinstance(samples_dir, str) else None
    if cache is not None:  # its SampleSets (and a cache of its own) would land among the entries
        raise ConfigValueError(
            f"samples_dir {samples_dir} is inside the condition cache {cache}; samples_dir names the folder "
            f"that holds it, so pass samples_dir={cache.parent}")


_OPERATING_POINT_READ = re.compile(r"oc\.select:model\.operating_points\.([A-Za-z0-9_.]+)")


def check_operating_points(cfg: DictConfig) -> None:
    """ConfigValueError for a key under `model.operating_points` that no decoder config reads (a
    misspelt key, or a decoder name that does not exist): it would apply to nothing, while run.json
    shows it among the model's settings. The keys read are those the decoder configs select with
    `${oc.select:model.operating_points.<decoder>.<key>,...}` (the config group's files and the
    job's decoder nodes)."""
    points = cfg.model.get("operating_points") if isinstance(cfg.get("model"), DictConfig) else None
    if points is None:
        return
    if not isinstance(points, DictConfig):
        raise ConfigValueError(f"model.operating_points must be a mapping of decoder name -> its settings, got "
                               f"{points!r}")
    read = _operating_point_reads(cfg)
    for decoder, node in points.items():
        mine = sorted(path.split(".", 1)[1] for path in read if path.startswith(f"{decoder}.") and "." in path)
        if not mine:
            readers = sorted({path.split(".", 1)[0] for path in read})
            raise ConfigValueError(f"model.operating_points.{decoder}: no decoder config reads an operating point of "
                                   f"{decoder!r} (those that do: {', '.join(readers) or 'none'}); fix the decoder "
                                   f"name or remove it (~model.operating_points.{decoder})")
        for leaf in _leaves(OmegaConf.to_container(node, resolve=False)):
            if not any(leaf == key or leaf.startswith(f"{key}.") for key in mine):
                close = difflib.get_close_matches(leaf, mine, n=1)
                hint = f" (did you mean {decoder}.{close[0]}?)" if close else ""
                raise ConfigValueError(f"model.operating_points.{decoder}.{leaf} is read by no decoder config, so it "
                                       f"would not apply{hint}; decoder {decoder} reads "
                                       f"{', '.join(mine)}. Fix the key or remove it")


def _operating_point_reads(cfg: DictConfig) -> set[str]:
    """Every `<decoder>.<key>` path below model.operating_points that a decoder config reads."""
    from harness.__main__ import config_dir

    texts = [path.read_text(encoding="utf-8") for path in sorted((config_dir() / "decoder").glob("*.yaml"))]
    decoders = cfg.get("decoder")
    if isinstance(decoders, DictConfig):
        texts.append(str(OmegaConf.to_container(decoders, resolve=False)))
    return {match.rstrip(".") for text in texts for match in _OPERATING_POINT_READ.findall(text)}


def _leaves(tree: Any, prefix: str = "") -> list[str]:
    """The dotted paths of the leaves of a nested mapping (an empty mapping is a leaf)."""
    if not isinstance(tree, dict) or not tree:
        return [prefix.rstrip(".")] if prefix else []
    return [leaf for key, value in tree.items() for leaf in _leaves(value, f"{prefix}{key}.")]


def _condition_cache_of(folder: Path) -> Path | None:
    """The condition cache (a `conditions/` folder holding context folders) that `folder` is or lies in."""
    from harness.store.conditions import CONDITIONS_DIR, CONTEXT_FILE

    for candidate in (folder, *folder.parents):
        if candidate.name == CONDITIONS_DIR and candidate.is_dir() and any(candidate.glob(f"*/{CONTEXT_FILE}")):
            return candidate
    return None


def check_published_protocol(cfg: DictConfig) -> None:
    """Raise ConfigValueError when `cfg.model.name` is listed in `cfg.published_protocols` and
    `cfg.protocol_name` is not one of its protocols; nothing for unlisted models or experiments
    without the key."""
    table = cfg.get("published_protocols")
    model = str(cfg.model.get("name", ""))
    if not table or model not in table:
        return
    allowed = [str(p) for p in table[model]]
    protocol = str(cfg.get("protocol_name") or "")
    if protocol not in allowed:
        raise ConfigValueError(
            f"experiment {cfg.get('name')}: model {model}'s published numbers were measured under "
            f"protocol {' or '.join(allowed)}, not {protocol or 'none'}; pass protocol={allowed[0]}")


def _check_device_name(name: str) -> None:
    """ConfigValueError unless `name` is auto or a device torch knows (cpu, cuda, cuda:N, ...)."""
    if name == "auto":
        return
    try:
        torch.device(name)
    except RuntimeError as err:
        raise ConfigValueError(f"device={name} is not a device torch knows; use device=auto, cpu, "
                               "cuda or cuda:N") from err


def _sample_set_files(folder: Path) -> list[str]:
    """What makes `folder` a SampleSet itself (its binding.json, its records/ folder), if anything."""
    found = [BINDING_FILE] if (folder / BINDING_FILE).is_file() else []
    return found + (["records/"] if (folder / "records").is_dir() else [])


def _check_swept_keys(cfg: DictConfig) -> None:
    """Refuse a `swept_keys` that is not a list of this job's config keys naming single values (a
    typo would add a column of that name holding nothing), suggesting close matches."""
    keys = cfg.get("swept_keys")
    if keys is None:
        return
    if not isinstance(keys, ListConfig):
        raise ConfigValueError(f"swept_keys must be a list of config keys, got {keys!r}; e.g. "
                               f"swept_keys=[{keys}]")
    known = _leaf_keys(OmegaConf.to_container(cfg, resolve=False))
    for key in keys:
        if not isinstance(key, str) or not key:
            raise ConfigValueError(f"swept_keys holds {key!r}, not a config key; name keys such as "
                                   "decoder.mulo_sd.accept.tau")
        if key in known:
            continue
        inside = sorted(k for k in known if k.startswith(f"{key}.") and not k.endswith("._target_"))
        if inside:
            raise ConfigValueError(f"swept_keys names {key!r}, a config node, not a single value; name "
                                   f"the keys that vary, e.g. {', '.join(inside[:4])}")
        close = difflib.get_close_matches(key, sorted(k for k in known if not k.endswith("._target_")), n=3)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ConfigValueError(f"swept_keys names {key!r}, which is not a key of this job's configuration"
                               f"{hint}. Correct it or remove it from swept_keys (a decoder's keys exist "
                               "only when the decoder is selected)")


def _leaf_keys(tree: Any, prefix: str = "") -> set[str]:
    """Dotted keys of the values of a config container (lists and empty nodes are values)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix} if prefix else set()
    found: set[str] = set()
    for key, value in tree.items():
        found |= _leaf_keys(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def build_decoder(name: str, node: DictConfig) -> Decoder:
    """Instantiate decoder `name` from its config node. An option its classes refuse (ValueError,
    TypeError: a wrong type or range) becomes a ConfigValueError naming the option by its full key,
    decoder.<name>.<key>, where Hydra's error names it relative to the inner node (`accept.k`).

    Raises:
        ConfigValueError: the refused option with its value and the refusal.
    """
    try:
        return build(node)
    except Exception as err:  # noqa: BLE001 - re-raised unless an option was refused
        refusal = _innermost(err)
        if not isinstance(refusal, (ValueError, TypeError)):
            raise
        text, relative = str(refusal), _refused_key(node, _instantiated_node(err), str(refusal))
        where = f"decoder.{name}"
        if relative:  # the refusal's own "decoder <key>" gives way to the full key and the value
            where = f"{where}.{relative}={OmegaConf.select(node, relative)}"
            text = re.sub(rf"^decoder (?:\w+ )?{re.escape(relative)} ", "", text)
        raise ConfigValueError(f"{where}: {text}; give a valid value (the decoder's options are "
                               f"documented in its config file, decoder/{name}.yaml)") from err


def _innermost(err: BaseException) -> BaseException:
    """What the decoder's class raised inside Hydra: the first error of `err`'s cause chain that is
    not Hydra's wrapping of it."""
    while isinstance(err, HydraException) and err.__cause__ is not None:
        err = err.__cause__
    return err


def _instantiated_node(err: BaseException) -> str:
    """The node Hydra was instantiating when `err` arose, relative to the decoder ("" = its root):
    the `full_key:` line of Hydra's InstantiationException."""
    found = re.search(r"\nfull_key: (\S+)", str(err))
    return found.group(1) if found else ""


def _refused_key(node: DictConfig, inner: str, message: str) -> str | None:
    """The option of `node` (a dotted key relative to it) that `message` refuses, or None.

    Decoders name their options in refusals as "decoder <key> ..." (`decoder accept.k (pooled) must
    be ...`); failing that, the one option of the node being instantiated (`inner`) whose value the
    message quotes (`invalid literal for int() with base 10: 'wide'`) is taken."""
    named = re.match(r"decoder (?:\w+ )?([\w.]+)", message)
    if named and OmegaConf.select(node, named.group(1), default=_ABSENT) is not _ABSENT:
        return named.group(1)
    sub = OmegaConf.select(node, inner) if inner else node
    if not isinstance(sub, DictConfig):
        return None
    quoted = [key for key, value in sub.items()
              if key != "_target_" and not isinstance(value, (DictConfig, bool)) and value is not None
              and (repr(value) in message if isinstance(value, str) else f"got {value!r}" in message)]
    return f"{inner}.{quoted[0]}".lstrip(".") if len(quoted) == 1 else None


def check_evaluator_name(key: str, name: object) -> None:
    """Refuse an evaluator `name` that is not a plain file name: it names per_sample/<decoder>/<name>.csv."""
    if not isinstance(name, str) or not re.fullmatch(_FILE_NAME, name):
        raise ConfigValueError(
            f"evaluator.{key}.name must be a plain file name (letters, digits, _ . + -, not starting "
            f"with '.'), got {name!r}: it names per_sample/<decoder>/<name>.csv; e.g. "
            f"evaluator.{key}.name={key}")
