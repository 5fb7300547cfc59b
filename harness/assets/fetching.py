"""The assets of a job and `stages=[fetch]`.

A job reads, besides its prompt set: the model's weight files (`model.*_file` keys, from
`model.repo_id` / `tatok_repo` / `vq_repo` / `eagle_head_repo`), its text encoder or LLM repository
(the loader class names the files it reads in `FILES`), the whole-model repositories of a loader
module that names the files it reads in `REPO_FILES` (`model.repo_id`, `model.small_drafter_repo`:
Janus-Pro, loaded through transformers), and what each planned evaluator downloads
(its `assets()`). `fetch` lists them with their sizes, says when everything is already here, and
downloads the rest; `offline_missing` is the check, before generation, that a job without network
(HF_HUB_OFFLINE=1) finds every file, naming each missing one and the command that fetches it.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from omegaconf import DictConfig, ListConfig

from harness.api import InputError
from harness.assets.asset import Asset, Entry, HubFiles, hub_offline

log = logging.getLogger(__name__)
for _client in ("httpx", "httpx2"):  # the hub client's HTTP library logs every request at INFO
    logging.getLogger(_client).setLevel(logging.WARNING)

WEIGHT_KEYS = ("target_file", "drafter_file", "small_drafter_file", "vq_file", "tatok_file", "eagle_head_file",
               "eagle_head_config")
CONDITIONER_KEYS = ("text_encoder", "llm")  # model nodes of a hub repo loaded through transformers
MODEL_REPO_KEYS = {"repo_id": "local_dir", "small_drafter_repo": "small_drafter_local_dir"}  # repo -> local copy
# Whole-repo models (Lumina-mGPT): repo key -> the key of its local copy; the loader's module names the
# files it reads in `HUB_FILES`. Their other files (Chameleon's VQGAN) are local only (`local_dir`).
REPO_KEYS = {"target_repo": "target_path", "drafter_repo": "drafter_path"}


class MissingAssetsError(InputError, FileNotFoundError):
    """Files a job reads that are not on this machine, which is offline."""


def offline() -> bool:
    """Whether this process must not download (HF_HUB_OFFLINE set to a true value): the one switch
    that keeps hub files and the harness's own downloads off the network."""
    return hub_offline()


def repo_of(model: DictConfig, key: str) -> str:
    """The hub repository of a weights key: Tar keeps the VQ decoder in `vq_repo` and the rest in
    `tatok_repo`; LlamaGen keeps all in `repo_id`; a head may name `eagle_head_repo`."""
    if key == "vq_file" and model.get("vq_repo"):
        return str(model.vq_repo)
    if key.startswith("eagle_head") and model.get("eagle_head_repo"):
        return str(model.eagle_head_repo)
    return str(model.get("tatok_repo") or model.get("repo_id"))


def model_assets(model: DictConfig) -> list[Asset]:
    """The hub files a real model config reads (none with random_init, local_dir, or no hub repo)."""
    repo_files = _repo_files(model)
    if repo_files is not None:
        return _model_repos(model, repo_files) + _head_assets(model)
    if model.get("target_repo") and not model.get("random_init"):
        return _repo_assets(model) + _head_assets(model)
    if model.get("random_init") or model.get("local_dir") or not (model.get("repo_id") or model.get("tatok_repo")):
        return []
    by_repo: dict[str, list[str]] = {}
    for key in WEIGHT_KEYS:
        file = model.get(key)
        if isinstance(file, str) and file and "/" not in file:  # a path with folders is a local file
            by_repo.setdefault(repo_of(model, key), []).append(file)
    found: list[Asset] = [HubFiles(f"model {model.get('name')}", repo, tuple(files), model.get("cache_dir"))
                          for repo, files in by_repo.items()]
    for key in CONDITIONER_KEYS:
        node = model.get(key)
        if isinstance(node, DictConfig) and node.get("repo_id") and not node.get("local_path"):
            found.append(conditioner_asset(f"model.{key}", node))
    return found


def conditioner_asset(what: str, node: DictConfig) -> HubFiles:
    """A text encoder / LLM repo as its loader class reads it: its `FILES`, and one weight file at
    least, in the loader's `WEIGHTS` order (safetensors, else .bin)."""
    from hydra.utils import get_class

    from harness.models.hub import WEIGHT_ORDER

    loader = get_class(str(node._target_))
    return HubFiles(what, str(node.repo_id), _loader_files(node), node.get("cache_dir"), required=("config.json",),
                    weights=tuple(tuple(group) for group in getattr(loader, "WEIGHTS", WEIGHT_ORDER)))


def _head_assets(model: DictConfig) -> list[Asset]:
    """The EAGLE head files of a whole-repo model (Lumina-mGPT, Janus-Pro, Emu3) in its own
    `eagle_head_repo` (LANTERN's Lumina-mGPT head), or none (no repo, a path, random_init). A list of
    weight files is the loader's order (LANTERN's: pytorch_model.bin, then model.safetensors): the
    first the repo holds is fetched."""
    repo = model.get("eagle_head_repo")
    if not repo or model.get("random_init"):
        return []
    weights = model.get("eagle_head_file")
    config = model.get("eagle_head_config")
    config_files = (str(config),) if isinstance(config, str) and config and "/" not in config else ()
    if isinstance(weights, ListConfig):
        names = tuple(str(n) for n in weights if "/" not in str(n))
        if not names:
            return []
        return [HubFiles(f"model {model.get('name')} EAGLE head", str(repo), config_files, model.get("cache_dir"),
                         required=config_files, weights=tuple((n,) for n in names))]
    files = tuple(f for f in (str(weights) if isinstance(weights, str) and weights and "/" not in weights else "",
                              *config_files) if f)
    if not files:
        return []
    return [HubFiles(f"model {model.get('name')} EAGLE head", str(repo), files, model.get("cache_dir"))]


