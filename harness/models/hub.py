"""Official weights: find a file (local path or Hugging Face Hub download into a cache), read its
state dict (`torch.load(weights_only=True)` or safetensors) and load it strictly, with errors that
name the file, the repo and the keys that do not match."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor, nn

from harness.api import InputError

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


class WeightsError(InputError, RuntimeError):
    """A weights file is missing, unreadable or does not match the architecture."""


def dtype_of(name: str) -> torch.dtype:
    """'bf16' | 'fp16' | 'fp32' (or the long names) -> torch dtype."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def resolve(repo_id: str, filename: str, local_path: str | None = None, cache_dir: str | None = None) -> Path:
    """Path of `filename`: `local_path` when given (a file, or a folder holding `filename`),
    else the Hub file `repo_id/filename` downloaded into `cache_dir` (default: the HF cache)."""
    if local_path:
        path = Path(local_path).expanduser()
        path = path / filename if path.is_dir() else path
        if not path.is_file():
            raise WeightsError(f"weights file {path} does not exist (expected {filename} from the Hugging "
                               f"Face repo {repo_id}); fix the path or pre-download it with "
                               f"`hf download {repo_id} {filename} --local-dir DIR`")
        return path
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as err:  # pragma: no cover - huggingface_hub is a dependency
        raise WeightsError("huggingface_hub is needed to download weights: "
                           "pip install huggingface_hub") from err
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, cache_dir=cache_dir))
    except Exception as err:  # noqa: BLE001 - network, auth, missing file, offline mode: all reported alike
        raise WeightsError(
            f"could not download {filename} from the Hugging Face repo {repo_id} "
            f"({type(err).__name__}: {err}). On a node without internet, pre-download it elsewhere with "
            f"`hf download {repo_id} {filename} --local-dir DIR` and pass the local path "
            f"(or copy the HF cache and set HF_HOME / HF_HUB_OFFLINE=1)") from err


# Weight formats in the order transformers' from_pretrained reads them: safetensors (single or sharded),
# else the pickled .bin files. A repo is fetched with the first format it holds, never both.
WEIGHT_ORDER: tuple[tuple[str, ...], ...] = (("*.safetensors", "model.safetensors.index.json"),
                                             ("*.bin", "pytorch_model.bin.index.json"))


def weight_files(folder: Path, patterns: Sequence[str]) -> list[str]:
    """The files of `folder` (top level) matching one of `patterns`."""
    from fnmatch import fnmatch

    return sorted(p.name for p in folder.iterdir() if (p.is_file() or p.is_symlink())
                  and any(fnmatch(p.name, pattern) for pattern in patterns))


def weights_snapshot(repo_id: str, local_path: str | None, cache_dir: str | None, files: Sequence[str],
                     order: Sequence[Sequence[str]] = WEIGHT_ORDER) -> str:
    """`snapshot` of `files` plus the repo's weights in the loader's `order`: the first format the
    repo holds (an earlier format found, the later ones are not downloaded).

    Raises:
        WeightsError: the folder holds no weight file of any format in `order`.
    """
    folder = Path(snapshot(repo_id, local_path, cache_dir, [*files, *order[0]]))
    for patterns in order:
        if weight_files(folder, patterns):
            return str(folder)
        if not local_path:
            folder = Path(snapshot(repo_id, None, cache_dir, [*files, *patterns]))
            if weight_files(folder, patterns):
                return str(folder)
    wanted = ", then ".join(p[0] for p in order)
    raise WeightsError(f"{local_path or f'the Hugging Face repo {repo_id}'} holds no weight file ({wanted}, in the "
                       "order the loader reads them); check the repo id, or fetch it with stages=[fetch]")


def snapshot(repo_id: str, local_path: str | None = None, cache_dir: str | None = None,
             allow_patterns: Sequence[str] | None = None) -> str:
    """A local folder of a Hub repo (transformers models): `local_path`, or a snapshot download of the
    files matching `allow_patterns` (None: every file; loaders name what they read, so that a repo
    holding several weight formats is not downloaded several times)."""
    if local_path:
        if not Path(local_path).expanduser().is_dir():
            raise WeightsError(f"model folder {local_path} does not exist (expected a copy of the Hugging "
                               f"Face repo {repo_id}; pre-download it with "
                               f"`hf download {repo_id} "
                               f"--local-dir {local_path}`)")
        return str(Path(local_path).expanduser())
    from huggingface_hub import snapshot_download

    try:
        patterns = list(allow_patterns) if allow_patterns is not None else None
        return snapshot_download(repo_id=repo_id, cache_dir=cache_dir, allow_patterns=patterns)
    except Exception as err:  # noqa: BLE001
        raise WeightsError(
            f"could not download the Hugging Face repo {repo_id} ({type(err).__name__}: {err}). "
            f"On a node without internet, pre-download it with "
            f"`hf download {repo_id} --local-dir DIR` (or run stages=[fetch]) and pass "
            f"DIR as the local path") from err


