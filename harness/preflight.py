"""Before anything is generated: which decoders and evaluators a job runs, whether the model can run
them, and what the job will cost.

Read from the composed config only (no weights are loaded), so a job that cannot finish stops in
seconds, before hours of generation:

- a decoder config lists what it needs from the bundle in `requires` (`drafter`, `small_drafter`,
  `eagle_head`); a model config provides a part when its flag is true (`drafter: true`, the shapes
  worlds), its file or repo is named (`drafter_file: ...`, `small_drafter_repo: ...`, real models;
  a model whose config has `<part>_size` also needs that size: `drafter_repo` + `drafter_size`,
  Lumina-mGPT) or `provides` lists it (random bundles). A model that cannot have a part says why
  in `lacks` (`lacks: {drafter: ...}`: Janus-Pro has no lower-resolution model), and a decoder
  needing it is refused with that reason. MuLo-SD also needs a whole grid ratio r = target size /
  drafter size. A capability that is not a part (`draft_tree`: the model verifies draft-tree nodes
  in scratch cache slots, `sjd_pac`) is assumed unless the model's `lacks` names it.
- an evaluator config lists the prompt sets it can score in `requires` (`dataset:geneval`, ...),
  and the prompt metadata it reads in `needs_metadata` (GenEval: `[tag, include]`): a `.txt`
  prompts file carries none, and a prompt without them is refused once the prompts are read.
- `rows_by_model` (the paper protocols) keeps, per model, the decoders of the paper's table;
  `unavailable` names decoders that cannot run for a stated reason (e.g. not implemented yet).
- with `incompatible: error` (the default) every decoder or evaluator that cannot run is listed in
  one error; with `incompatible: skip` (the paper protocols) each is dropped with its reason logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from harness.api import ConfigValueError, InputError, Prompt
from harness.assets.asset import hub_offline
from harness.assets.fetching import WEIGHT_KEYS, repo_of
from harness.models.hub import DTYPES
from harness.shapes.captions import quoted

log = logging.getLogger(__name__)

PARTS = ("drafter", "small_drafter", "eagle_head")
PROMPT_FILE = "harness.datasets.prompts.prompt_file"  # the loader of dataset=prompt_file (.txt or .jsonl)
INCOMPATIBLE = ("error", "skip")


class IncompatibleError(ConfigValueError):
    """Decoders or evaluators that cannot run on the configured model or prompt set."""


class MissingWeightsError(InputError, FileNotFoundError):
    """Weight files a job needs that are not on this machine, which cannot download them."""


@dataclass
class Plan:
    """What a job will run: the decoders and evaluators kept, and those dropped with their reason."""

    decoders: list[str]
    evaluators: list[str]
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why


# part -> the model key whose null removes a part its `provides` lists (a random Janus-Pro stack
# builds its small drafter from `small_arch`)
REMOVED_BY = {"small_drafter": "small_arch"}


def model_parts(model: DictConfig) -> set[str]:
    """The bundle parts (PARTS) a model config provides, without loading it."""
    listed = {part for part in (model.get("provides") or [])
              if not (part in REMOVED_BY and REMOVED_BY[part] in model and model.get(REMOVED_BY[part]) is None)}
    parts = set()
    for part in PARTS:
        flag, file = model.get(part), model.get(f"{part}_file")
        repo = isinstance(model.get(f"{part}_repo"), str) and bool(model.get(f"{part}_repo"))
        if f"{part}_size" in model:  # a repo with a size (Lumina-mGPT's drafter): both named
            repo = repo and model.get(f"{part}_size") is not None
        named = (isinstance(file, str) and bool(file)) or (isinstance(file, ListConfig) and len(file) > 0)
        if flag is True or named or repo or part in listed:
            parts.add(part)
    return parts


# the model keys that load the target's EAGLE head, and the value that loads none
HEAD_KEYS = {"eagle_head": False, "eagle_head_file": None, "eagle_head_repo": None, "eagle_head_config": None}


def model_for(cfg: DictConfig, decoders: Sequence[str] | None) -> DictConfig:
    """The model config a job builds, fetches and checks for the `decoders` it runs (None: every
    decoder of the job): `cfg.model` without its EAGLE head when none of them requires one, so a head
    that is absent or damaged stops only the jobs that draft with it. The SampleSets stay bound to
    `cfg.model` as written, and the weights digest leaves the head out (provenance.weights_ids), so
    a set is shared by jobs with and without EAGLE rows."""
    chosen = [v for k, v in (cfg.get("decoder") or {}).items() if decoders is None or str(k) in decoders]
    if any(drafts_with_head(node) for node in chosen):
        return cfg.model
    model = cfg.model.copy()
    with open_dict(model):
        for key, off in HEAD_KEYS.items():
            if key in model:
                model[key] = off
    return model


def drafts_with_head(node: DictConfig) -> bool:
    """Whether a decoder config drafts with the target's EAGLE head (`requires: [eagle_head]`)."""
    return "eagle_head" in _requires(node)


