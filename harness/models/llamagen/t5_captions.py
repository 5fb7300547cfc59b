"""Caption features for LlamaGen: FLAN-T5-XL through transformers (imported lazily), a tiny
random stand-in for tests, and the conditioner that applies LlamaGen's padding handling.

LlamaGen (`language/t5.py`, `autoregressive/sample/sample_t2i.py`): captions are cleaned, tokenised
to exactly 120 tokens (right padding, truncation), encoded by the T5 encoder; then the valid
tokens are moved to the end ("left padding"), padded positions get zero features and the padding
mask travels with the condition so the GPT hides padded prefix slots.
"""
from __future__ import annotations

import hashlib
import html
import logging
import re
import urllib.parse
from typing import Protocol, Sequence

import torch
from torch import Tensor, nn

from harness.models.condition import TextCondition
from harness.models.hub import WeightsError, dtype_of, snapshot
from harness.models.official_model import PaddedCondition

log = logging.getLogger(__name__)


class CaptionEncoder(Protocol):
    """texts -> (features [B, L, D] float, mask [B, L] bool), right-padded to L = max_length."""

    max_length: int
    dim: int

    def __call__(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]: ...


_URL = re.compile(r"\b(?:https?://|www\.)\S+")
_BAD_PUNCT = re.compile(r"[#®•©™&@·º½¾¿¡§~\)\(\]\[\}\{\|\\/\*]+")


def clean_caption(text: str) -> str:
    """The main steps of LlamaGen's (PixArt's) `clean_caption`, written without ftfy/bs4:
    unquote, lower-case, drop urls / html entities / @handles, normalise dashes and quotes,
    replace stray punctuation by spaces, space out ',./' and collapse whitespace."""
    t = urllib.parse.unquote_plus(str(text)).strip().lower()
    t = html.unescape(html.unescape(t))
    t = _URL.sub("", t)
    t = re.sub(r"<[^>]+>", "", t)
    t = re.sub(r"@[\w\d]+\b", "", t)
    t = re.sub(r"[\u2010-\u2015\u2212\uff0d]+", "-", t)
    t = re.sub(r"[`´«»“”¨]", '"', t)
    t = re.sub(r"[‘’]", "'", t)
    t = re.sub(r"[\"']{2,}", '"', t)
    t = re.sub(r"\.{2,}", " ", t)
    t = _BAD_PUNCT.sub(" ", t)
    t = re.sub(r"\s+\.\s+", " ", t)
    t = re.sub(r"(\D[,\./])\b", r"\1 ", t)
    t = re.sub(r"\s+", " ", t).strip()
    t = re.sub(r"^[\"']([\w\W]+)[\"']$", r"\1", t)
    t = re.sub(r"^[\'\_,\-\:;]", "", t)
    t = re.sub(r"[\'\_,\-\:\-\+]$", "", t)
    return t.strip()


