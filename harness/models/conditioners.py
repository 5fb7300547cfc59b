"""Conditioners: captions -> TextCondition shared by every model of a bundle."""
from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import torch

from harness.models.condition import TextCondition


class WordIdConditioner:
    """Captions -> word ids [B, P] through a word tokenizer (e.g. the shapes grammar), right-padded."""

    def __init__(self, tokenize: Callable[[Sequence[str]], torch.Tensor], prefix_len: int) -> None:
        self.tokenize = tokenize
        self.prefix_len = prefix_len

    def __call__(self, prompts: Sequence[str]) -> TextCondition:
        ids = self.tokenize(prompts)
        if ids.shape[1] > self.prefix_len:
            raise ValueError(f"captions need {ids.shape[1]} tokens, the models take {self.prefix_len}")
        ids = torch.nn.functional.pad(ids, (0, self.prefix_len - ids.shape[1]))
        return TextCondition(null=torch.zeros(len(prompts), dtype=torch.bool), ids=ids)


class HashedWordConditioner:
    """Any caption -> word ids by hashing lower-cased words into `word_vocab - 1` buckets (0 = pad).
    For randomly initialised test models, which must accept every benchmark prompt."""

    def __init__(self, word_vocab: int, prefix_len: int) -> None:
        self.word_vocab = word_vocab
        self.prefix_len = prefix_len

    def _word_id(self, word: str) -> int:
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        return 1 + int.from_bytes(digest, "little") % (self.word_vocab - 1)

    def __call__(self, prompts: Sequence[str]) -> TextCondition:
        ids = torch.zeros(len(prompts), self.prefix_len, dtype=torch.long)
        for row, text in enumerate(prompts):
            words = text.lower().split()[: self.prefix_len]
            ids[row, : len(words)] = torch.tensor([self._word_id(w) for w in words], dtype=torch.long)
        return TextCondition(null=torch.zeros(len(prompts), dtype=torch.bool), ids=ids)