def _requires(node: DictConfig) -> list[str]:
    """The `requires` list of a decoder or evaluator config (empty when absent)."""
    return [str(r) for r in (node.get("requires") or [])]


def _part_keys(part: str, model: DictConfig) -> str:
    """The model keys that provide `part`: its file, or for whole-repo models (Lumina-mGPT) its repo and size."""
    if f"{part}_repo" in model and f"{part}_size" in model:
        return f"model.{part}_repo and model.{part}_size"
    if part in REMOVED_BY and REMOVED_BY[part] in model and model.get(REMOVED_BY[part]) is None:
        return f"model.{REMOVED_BY[part]} (null removes the {part})"
    if f"{part}_repo" in model and f"{part}_file" in model:  # a path, or a file name in that hub repo
        return f"model.{part}_file (a path, or with model.{part}_repo a file of that repo)"
    if f"{part}_repo" in model:
        return f"model.{part}_repo"
    return f"model.{part}_file"


def decoder_problem(name: str, node: DictConfig, model: DictConfig) -> str | None:
    """Why decoder `name` cannot run on `model`, or None when it can."""
    lacks = model.get("lacks") or {}
    # a capability outside PARTS (`draft_tree`: scratch cache slots for a tree's nodes) is assumed
    # unless the model's `lacks` names it
    missing = [part for part in _requires(node)
               if (part in PARTS and part not in model_parts(model)) or (part not in PARTS and lacks.get(part))]
    reasons = [f"needs {part}: {lacks[part]}" for part in missing if lacks.get(part)]
    if reasons:
        return "; ".join(reasons)
    if missing:
        return (
            f"needs {' and '.join(missing)}, which model {model.get('name')!r} does not provide "
            f"(set {', '.join(_part_keys(m, model) for m in missing)} or choose another model)"
        )
    target, drafter = model.get("target_size"), model.get("drafter_size")
    if "drafter" in _requires(node) and isinstance(target, int) and isinstance(drafter, int):
        if drafter <= 0 or target % drafter or target == drafter:
            return f"needs a whole grid ratio r = target_size / drafter_size >= 2, got {target} / {drafter}"
    return None


def evaluator_problem(name: str, node: DictConfig, dataset: DictConfig) -> str | None:
    """Why evaluator `name` cannot score the prompt set `dataset`, or None when it can."""
    wanted = [r.split(":", 1)[1] for r in _requires(node) if r.startswith("dataset:")]
    if wanted and dataset.get("name") not in wanted:
        return (
            f"scores only the prompt sets {wanted} (it reads their metadata or references), "
            f"not dataset={dataset.get('name')}"
        )
    needs = needed_metadata(name, node)
    path = None if OmegaConf.is_missing(dataset, "path") else dataset.get("path")
    if needs and dataset.get("_target_") == PROMPT_FILE and not str(path).endswith(".jsonl"):
        return (
            f"reads the prompt metadata {needs}, which a .txt prompts file cannot carry "
            f"(dataset.path={path}); use a .jsonl file whose lines hold these fields"
        )
    return None


def needed_metadata(name: str, node: DictConfig) -> list[str]:
    """The prompt meta keys evaluator `name` reads (its `needs_metadata` list; empty when absent)."""
    needs = node.get("needs_metadata")
    if needs is None:
        return []
    if not isinstance(needs, ListConfig) or not all(isinstance(key, str) for key in needs):
        raise ConfigValueError(f"evaluator.{name}.needs_metadata must be a list of prompt meta keys "
                               f"(e.g. [tag, include]), got {needs!r}")
    return list(needs)