def hub_revision(repo_id: str | None, folder: str) -> str | None:
    """`repo@commit` of a hub snapshot folder (`.../snapshots/<commit>`), or None (a local copy)."""
    parts = Path(folder).parts
    if not repo_id or len(parts) < 2 or parts[-2] != "snapshots":
        return None
    return f"{repo_id}@{parts[-1]}"


def pretrained_strict(cls: Any, folder: str, family: str, repo_id: str | None, dtype: torch.dtype) -> Any:
    """`cls.from_pretrained(folder)` (a transformers model class) in eval mode, refused with a
    WeightsError when the checkpoint lacks a key of the architecture its config.json builds, holds one
    it lacks, or differs in a shape (transformers' own loading report, which it only warns about)."""
    try:
        model, info = cls.from_pretrained(folder, dtype=dtype, output_loading_info=True)
    except (OSError, ValueError) as err:
        raise WeightsError(f"cannot load {family} model from {folder} (repo {repo_id}): {err}") from err
    problems = {kind: sorted(map(str, info.get(kind) or [])) for kind in
                ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(problems.values()):
        listed = "; ".join(f"{kind.replace('_', ' ')} [{', '.join(keys[:20])}"
                           f"{f', ... ({len(keys)} in all)' if len(keys) > 20 else ''}]"
                           for kind, keys in problems.items() if keys)
        raise WeightsError(f"{folder} does not match the {family.split()[-1]} architecture of its config.json: {listed}")
    log.info("loaded %s %s from %s", family.split()[-1], repo_id or "", folder)
    return model.eval()


def read_checkpoint(path: Path, trust_pickle: bool = False) -> Any:
    """The object stored in `path`: safetensors -> dict of tensors; otherwise `torch.load` with
    `weights_only=True` (argparse.Namespace allowed, as training scripts store their args), or a
    full unpickle when `trust_pickle` (only for files from a trusted source)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: a damaged file either way
            raise damaged(path, err) from err
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=not trust_pickle, mmap=True)
    except Exception as err:  # noqa: BLE001
        if not trust_pickle and _refused_global(err):
            raise WeightsError(f"cannot read checkpoint {path} with torch.load(weights_only=True): it stores "
                               f"objects other than tensors ({_first_line(err)}). If the file comes from a "
                               "trusted source, set trust_pickle: true in the model config") from err
        raise damaged(path, err) from err


def damaged(path: Path, err: BaseException) -> WeightsError:
    """The error for a weights file that cannot be read at all (truncated, damaged, not the format
    its name says): it names the file and says to delete it and fetch it again."""
    return WeightsError(f"weights file {path} is damaged or truncated ({type(err).__name__}: {_first_line(err)}); "
                        f"delete it (rm {path}) and fetch it again (stages=[fetch], or the download that made it)")


def _refused_global(err: BaseException) -> bool:
    """Whether torch.load(weights_only=True) refused an object it may not unpickle (what trust_pickle
    allows), as opposed to a file it could not read."""
    text = str(err)
    return "Unsupported global" in text or "Unsupported operand" in text or "GLOBAL" in text


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:300] if lines else ""


NESTED = ("model", "module", "state_dict")


def state_dict_of(obj: Any, path: Path, nested: tuple[str, ...] = NESTED) -> dict[str, Tensor]:
    """The tensor mapping inside a checkpoint object: the first of `nested` keys that holds a
    mapping (recursively, e.g. Tar's {'model': {'sd': ...}}), else the object itself."""
    for key in nested:
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            return state_dict_of(obj[key], path, nested)
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise WeightsError(f"{path} holds no state dict (looked under {list(nested)})")
    prefixes = ("_orig_mod.", "module.")
    out = dict(obj)
    for p in prefixes:  # torch.compile / DDP wrappers
        if out and all(k.startswith(p) for k in out):
            out = {k[len(p):]: v for k, v in out.items()}
    return out


def load_strict(module: nn.Module, state: Mapping[str, Tensor], path: Path | str, what: str,
                assign: bool = False) -> None:
    """`module.load_state_dict(state, strict=True)` with an error listing missing / unexpected /
    mis-shaped keys and naming the file. `assign`: the module's tensors become the file's (a module
    built on the meta device, for large models)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                    for k in set(own) & set(state) if tuple(state[k].shape) != tuple(own[k].shape))
    if missing or unexpected or shapes:
        def show(items: list[str]) -> str:
            more = f", ... ({len(items)} in all)" if len(items) > 20 else ""
            return ", ".join(items[:20]) + more or "none"

        raise WeightsError(f"{path} does not match the {what} architecture: missing keys [{show(missing)}]; "
                           f"unexpected keys [{show(unexpected)}]; shape mismatches [{show(shapes)}]")
    module.load_state_dict(state, strict=True, assign=assign)


def load_file_into(module: nn.Module, path: Path, what: str, trust_pickle: bool = False,
                   nested: tuple[str, ...] = NESTED) -> nn.Module:
    """Read `path` and load it strictly into `module`; returns the module in eval mode."""
    state = state_dict_of(read_checkpoint(path, trust_pickle), path, nested)
    load_strict(module, state, path, what)
    log.info("loaded %s from %s (%d tensors)", what, path, len(state))
    return module.eval()
