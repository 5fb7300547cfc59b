"""Per-row seeded sampling inside one batched `generate` (Tar's LLM stage, harness/models/tar/llm.py).

`generate(do_sample=True)` draws every row of a batch from one global stream, so a row's sample
depends on the rows beside it and on the batch size. Here `generate` runs greedy
(`do_sample=False`, no processor of its own) and `RowSampler`, its only logits processor, samples
each row itself:

    scores_i  = warpers(row i's own ids without its left padding, raw logits_i)   [V]
    token_i   = argmax_v (scores_i[v] + g_i[v]),  g_i = -log(-log u_i),  u_i ~ U(0, 1)^V

from row i's own generator (seeded by the image's draw seed). Gumbel-max: argmax(s + g) is a draw
from softmax(s), the distribution `do_sample=True` draws from after the same warpers. `warpers`
are transformers' own processor classes, in `generate`'s order (repetition penalty, then
temperature, top-k, top-p, min-p), built from the effective generation config: the checkpoint's
`generation_config.json` with the harness's given settings on top (`effective_config`). A config
that turns on any other processor is refused, so no setting is silently left out. Row i's draws
are one uniform vector per step, whatever the batch: a row decoded alone or beside others gets
the same tokens wherever its logits are the same (fp32 on the CPU; docs/methodology.md).
"""
from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from harness.api import ConfigValueError

# generate's own processing switched off: the sampler is the only processor
GREEDY: dict[str, Any] = {"do_sample": False, "repetition_penalty": 1.0, "temperature": None, "top_p": None,
                          "top_k": None}

# generation-config fields whose processors the sampler applies (in generate's order)
APPLIED = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")

# fields that would switch on another processor of generate: (name, its neutral values)
REFUSED: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("num_beams", (None, 1)), ("typical_p", (None, 1.0)), ("epsilon_cutoff", (None, 0.0)),
    ("eta_cutoff", (None, 0.0)), ("no_repeat_ngram_size", (None, 0)), ("bad_words_ids", (None,)),
    ("sequence_bias", (None,)), ("min_length", (None, 0)), ("min_new_tokens", (None, 0)),
    ("suppress_tokens", (None,)), ("begin_suppress_tokens", (None,)), ("forced_bos_token_id", (None,)),
    ("forced_eos_token_id", (None,)), ("exponential_decay_length_penalty", (None,)),
    ("guidance_scale", (None, 1.0)), ("encoder_repetition_penalty", (None, 1.0)), ("top_h", (None,)),
    ("renormalize_logits", (None, False)), ("remove_invalid_values", (None, False)),
    ("watermarking_config", (None,)))


def effective_config(base: Any, given: Mapping[str, Any]) -> Any:
    """The generation config the LLM samples with: `base` (the checkpoint's, a transformers
    GenerationConfig) with transformers' own defaults where it sets nothing (as `generate` fills
    them: top-k 50), and do_sample and the `given` settings on top.

    Raises:
        ConfigValueError: it turns on a processor the sampler does not apply.
    """
    config = copy.deepcopy(base)
    defaults = getattr(config, "_get_default_generation_params", None)  # transformers >= 5: what generate
    if defaults is not None:  # fills in where neither the checkpoint nor the caller set a value (top-k 50)
        config.update(**{k: v for k, v in defaults().items() if getattr(config, k, None) is None})
    config.update(do_sample=True, **given)
    active = [f"{name}={getattr(config, name)!r}" for name, neutral in REFUSED
              if getattr(config, name, None) not in neutral]
    if active:
        raise ConfigValueError(f"the Tar LLM's generation config sets {', '.join(active)}, which the per-row "
                               f"sampler does not apply (it applies {', '.join(APPLIED)}); remove it from the "
                               "checkpoint's generation_config.json")
    return config


def generation_diff(config: Any) -> dict[str, Any]:
    """What `config` sets apart from transformers' defaults (`to_diff_dict`, without the version that
    saved it, private bookkeeping and fields left at the values `generate` fills in), with the
    sampler's APPLIED settings always named: logged, stored in run.json and in the condition
    cache's context."""
    fill = getattr(config, "_get_default_generation_params", None)
    defaults = fill() if fill is not None else {}
    missing = object()
    out = {k: v for k, v in config.to_diff_dict().items()
           if k != "transformers_version" and not k.startswith("_") and defaults.get(k, missing) != v}
    out.update({k: getattr(config, k, None) for k in ("do_sample", *APPLIED) if getattr(config, k, None) is not None})
    return dict(sorted(out.items()))


def row_warpers(config: Any) -> list[Any]:
    """transformers' processors for `config`'s APPLIED settings, in generate's order."""
    from transformers.generation import logits_process as lp

    out: list[Any] = []
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        out.append(lp.RepetitionPenaltyLogitsProcessor(float(config.repetition_penalty)))
    if config.temperature is not None and config.temperature != 1.0:
        out.append(lp.TemperatureLogitsWarper(float(config.temperature)))
    if config.top_k is not None and config.top_k != 0:
        out.append(lp.TopKLogitsWarper(top_k=int(config.top_k)))
    if config.top_p is not None and config.top_p < 1.0:
        out.append(lp.TopPLogitsWarper(top_p=float(config.top_p)))
    if getattr(config, "min_p", None) is not None:
        out.append(lp.MinPLogitsWarper(min_p=float(config.min_p)))
    return out


class RowSampler:
    """A logits processor that samples every row from its own stream (module docstring).

    seeds: one per row; pads: the left padding of each row (positions the row does not own).
    Returns scores [B, V] that are 0 at each row's drawn token and -inf elsewhere, so the greedy
    step of `generate` takes the draw."""

    def __init__(self, config: Any, seeds: Sequence[int], pads: Sequence[int], device: torch.device) -> None:
        if len(seeds) != len(pads):
            raise ValueError(f"{len(seeds)} seeds but {len(pads)} paddings")
        self.warpers = row_warpers(config)
        self.pads = list(pads)
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        """input_ids [B, L] (left-padded), scores [B, V] -> [B, V] (0 at the draws, -inf elsewhere)."""
        out = torch.full_like(scores, float("-inf"))
        for i, generator in enumerate(self.generators):
            row, ids = scores[i : i + 1].float(), input_ids[i : i + 1, self.pads[i] :]
            for warper in self.warpers:
                row = warper(ids, row)
            u = torch.rand(row.shape[-1], generator=generator, device=row.device, dtype=torch.float64)
            gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))  # Gumbel(0, 1) noise [V]
            out[i, int(torch.argmax(row[0].double() + gumbel))] = 0.0
        return out