def check_metadata(cfg: DictConfig, jobs: Plan, prompts: Sequence[Prompt]) -> None:
    """Every prompt carries the metadata each planned evaluator reads (`needs_metadata`), checked
    once the prompts are read, before anything is generated. With `incompatible: skip` an evaluator
    that lacks it is dropped from `jobs` (its reason logged), else refused.

    Raises:
        IncompatibleError: naming the evaluator, the first prompt without the fields and its file.
    """
    for name in list(jobs.evaluators):
        needs = needed_metadata(name, cfg.evaluator[name])
        lacking = next((p for p in prompts if any(key not in p.meta for key in needs)), None)
        if lacking is None:
            continue
        path = None if OmegaConf.is_missing(cfg.dataset, "path") else cfg.dataset.get("path")
        why = (f"reads the prompt metadata {needs}, which prompt {lacking.id!r} ({quoted(lacking.text)})"
               f"{f' in {path}' if path else ''} lacks (it has {sorted(lacking.meta)}); give every "
               "prompt these fields")
        if cfg.get("incompatible", "error") == "error":
            raise IncompatibleError(f"evaluator {name} cannot score dataset={cfg.dataset.get('name')}: "
                                    f"{why}, or drop {name} from evaluator=[...]")
        log.warning("skipping %s: %s", name, why)
        jobs.evaluators.remove(name)
        jobs.skipped[name] = why


def unselected_decoders(cfg: DictConfig) -> dict[str, str]:
    """Decoders an experiment configures that `decoder=[...]` on the command line left out, each with
    the reason it is skipped. Such a node holds only the experiment's options (`decoder.mulo_sd.draft.
    window: 8` in main_x2), with no `_target_`: nothing to build."""
    return {
        str(name): f"configured by the experiment but not selected in decoder=[...]; add {name} there "
        "to run it"
        for name, node in (cfg.get("decoder") or {}).items()
        if isinstance(node, DictConfig) and "_target_" not in node
    }


def unselected_evaluators(cfg: DictConfig) -> dict[str, str]:
    """Evaluators a protocol configures that `evaluator=[...]` on the command line left out (e.g.
    `evaluator.clip_score.arch` of protocol=field_parti under evaluator=[speed]): a node with the
    protocol's options only, no `_target_`, is nothing to build; each with the reason it is skipped."""
    return {
        str(name): f"configured by the experiment or protocol but not selected in evaluator=[...]; add {name} "
        "there to run it"
        for name, node in (cfg.get("evaluator") or {}).items()
        if isinstance(node, DictConfig) and "_target_" not in node
    }


def plan(cfg: DictConfig) -> Plan:
    """The decoders and evaluators this job runs.

    Raises:
        IncompatibleError: with `incompatible: error`, listing every decoder and evaluator that
            cannot run and why.
    """
    mode = cfg.get("incompatible", "error")
    if mode not in INCOMPATIBLE:
        raise ConfigValueError(f"incompatible must be one of {list(INCOMPATIBLE)}, got {mode!r}")
    decoders = {str(k): v for k, v in (cfg.get("decoder") or {}).items()}
    skipped = unselected_decoders(cfg)
    decoders = {n: node for n, node in decoders.items() if n not in skipped}
    rows = _rows(cfg)
    if rows is not None:
        for name in list(decoders):
            if name not in rows:
                skipped[name] = f"not a row of this table for model {cfg.model.get('name')}"
                del decoders[name]
    unavailable = {str(k): str(v) for k, v in (cfg.get("unavailable") or {}).items()}
    for name in rows or []:
        if name not in decoders and name not in skipped:
            skipped[name] = unavailable.get(name, _unselected_row(name))
    problems = {n: unavailable[n] for n in decoders if n in unavailable}
    problems |= {
        n: p
        for n, node in decoders.items()
        if n not in problems and (p := decoder_problem(n, node, cfg.model))
    }
    evaluators = {str(k): v for k, v in (cfg.get("evaluator") or {}).items()}
    unselected = unselected_evaluators(cfg)
    evaluators = {n: node for n, node in evaluators.items() if n not in unselected}
    problems |= {n: p for n, node in evaluators.items() if (p := evaluator_problem(n, node, cfg.dataset))}
    if problems and mode == "error":
        lines = "".join(f"\n  {name}: {why}" for name, why in problems.items())
        raise IncompatibleError(
            f"these cannot run with model={cfg.model.get('name')} "
            f"dataset={cfg.dataset.get('name')}:{lines}\nDrop them from decoder=[...] / "
            "evaluator=[...], or pass incompatible=skip to run the rest"
        )
    skipped |= problems
    for name, why in skipped.items():
        log.warning("skipping %s: %s", name, why)
    # an evaluator left out of evaluator=[...] is the selection, not a problem: recorded, said on an
    # info line (protocol=dpg_bench configures the in-process variant it does not run on every job)
    for name, why in unselected.items():
        log.info("not running evaluator %s: %s", name, why)
    skipped |= unselected
    return Plan(
        decoders=[n for n in decoders if n not in problems],
        evaluators=[n for n in evaluators if n not in problems],
        skipped=skipped,
    )


