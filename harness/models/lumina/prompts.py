"""Lumina-mGPT's text condition: the chat prompt of every image size of a bundle, tokenized.

The prompt names the image size ("Generate an image of {w}x{h} ..."), so the target and a drafter at
another resolution read different token ids: `ChatCondition` holds one left-padded row of ids per
size, and each model reads its own. A CFG null row is the official unconditional context: the
header alone (LLMImageStartTriggeredUnbatchedClassifierFreeGuidanceLogitsProcessor starts it at
the image-start token), so its prompt slots are all padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from harness.api import ConfigValueError
from harness.models.lumina.layout import TEMPLATE, SpecialTokens


@dataclass(frozen=True, slots=True)
class ChatCondition:
    """ids [B, K, P] int64 left-padded prompt ids (bos .. sep) for the K `sizes` (width, height) px;
    keep [B, K, P] bool (True = a real token); null [B] bool (CFG unconditional rows)."""

    ids: Tensor
    keep: Tensor
    null: Tensor
    sizes: tuple[tuple[int, int], ...]

    @property
    def batch_size(self) -> int:
        return int(self.null.shape[0])

    def with_null(self) -> "ChatCondition":
        return ChatCondition(torch.cat([self.ids, self.ids]), torch.cat([self.keep, self.keep]),
                             torch.cat([self.null, torch.ones_like(self.null)]), self.sizes)

    def select(self, index: Tensor) -> "ChatCondition":
        index = index.to(self.ids.device)
        return ChatCondition(self.ids[index], self.keep[index], self.null[index], self.sizes)

    def to(self, device: torch.device | str) -> "ChatCondition":
        return ChatCondition(self.ids.to(device), self.keep.to(device), self.null.to(device), self.sizes)

    def rows(self, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """(ids [B, P], keep [B, P]) of one size; null rows keep nothing."""
        if size not in self.sizes:
            raise ValueError(f"the condition holds prompts for sizes {list(self.sizes)}, not {size}")
        k = self.sizes.index(size)
        return self.ids[:, k], self.keep[:, k] & ~self.null[:, None]


class ChatConditioner:
    """prompts -> ChatCondition: the official template at each size, `[bos] + turn(text)` where `turn`
    tokenizes the text with the end-of-turn separator, left-padded to `prompt_slots` (a longer prompt
    is refused, naming the key)."""

    def __init__(self, turn: Callable[[str], list[int]], sizes: Sequence[tuple[int, int]], prompt_slots: int,
                 tokens: SpecialTokens) -> None:
        self.turn, self.sizes, self.prompt_slots, self.tokens = turn, tuple(sizes), prompt_slots, tokens

    def prompt_ids(self, prompt: str, width: int, height: int) -> list[int]:
        """The official prompt ids of one image (FlexARItemProcessor.process_item with the template:
        the human turn and its separator, encoded with a leading bos)."""
        ids = [self.tokens.bos, *self.turn(TEMPLATE.format(w=width, h=height, prompt=prompt))]
        if ids[-1] != self.tokens.sep:
            raise ValueError(f"the tokenized turn ends with id {ids[-1]}, not the separator {self.tokens.sep}")
        return ids

    def __call__(self, prompts: Sequence[str]) -> ChatCondition:
        ids = torch.zeros(len(prompts), len(self.sizes), self.prompt_slots, dtype=torch.long)
        keep = torch.zeros(ids.shape, dtype=torch.bool)
        for b, prompt in enumerate(prompts):
            for k, (w, h) in enumerate(self.sizes):
                row = self.prompt_ids(prompt, w, h)
                if len(row) > self.prompt_slots:
                    raise ConfigValueError(f"the prompt {prompt[:60]!r} takes {len(row)} tokens at {w}x{h}, more "
                                           f"than model.prompt_slots={self.prompt_slots}; raise model.prompt_slots")
                ids[b, k, self.prompt_slots - len(row):] = torch.tensor(row)
                keep[b, k, self.prompt_slots - len(row):] = True
        return ChatCondition(ids, keep, torch.zeros(len(prompts), dtype=torch.bool), self.sizes)


class ByteTokenizer:
    """The tiny stand-in's text tokenizer: UTF-8 bytes at ids `base` .. `base` + 255, then `sep`."""

    def __init__(self, base: int, sep: int) -> None:
        self.base, self.sep = base, sep

    def __call__(self, text: str) -> list[int]:
        return [self.base + b for b in text.encode("utf-8")] + [self.sep]


class HubTokenizer:
    """Chameleon's BPE tokenizer of a Lumina-mGPT checkpoint folder (transformers AutoTokenizer): the
    turn's text and its separator token encoded in one call without special tokens, as xllmx's
    Tokenizer.encode encodes the conversation."""

    FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
    SEP = "<reserved08706>"

    def __init__(self, folder: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.bos = int(self.tokenizer.bos_token_id)
        self.sep = int(self.tokenizer.convert_tokens_to_ids(self.SEP))

    def __call__(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text + self.SEP, add_special_tokens=False))