class FlanT5Encoder:
    """FLAN-T5 encoder features through transformers (`T5EncoderModel`), loaded on construction."""

    # the repo files it reads (config, tokenizer, safetensors weights; not the .bin / TF / Flax copies)
    FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model",
             "*.safetensors", "model.safetensors.index.json")

    def __init__(self, repo_id: str = "google/flan-t5-xl", local_path: str | None = None,
                 cache_dir: str | None = None, max_length: int = 120, dtype: str = "bf16",
                 device: str | None = None, clean: bool = True) -> None:
        try:
            from transformers import AutoTokenizer, T5EncoderModel
        except ImportError as err:
            raise ImportError("LlamaGen's caption encoder needs transformers (and sentencepiece): "
                              "pip install transformers sentencepiece") from err
        folder = snapshot(repo_id, local_path, cache_dir, self.FILES)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder)
            self.model = T5EncoderModel.from_pretrained(folder, torch_dtype=dtype_of(dtype)).eval()
        except OSError as err:
            raise WeightsError(f"cannot load the T5 encoder from {folder} (repo {repo_id}): {err}") from err
        if device:
            self.model.to(device)
        self.folder = folder  # the condition cache identifies the weights by its files
        self.max_length = max_length
        self.dim = int(self.model.config.d_model)
        self.clean = clean

    def to(self, device: torch.device | str) -> "FlanT5Encoder":
        self.model.to(device)
        return self

    @torch.inference_mode()
    def __call__(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        texts = [clean_caption(clean_caption(t)) if self.clean else t.lower().strip() for t in texts]
        tok = self.tokenizer(list(texts), max_length=self.max_length, padding="max_length", truncation=True,
                             return_attention_mask=True, add_special_tokens=True, return_tensors="pt")
        device = next(self.model.parameters()).device
        ids, mask = tok["input_ids"].to(device), tok["attention_mask"].to(device)
        feats = self.model(input_ids=ids, attention_mask=mask)["last_hidden_state"]
        return feats, mask.bool()


class TinyTextEncoder(nn.Module):
    """A seeded random stand-in for T5 (tests, tiny stacks): hashed lower-cased words -> a random
    embedding table, plus an end-of-sequence token, right-padded to `max_length`."""

    def __init__(self, dim: int = 32, max_length: int = 8, vocab: int = 97, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("table", torch.randn(vocab, dim, generator=g))
        self.max_length, self.dim, self.vocab = max_length, dim, vocab

    def _word(self, word: str) -> int:
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        return 2 + int.from_bytes(digest, "little") % (self.vocab - 2)

    @torch.inference_mode()
    def forward(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """texts -> (features [B, max_length, dim], mask [B, max_length] bool)."""
        ids = torch.zeros(len(texts), self.max_length, dtype=torch.long)
        for row, text in enumerate(texts):
            words = [self._word(w) for w in clean_caption(text).split()][: self.max_length - 1]
            words.append(1)  # end of sequence
            ids[row, : len(words)] = torch.tensor(words)
        mask = torch.arange(self.max_length)[None] < (ids > 0).sum(1, keepdim=True)
        return self.table[ids.to(self.table.device)], mask.to(self.table.device)


def left_pad(features: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Right-padded features [B, L, D] and mask [B, L] -> valid tokens moved to the end, padded
    positions zeroed, mask flipped (LlamaGen's default "left padding")."""
    out = torch.zeros_like(features)
    for row in range(features.shape[0]):
        n = int(mask[row].sum())
        if n:
            out[row, features.shape[1] - n:] = features[row, :n]
    keep = torch.flip(mask, dims=[-1])
    return out, keep


class CaptionConditioner:
    """prompts -> PaddedCondition [B, P, D] with LlamaGen's padding handling."""

    def __init__(self, encoder: CaptionEncoder, left_padding: bool = True) -> None:
        self.encoder = encoder
        self.left_padding = left_padding

    def to(self, device: torch.device | str) -> "CaptionConditioner":
        if hasattr(self.encoder, "to"):
            self.encoder.to(device)
        return self

    per_image = False  # the encoder's features depend on the prompt only: the cache keeps one per prompt

    @property
    def stage(self) -> CaptionEncoder:
        """The costly stage, whose features the condition cache keeps (harness/store/conditions.py)."""
        return self.encoder

    def __call__(self, prompts: Sequence[str]) -> PaddedCondition:
        return self.finish(self.encoder(prompts))

    def finish(self, encoded: tuple[Tensor, Tensor]) -> PaddedCondition:
        """The encoder's (features [B, L, D], mask [B, L]) -> the condition, with LlamaGen's padding."""
        feats, mask = encoded
        if self.left_padding:
            feats, mask = left_pad(feats, mask)
        else:
            feats = feats * mask[..., None]
        null = torch.zeros(feats.shape[0], dtype=torch.bool, device=feats.device)
        return PaddedCondition(TextCondition(null=null, features=feats), mask)