def _unselected_row(name: str) -> str:
    """Why a row of `rows_by_model` that is not among the job's decoders is skipped."""
    return (f"a row of this table that is not among the job's decoders; add {name} to decoder=[...] to run "
            f"it (its config: conf/decoder/{name}.yaml)")


def check(cfg: DictConfig) -> Plan:
    """`plan(cfg)`, and for a generate stage the model's weight files (`missing_weights`).

    Raises:
        IncompatibleError: see `plan`.
        MissingWeightsError: naming every missing file and the command that fetches it.
        ConfigValueError: a decoder asks for a pinned file that does not exist for this model
            (harness/assets/decoders.py).
    """
    jobs = plan(cfg)
    if "generate" in (cfg.get("stages") or []):
        job_decoder_assets(cfg, jobs.decoders)  # an sr network pinned for no such ratio: refused here
    missing = missing_weights(model_for(cfg, jobs.decoders)) if "generate" in (cfg.get("stages") or []) else []
    if missing:
        raise MissingWeightsError(
            f"model {cfg.model.get('name')} cannot be loaded on this machine:"
            + "".join(f"\n  {m}" for m in missing)
            + "\nFetch them on a node with internet (docs/models.md), or unset "
            "HF_HUB_OFFLINE / model.local_dir to download them here"
        )
    return jobs


def _rows(cfg: DictConfig) -> list[str] | None:
    """The decoders `rows_by_model` keeps for this model, or None (no such table: keep all)."""
    table = cfg.get("rows_by_model")
    if not table:
        return None
    name = cfg.model.get("name")
    if name not in table:
        raise ConfigValueError(
            f"experiment {cfg.get('name')!r} has rows for the models {sorted(table)}, "
            f"not model={name}; choose one of them"
        )
    return [str(r) for r in table[name]]


def missing_weights(model: DictConfig) -> list[str]:
    """Weight files of a real model config that are not on this machine when it cannot download:
    `model.local_dir` is set, or HF_HUB_OFFLINE=1. Each entry names the file and the command that
    fetches it. Empty when the model downloads on first use, has random weights or is no hub model."""
    files = [(key, str(model.get(key))) for key in WEIGHT_KEYS if model.get(key)]
    if not files or model.get("random_init") or not (model.get("repo_id") or model.get("tatok_repo")):
        return []
    local = model.get("local_dir")
    if not local and not hub_offline():
        return []
    missing = []
    for key, file in files:
        repo = repo_of(model, key)
        found = (
            (Path(local).expanduser() / file).is_file()
            if local
            else _in_hub_cache(repo, file, model.get("cache_dir"))
        )
        if not found:
            where = f" --local-dir {local}" if local else ""
            missing.append(
                f"model.{key} {file}: fetch it with `hf download {repo} {file}{where}`"
            )
    return missing


