"""What a job's decoders download: MuLo-SD's `sr` up-sampler with `network: realesrgan` (the real
models' default) reads the pinned Real-ESRGAN network of the models' ratio r = target_size /
drafter_size (baselines/methods/sr_upsampler.py), a file `stages=[fetch]` brings and an offline job
must find. A ratio no network is pinned for, or an `sr` up-sampler without spandrel installed, stops
the job before anything is built, naming the key.
"""
from __future__ import annotations

import importlib.util
from typing import Iterator, Mapping

from omegaconf import DictConfig

from harness.api import ConfigValueError
from harness.assets.asset import Asset, UrlFile

UPSAMPLER = "baselines.methods.upsamplers.build_upsampler"  # the `_target_` of an up-sampler node


def model_ratio(model: DictConfig) -> int | None:
    """r of a model config: target_size / drafter_size (or the random bundle's draft_ratio); None
    when the config does not say (the ratio is then checked once the models are built)."""
    target, drafter = model.get("target_size"), model.get("drafter_size")
    if isinstance(target, int) and isinstance(drafter, int) and drafter > 0 and target % drafter == 0:
        return target // drafter
    found = model.get("draft_ratio")
    return found if isinstance(found, int) else None


def _upsamplers(node: DictConfig, key: str) -> Iterator[tuple[str, DictConfig]]:
    """Every up-sampler node below a decoder's `node`, with its full key."""
    if node.get("_target_") == UPSAMPLER:
        yield key, node
    for name, value in node.items():
        if isinstance(value, DictConfig):
            yield from _upsamplers(value, f"{key}.{name}")


def decoder_assets(decoders: Mapping[str, DictConfig], model: DictConfig) -> list[Asset]:
    """The pinned files the `decoders` (name -> config node, inside the job's config) read on `model`.

    Raises:
        ConfigValueError: an `sr` up-sampler asks for the pinned network and none is pinned for the
            model's ratio, or spandrel is not installed (naming the key and the fix).
    """
    from baselines.methods.sr_upsampler import PINNED, REALESRGAN, pinned_sr

    found: dict[str, tuple[list[str], object]] = {}  # url -> (decoders, pin)
    for name, node in decoders.items():
        for key, upsampler in _upsamplers(node, f"decoder.{name}"):
            if upsampler.get("kind") != "sr":
                continue
            if importlib.util.find_spec("spandrel") is None:
                raise ConfigValueError(f"{key}.kind=sr reads its super-resolution network with spandrel, which is "
                                       f"not installed: pip install 'mulo-bench[sr]' (or {key}.kind=pixel, decoder "
                                       "mulo_sd_bicubic)")
            if upsampler.get("network") != PINNED:
                continue
            r = model_ratio(model)
            if r is None:
                continue
            if r not in REALESRGAN:
                raise ConfigValueError(
                    f"{key}.network={PINNED}: no Real-ESRGAN network is pinned for model {model.get('name')}'s ratio "
                    f"x{r} (target / drafter size; pinned: {', '.join(f'x{s}' for s in sorted(REALESRGAN))}); give "
                    f"{key}.network=PATH (a x{r} spandrel checkpoint) or {key}.kind=pixel")
            pinned = pinned_sr(r)
            found.setdefault(pinned.url, ([], pinned))[0].append(name)
    return [UrlFile(f"decoder {', '.join(names)} sr network", pinned)  # type: ignore[arg-type]
            for names, pinned in found.values()]