def _repo_files(model: DictConfig) -> tuple[str, ...] | None:
    """The `REPO_FILES` patterns of the model loader's module (None: its weights are `*_file` keys)."""
    import importlib

    target = str(model.get("_target_") or "")
    if "." not in target:
        return None
    try:
        module = importlib.import_module(target.rpartition(".")[0])
    except ImportError:
        return None
    files = getattr(module, "REPO_FILES", None)
    return None if files is None else tuple(files)


def _model_repos(model: DictConfig, files: tuple[str, ...]) -> list[Asset]:
    """The whole-model repos of a `REPO_FILES` loader (none with random_init; a repo whose local copy
    is named is read from there)."""
    if model.get("random_init"):
        return []
    return [HubFiles(f"model {model.get('name')}" + ("" if key == "repo_id" else f" ({key})"), str(model.get(key)),
                     files, model.get("cache_dir"), required=("config.json",))
            for key, local in MODEL_REPO_KEYS.items() if model.get(key) and not model.get(local)]


def _repo_assets(model: DictConfig) -> list[Asset]:
    """The repos of a whole-repo model config (target, and the drafter when it has a size), each with
    the files its loader reads, unless a local copy is named."""
    from hydra.utils import get_method

    files = tuple(getattr(sys.modules[get_method(str(model._target_)).__module__], "HUB_FILES", ("*",)))
    found: list[Asset] = []
    for key, local in REPO_KEYS.items():
        role = key.removesuffix("_repo")
        if model.get(key) and not model.get(local) and (role == "target" or model.get("drafter_size") is not None):
            found.append(HubFiles(f"model {model.get('name')} {role}", str(model.get(key)), files,
                                  model.get("cache_dir"), required=("config.json",)))
    return found


def _loader_files(node: DictConfig) -> tuple[str, ...]:
    """The `FILES` patterns of a conditioner node's loader class (every file when it names none)."""
    from hydra.utils import get_class

    return tuple(getattr(get_class(str(node._target_)), "FILES", ("*",)))


def evaluator_assets(evaluators: Sequence[Any]) -> list[Asset]:
    """What the (instantiated, not loaded) evaluators download when they score (their `assets()`)."""
    return [asset for evaluator in evaluators if hasattr(evaluator, "assets") for asset in evaluator.assets()]


@dataclass
class Listed:
    """An asset and its files as the source lists them."""

    asset: Asset
    entries: list[Entry]

    @property
    def to_download(self) -> list[Entry]:
        return [entry for entry in self.entries if not entry.cached]


def listing(assets: Sequence[Asset]) -> list[Listed]:
    """Every asset's files with sizes and cache state (asks each source; downloads nothing)."""
    return [Listed(asset, asset.entries()) for asset in assets]


def table(listed: Sequence[Listed]) -> str:
    """The listing as text: one line per file, then the total still to download."""
    lines = []
    for item in listed:
        for entry in item.entries:
            state = "cached" if entry.cached else "to fetch"
            lines.append(f"  {item.asset.what:<28} {item.asset.source():<52} {entry.name:<44} "
                         f"{_size(entry.size):>10}  {state}")
    todo = [entry for item in listed for entry in item.to_download]
    known = sum(entry.size or 0 for entry in todo)
    unknown = sum(entry.size is None for entry in todo)
    total = f"{len(todo)} files, {_size(known)}" + (f" + {unknown} of unknown size" if unknown else "")
    return "\n".join(lines + [f"  to download: {total}"])


def fetch_assets(assets: Sequence[Asset]) -> list[Listed]:
    """List `assets`, then download what is not cached. Returns the listing made before downloading.

    Raises:
        AssetError: a source cannot be reached, lacks a file, or a download failed (what was fetched
            before is kept; a rerun downloads only the rest).
    """
    listed = listing(assets)
    log.info("assets this job reads:\n%s", table(listed))
    if not any(item.to_download for item in listed):
        log.info("every asset is already on this machine: nothing to download")
        return listed
    for item in listed:
        if item.to_download:
            log.info("fetching %s from %s", item.asset.what, item.asset.source())
            item.asset.download()
    still = [(item.asset, item.asset.missing()) for item in listed]
    gaps = [f"{asset.what}: {', '.join(files)} from {asset.source()}" for asset, files in still if files]
    if gaps:
        raise MissingAssetsError("after fetching, still not on this machine: " + "; ".join(gaps))
    return listed


def offline_missing(assets: Sequence[Asset]) -> list[str]:
    """For an offline job: one line per asset with files not on this machine, naming them and the
    command that fetches them."""
    lines = []
    for asset in assets:
        files = asset.missing()
        if files:
            lines.append(f"{asset.what}: {', '.join(files)} from {asset.source()} (`{asset.command()}`)")
    return lines


def _size(size: int | None) -> str:
    if size is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