def _in_hub_cache(repo: str, file: str, cache_dir: Any) -> bool:
    """Whether `repo/file` is in the Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id=repo, filename=file, cache_dir=cache_dir)
    return isinstance(found, str)


def job_decoder_assets(cfg: DictConfig, names: Sequence[str] | None = None) -> list[Any]:
    """What the decoders `names` (None: every decoder of the job) download (harness/assets/decoders.py)."""
    from harness.assets.decoders import decoder_assets

    chosen = {str(k): v for k, v in (cfg.get("decoder") or {}).items() if names is None or str(k) in names}
    return decoder_assets(chosen, cfg.model)


def fetch_decoder_assets(cfg: DictConfig, names: Sequence[str] | None = None) -> None:
    """Before generation: download what the decoders `names` read and this machine lacks (MuLo-SD's
    pinned sr network, when no `stages=[fetch]` ran), so that no download falls inside a timed
    decode. Offline, `check_offline` has already stopped a job that lacks one.

    Raises:
        AssetError: the download failed (naming the file, its source and the offline fix).
    """
    for asset in job_decoder_assets(cfg, names):
        if asset.missing():
            log.info("fetching %s from %s before generating", asset.what, asset.source())
            asset.download()


def fetch(cfg: DictConfig, evaluators: Sequence[Any] = (), decoders: Sequence[str] | None = None) -> list[str]:
    """Download what a job reads from the network, so that it can later run offline (`stages=[fetch]`,
    on a node with internet): the prompt set's files, the model's weight files and its text encoder
    or LLM repository (only the files the loaders read), what the `decoders` read (None: every
    decoder of the job; MuLo-SD's pinned sr network) and what each of `evaluators` downloads
    (harness/assets). Lists every file with its size before downloading; with everything cached it
    says so and downloads nothing. Returns one line per prompt set / asset.

    Raises:
        AssetError: a source cannot be reached or lacks a file (named, with the fix).
    """
    from hydra.utils import instantiate

    from harness.assets.fetching import evaluator_assets, fetch_assets, model_assets

    fetched = [f"dataset {cfg.dataset.get('name')}: {len(instantiate(_plain(cfg.dataset)))} prompts"]
    listed = fetch_assets(model_assets(model_for(cfg, decoders)) + job_decoder_assets(cfg, decoders)
                          + evaluator_assets(evaluators))
    fetched += [f"{item.asset.what}: {len(item.entries)} files from {item.asset.source()}" for item in listed]
    llm = cfg.model.get("llm")
    if llm is not None and str(llm.get("_target_")) == "harness.models.tar.llm.TarLLM":
        from harness.models.tar.llm import fetched_generation

        fetched.append(f"Tar LLM {llm.get('repo_id')}: effective generation config "
                       f"{fetched_generation(**_plain(llm))}")
    for line in fetched:
        log.info("fetched %s", line)
    return fetched


def check_offline(cfg: DictConfig, evaluators: Sequence[Any], decoders: Sequence[str] | None = None) -> None:
    """On an offline node (HF_HUB_OFFLINE=1), every file the job's stages read is on this machine:
    the model's and the `decoders`' (generate stage; None: every decoder of the job) and the
    evaluators' (evaluate stage). Checked before generation.

    Raises:
        MissingAssetsError: naming every missing file, its source and the command that fetches it.
    """
    from harness.assets.fetching import MissingAssetsError, evaluator_assets, model_assets, offline, offline_missing

    if not offline():
        return
    stages = list(cfg.get("stages") or [])
    assets = (model_assets(model_for(cfg, decoders)) + job_decoder_assets(cfg, decoders) if "generate" in stages else []) + (
        evaluator_assets(evaluators) if "evaluate" in stages else [])
    missing = offline_missing(assets)
    if missing:
        raise MissingAssetsError(
            "HF_HUB_OFFLINE=1 and these files the job reads are not on this machine:"
            + "".join(f"\n  {line}" for line in missing)
            + "\nRun the same command with stages=[fetch] on a node with internet (it fetches all of them), "
            "then copy the caches (HF_HOME, $MULO_BENCH_CACHE) here")


def evaluator_devices(node: Any, key: str) -> list[tuple[str, str]]:
    """Every `device` option of an evaluator config node and its parts (detector, vqa, colour
    classifier), as (config key, value)."""
    found = []
    if isinstance(node, DictConfig):
        for name, value in node.items():
            if name == "device" and (value is None or isinstance(value, str)):
                found.append((f"{key}.device", str(value or "auto")))
            elif isinstance(value, DictConfig):
                found += evaluator_devices(value, f"{key}.{name}")
    return found


def check_evaluate_device(cfg: DictConfig, names: Sequence[str]) -> None:
    """A GPU evaluator (`gpu: true` in its config) whose device resolves to the CPU stops the job,
    unless `evaluate_on_cpu: true` says so: scoring a protocol's images on a CPU takes hours.

    Raises:
        ConfigValueError: naming the evaluator, the device option and its value, and the override.
    """
    if cfg.get("evaluate_on_cpu"):
        return
    for name in names:
        node = cfg.evaluator[name]
        if not node.get("gpu"):
            continue
        for key, value in evaluator_devices(node, f"evaluator.{name}"):
            resolved = ("cuda" if torch.cuda.is_available() else "cpu") if value == "auto" else value
            if resolved.split(":")[0] == "cpu":
                raise ConfigValueError(
                    f"evaluator {name} is a GPU evaluator but would run on the CPU here ({key}={value}, "
                    f"torch.cuda.is_available() is {torch.cuda.is_available()}): it takes hours there. Run the "
                    "evaluate stage on a GPU node, or pass evaluate_on_cpu=true to score on the CPU on purpose")


def evaluate_costs(cfg: DictConfig, names: Sequence[str], images: int) -> list[Any]:
    """The evaluate stage's share of the budget: per planned evaluator (speed excepted: it reads the
    decode statistics), the `images` it scores and its config's `seconds_per_image`."""
    from harness.budget import EvaluateCost

    found = []
    for name in names:
        node = cfg.evaluator[name]
        if str(node.get("_target_", "")).endswith("SpeedEvaluator"):
            continue
        rate = node.get("seconds_per_image")
        found.append(EvaluateCost(name, images, None if rate is None else float(rate)))
    return found


