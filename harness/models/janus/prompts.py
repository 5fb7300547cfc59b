"""Prompts -> Janus-Pro conditions.

`ChatPromptTokenizer` lays a prompt out as transformers' Janus documents image generation: the
repo's chat template over one user turn (`apply_chat_template(..., add_generation_prompt=True)`),
then the processor in `generation_mode="image"`, which appends the image-start tag
`<begin_of_image>`; the tokenizer adds BOS. `TinyPromptTokenizer` is the stand-in of the tiny
random stack (words hashed into its small vocabulary, the same layout: BOS, user tag, words,
assistant tag, image-start tag). `JanusConditioner` left-pads the ids to the model's prefix length.
"""
from __future__ import annotations

import hashlib
from typing import Protocol, Sequence

from harness.models.hub import WeightsError, snapshot
from harness.models.janus.condition import PromptIds, left_padded


class PromptTokenizer(Protocol):
    """prompts -> one token id list per prompt, chat template and image-start tag included."""

    def __call__(self, prompts: Sequence[str]) -> list[list[int]]: ...


class ChatPromptTokenizer:
    """The JanusProcessor of a Hugging Face-format Janus-Pro repo (chat template, tokenizer)."""

    # the repo files it reads (tokenizer, chat template, processor settings)
    FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "processor_config.json",
             "preprocessor_config.json", "chat_template.*")

    def __init__(self, repo_id: str, local_path: str | None = None, cache_dir: str | None = None) -> None:
        try:
            from transformers import JanusProcessor
        except ImportError as err:
            raise ImportError("Janus-Pro needs transformers >= 4.51: pip install -U transformers") from err
        folder = snapshot(repo_id, local_path, cache_dir, self.FILES)
        try:
            self.processor = JanusProcessor.from_pretrained(folder)
        except (OSError, ValueError) as err:
            raise WeightsError(f"cannot load the Janus processor from {folder} (repo {repo_id}): {err}") from err

    def __call__(self, prompts: Sequence[str]) -> list[list[int]]:
        rows = []
        for prompt in prompts:
            messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True)
            ids = self.processor(text=text, generation_mode="image", return_tensors="pt").input_ids
            rows.append(ids[0].tolist())
        return rows


class TinyPromptTokenizer:
    """A deterministic stand-in tokenizer: [bos, user, word ids..., assistant, boi], each word
    hashed into [first_word, vocab)."""

    def __init__(self, vocab: int = 320, bos: int = 1, boi: int = 3, user: int = 4, assistant: int = 5,
                 first_word: int = 8) -> None:
        if first_word >= vocab:
            raise ValueError(f"model.tokenizer.first_word ({first_word}) must be below vocab ({vocab})")
        self.vocab, self.bos, self.boi, self.user, self.assistant = vocab, bos, boi, user, assistant
        self.first_word = first_word

    def _word(self, word: str) -> int:
        digest = hashlib.blake2b(word.lower().encode(), digest_size=4).digest()
        return self.first_word + int.from_bytes(digest, "little") % (self.vocab - self.first_word)

    def __call__(self, prompts: Sequence[str]) -> list[list[int]]:
        return [[self.bos, self.user, *map(self._word, p.split()), self.assistant, self.boi] for p in prompts]


class JanusConditioner:
    """prompts -> PromptIds [B, prefix_len]: `tokenizer`'s ids left-padded with `pad_id`; the
    unconditional rows keep `kept` (BOS, image-start), as transformers' Janus generate."""

    def __init__(self, tokenizer: PromptTokenizer, prefix_len: int, pad_id: int, kept: tuple[int, ...]) -> None:
        self.tokenizer, self.prefix_len, self.pad_id, self.kept = tokenizer, prefix_len, pad_id, tuple(kept)

    def __call__(self, prompts: Sequence[str]) -> PromptIds:
        ids, keep = left_padded(self.tokenizer(prompts), self.prefix_len, self.pad_id)
        return PromptIds(ids, keep, self.pad_id, self.kept)
