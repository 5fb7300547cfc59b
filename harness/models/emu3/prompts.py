"""Prompts -> Emu3 conditions.

Layout of transformers' Emu3 image generation (`Emu3Processor(text=..., return_for_image_generation
=True)`): BOS, the prompt's text, then the image header `<|image start|>{rows}*{cols}<|image token|>`
with the token grid's size (rows = height / 8). The CFG context (`cfg_context`) follows BAAI's
image_generation.py (`baai`: every prompt gets the quality suffix `positive_prompt` appended, and the
negative prompt is built like a prompt, header included) or transformers' documentation (`transformers`:
the prompt as given, the negative prompt's plain text ids, BOS + text, no header, passed to `generate`
as `negative_prompt_ids`). `ChatPromptTokenizer` reads a Hugging Face-format Emu3 repo's processor;
`TinyPromptTokenizer` is the tiny random stack's stand-in (words hashed into its small vocabulary,
digits and `*` as single tokens, the same header layout). `Emu3Conditioner` left-pads.
"""
from __future__ import annotations

import hashlib
from typing import Protocol, Sequence

import torch

from harness.models.emu3 import tiny
from harness.models.emu3.condition import Emu3Prompt, left_padded
from harness.api import ConfigValueError
from harness.models.hub import WeightsError, snapshot


class PromptTokenizer(Protocol):
    """Text -> ids (BOS + text), and the image header of a grid."""

    pad_id: int

    def text(self, prompts: Sequence[str]) -> list[list[int]]: ...

    def header(self, grid: tuple[int, int]) -> list[int]: ...


class ChatPromptTokenizer:
    """The Emu3Processor of a Hugging Face-format Emu3 repo (`BAAI/Emu3-Gen-hf`)."""

    # the repo files it reads (tokenizer, processor settings)
    FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "processor_config.json",
             "preprocessor_config.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.*")

    def __init__(self, repo_id: str, local_path: str | None = None, cache_dir: str | None = None) -> None:
        try:
            from transformers import Emu3Processor
        except ImportError as err:
            raise ImportError("Emu3 needs transformers >= 4.56: pip install -U 'transformers>=4.56'") from err
        folder = snapshot(repo_id, local_path, cache_dir, self.FILES)
        try:
            self.processor = Emu3Processor.from_pretrained(folder)
        except (OSError, ValueError) as err:
            raise WeightsError(f"cannot load the Emu3 processor from {folder} (repo {repo_id}): {err}") from err
        self.pad_id = int(self.processor.tokenizer.pad_token_id)

    def text(self, prompts: Sequence[str]) -> list[list[int]]:
        """BOS + text ids of each prompt (the processor adds BOS)."""
        return [self.processor(text=[p]).input_ids[0] for p in prompts]

    def header(self, grid: tuple[int, int]) -> list[int]:
        """`<|image start|>{rows}*{cols}<|image token|>`: the processor's image prompt of that grid,
        checked against the processor's own generation prompt (`return_for_image_generation`)."""
        rows, cols = grid
        p = self.processor
        head = p.tokenizer.encode(f"{p.image_start_token}{rows}*{cols}{p.fake_token_around_image}",
                                  add_special_tokens=False)
        probe = "a photo"
        full = p(text=[probe], return_for_image_generation=True, ratio=f"{cols}:{rows}",
                 image_area=rows * cols * p.downsample_ratio ** 2).input_ids[0]
        if list(full) != [*self.text([probe])[0], *head]:
            raise WeightsError(f"the processor's image-generation prompt {list(full)} is not the text ids followed "
                               f"by the header {head} of a {rows}x{cols} grid")
        return list(head)


class TinyPromptTokenizer:
    """A deterministic stand-in: [bos, word ids...], each word hashed into [first_word,
    first_word + words); header [boi, digits of rows, *, digits of cols, image wrapper]."""

    pad_id = tiny.PAD

    def __init__(self, words: int = 200) -> None:
        if words < 1:
            raise ValueError(f"model.tokenizer.words must be >= 1, got {words}")
        self.words = int(words)

    def _word(self, word: str) -> int:
        digest = hashlib.blake2b(word.lower().encode(), digest_size=4).digest()
        return tiny.FIRST_WORD + int.from_bytes(digest, "little") % self.words

    def text(self, prompts: Sequence[str]) -> list[list[int]]:
        return [[tiny.BOS, *map(self._word, p.split())] for p in prompts]

    def header(self, grid: tuple[int, int]) -> list[int]:
        digits = [[tiny.DIGIT0 + int(d) for d in str(n)] for n in grid]
        return [tiny.BOI, *digits[0], tiny.STAR, *digits[1], tiny.WRAPPER]


CFG_CONTEXTS = ("baai", "transformers")


class Emu3Conditioner:
    """prompts -> Emu3Prompt: text ids left-padded to `prompt_slots`, the negative prompt's ids,
    and the header of each of `grids` (the bundle's models). `cfg_context`: "baai" (each prompt
    followed by `positive_prompt`, the negative rows ending with the header) or "transformers"."""

    def __init__(self, tokenizer: PromptTokenizer, prompt_slots: int, negative_prompt: str,
                 grids: Sequence[tuple[int, int]], cfg_context: str = "transformers",
                 positive_prompt: str = "") -> None:
        if cfg_context not in CFG_CONTEXTS:
            raise ConfigValueError(f"model.cfg_context={cfg_context!r}: use one of {list(CFG_CONTEXTS)} (baai: "
                                   "BAAI's image_generation.py, transformers: transformers' Emu3 documentation)")
        self.cfg_context = cfg_context
        self.suffix = positive_prompt if cfg_context == "baai" else ""
        self.tokenizer, self.prompt_slots = tokenizer, int(prompt_slots)
        self.headers = tuple((tuple(g), tuple(tokenizer.header(tuple(g)))) for g in grids)
        neg, neg_keep = left_padded(tokenizer.text([negative_prompt]), self.prompt_slots, tokenizer.pad_id,
                                    "model.prompt_slots (the negative prompt)")
        self.negative, self.negative_keep = neg[0], neg_keep[0]

    def header_len(self, grid: tuple[int, int]) -> int:
        return len(dict(self.headers)[tuple(grid)])

    def __call__(self, prompts: Sequence[str]) -> Emu3Prompt:
        texts = [p + self.suffix for p in prompts]
        ids, keep = left_padded(self.tokenizer.text(texts), self.prompt_slots, self.tokenizer.pad_id,
                                "model.prompt_slots")
        null = torch.zeros(len(prompts), dtype=torch.bool)
        return Emu3Prompt(ids, keep, null, self.negative, self.negative_keep, self.tokenizer.pad_id, self.headers,
                          negative_header=self.cfg_context == "baai")