def cpu_dtype_warning(model: DictConfig, device: Any) -> str | None:
    """Why a half-precision model may be slow on this device, or None.

    CPUs without bf16/fp16 matrix units (AVX512-BF16 / AMX) emulate half-precision matmuls: a bf16
    forward of the real configs runs tens of times slower than fp32 there. `device` is a
    torch.device or its name; a dtype name `hub.DTYPES` does not know is left to the model loader.
    Read from `model.dtype`, then `model.llm.dtype` (Tar's LLM stage runs in bf16 beside an fp32 AR-DTok)."""
    if str(getattr(device, "type", device)).split(":")[0] != "cpu":
        return None
    for key in ("dtype", "llm.dtype"):
        dtype = str(OmegaConf.select(model, key, default=None) or "")
        if DTYPES.get(dtype) in (torch.bfloat16, torch.float16):
            return (f"model.{key}={dtype} on the CPU: a CPU without bf16/fp16 matrix units (AVX512-BF16, AMX) "
                    f"emulates half-precision matmuls tens of times slower than fp32 and the timings measure the "
                    f"emulation; pass model.{key}=fp32 for CPU runs, or run on a GPU")
    return None


def _plain(node: DictConfig) -> dict[str, Any]:
    """A config node without its informational `name` key, ready to instantiate."""
    from omegaconf import OmegaConf

    value = OmegaConf.to_container(node, resolve=True)
    assert isinstance(value, dict)
    value.pop("name", None)
    return value


def describe(cfg: DictConfig, jobs: Plan, prompts: int, images: int) -> str:
    """One paragraph: what the job generates (decoders x prompts x images) and what it skips."""
    total = len(jobs.decoders) * images
    text = (
        f"plan: {len(jobs.decoders)} decoders ({', '.join(jobs.decoders)}) x {prompts} prompts x "
        f"{cfg.images_per_prompt} images = {total} images of model {cfg.model.get('name')} on "
        f"{cfg.dataset.get('name')}, scored by {', '.join(jobs.evaluators) or 'no evaluator'}"
    )
    if jobs.skipped:
        text += "; skipped: " + "; ".join(f"{n} ({why})" for n, why in jobs.skipped.items())
    return text


def to_dict(jobs: Plan) -> dict[str, Any]:
    """The plan as run.json records it."""
    return {"decoders": jobs.decoders, "evaluators": jobs.evaluators, "skipped": dict(jobs.skipped)}
