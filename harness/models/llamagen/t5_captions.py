"""Caption features for LlamaGen: FLAN-T5-XL through transformers (imported lazily), a tiny
random stand-in for tests, and the conditioner that applies LlamaGen's padding handling.

LlamaGen (`language/t5.py`, `autoregressive/sample/sample_t2i.py`): captions are cleaned, tokenised
to exactly 120 tokens (right padding, truncation), encoded by the T5 encoder; then the valid
tokens are moved to the end ("left padding"), padded positions get zero features and the padding
mask travels with the condition so the GPT hides padded prefix slots.
"""
from __future__ import annotations

import functools
import hashlib
import html
import logging
import re
import unicodedata
import urllib.parse
import warnings
from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor, nn

from harness.models.condition import TextCondition
from harness.models.hub import WEIGHT_ORDER, WeightsError, dtype_of, weights_snapshot
from harness.models.official_model import PaddedCondition

log = logging.getLogger(__name__)


class CaptionEncoder(Protocol):
    """texts -> (features [B, L, D] float, mask [B, L] bool), right-padded to L = max_length."""

    max_length: int
    dim: int

    def __call__(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]: ...


# LlamaGen's caption cleaning: `T5Embedder.clean_caption` / `basic_clean` in language/t5.py
# (FoundationVision/LlamaGen @5a50452, taken from PixArt-alpha's diffusion/model/t5.py). The rules
# run in its order; `clean_caption` below names each step.
_DOMAIN = r"[a-zA-Z0-9.\-]+\.(?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b/?(?!@)"
_URLS = (re.compile(rf"\b(?:https?:(?:/{{1,3}}|[a-zA-Z0-9%])|{_DOMAIN})"),
         re.compile(rf"\b(?:www:(?:/{{1,3}}|[a-zA-Z0-9%])|{_DOMAIN})"))
# LlamaGen removes seven CJK blocks one after the other (U+31C0 strokes .. U+9FFF unified
# ideographs); they are adjacent, so removing their union at once leaves the same text.
_CJK = re.compile(r"[\u31c0-\u9fff]+")
_DASHES = re.compile(r"[\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c"
                     r"\u3030\u30a0\ufe31\ufe32\ufe58\ufe63\uff0d]+")
_BAD_PUNCT = re.compile(r"[#®•©™&@·º½¾¿¡§~)(\]\[}{|\\/*]+")
_JOINERS = re.compile(r"[-_]")  # more than three in a caption: all become spaces (this-is-my-cat)
_EXTENSIONS = "png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4"

# (pattern, replacement) in order, between the HTML step and the "-"/"_" rule ...
_BEFORE_BASIC = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"@[\w\d]+\b", ""),                                     # @nickname
    (_CJK.pattern, ""),
    (_DASHES.pattern, "-"),                                  # every kind of dash, runs included
    (r"[`´«»“”¨]", '"'),
    (r"[‘’]", "'"),
    (r"&quot;?", ""),
    (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),           # IP addresses
    (r"\d:\d\d\s+$", ""),                                    # article ids
    (r"\\n", " "),                                           # a literal backslash-n
    (r"#\d{1,3}\b", ""),
    (r"#\d{5,}\b", ""),
    (r"\b\d{6,}\b", ""),                                     # long numbers
    (rf"\S+\.(?:{_EXTENSIONS})", ""),                        # file names
    (r"[\"']{2,}", '"'),
    (r"\.{2,}", " "),
    (_BAD_PUNCT.pattern, " "),
    (r"\s+\.\s+", " "),
))
# ... and after `basic_clean` (ftfy, HTML entities).
_AFTER_BASIC = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),                      # jc6640
    (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),                      # jc6640vc
    (r"\b\d+[a-zA-Z]+\d+\b", ""),                            # 6640vc231
    (r"(worldwide\s+)?(free\s+)?shipping", ""),
    (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (rf"\b(?:{_EXTENSIONS})(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),  # j2d1a2a...
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),                   # sizes: 2x2, 10.5×3 (Latin x, Cyrillic х, ×)
    (r"\b\s+:\s+", ": "),
    (r"(\D[,\./])\b", r"\1 "),                               # a space after ",", ".", "/" before a word
    (r"\s+", " "),
    # LlamaGen strips here without keeping the result: a leading space stays for the next rules.
    (r"^[\"']([\w\W]+)[\"']$", r"\1"),
    (r"^['_,\-:;]", ""),
    (r"['_,\-:\-+]$", ""),
    (r"^\.\S+$", ""),
))


@functools.cache
def _text_fixers() -> tuple[Callable[[str], str], Callable[[str], str]]:
    """(fix_text, html_to_text): ftfy's `fix_text` and BeautifulSoup's html.parser text, as LlamaGen
    uses them, when installed (the `official` extra); otherwise stand-ins, with one warning."""
    missing = []
    try:
        from ftfy import fix_text
    except ImportError:
        missing.append("ftfy")
        fix_text = _nfc
    try:
        import bs4
    except ImportError:
        missing.append("beautifulsoup4")
        html_to_text = _strip_tags
    else:
        # bs4 warns when a caption looks like a file name or URL; LlamaGen parses it all the same
        warnings.filterwarnings("ignore", category=bs4.MarkupResemblesLocatorWarning)

        def html_to_text(text: str) -> str:
            return bs4.BeautifulSoup(text, features="html.parser").text
    if missing:
        log.warning("%s not installed: captions are cleaned as LlamaGen does except %s; captions with broken "
                    "unicode or HTML markup may reach T5 differently (pip install 'mulo-bench[official]')",
                    " and ".join(missing),
                    "; ".join(part for name, part in (
                        ("ftfy", "ftfy.fix_text (mojibake, ligature, width and quote repairs) is only an "
                                 "NFC normalisation"),
                        ("beautifulsoup4", "BeautifulSoup's HTML parsing is a regex tag strip plus "
                                           "html.unescape")) if name in missing))
    return fix_text, html_to_text


def _nfc(text: str) -> str:
    """Stand-in for ftfy.fix_text: its NFC normalisation only."""
    return unicodedata.normalize("NFC", text)


def _strip_tags(text: str) -> str:
    """Stand-in for BeautifulSoup(text, "html.parser").text: drop tags and comments, decode entities."""
    return html.unescape(re.sub(r"<!--.*?-->|</?[a-zA-Z][^<>]*>", "", text, flags=re.S))


def clean_caption(text: str) -> str:
    """One pass of LlamaGen's caption cleaning (`T5Embedder.clean_caption`; LlamaGen applies it twice).

    In order: URL-unquote, strip, lower-case; "<person>" -> "person"; URLs (scheme or known domain)
    removed; HTML to text (BeautifulSoup); the `_BEFORE_BASIC` rules (handles, CJK, dashes, quotes,
    entities, IPs, ids, numbers, file names, punctuation); with more than three "-"/"_" in the
    caption all of them become spaces; `basic_clean` (ftfy.fix_text, html.unescape twice, strip);
    the `_AFTER_BASIC` rules (product codes, shipping/download/click phrases, extensions, page
    numbers, sizes, spacing, quotes and punctuation at the ends); strip. Without ftfy or
    beautifulsoup4 installed, stand-ins replace them and `_text_fixers` says so once."""
    fix_text, html_to_text = _text_fixers()
    t = urllib.parse.unquote_plus(str(text)).strip().lower()
    t = t.replace("<person>", "person")
    for url in _URLS:
        t = url.sub("", t)
    t = html_to_text(t)
    for pattern, replacement in _BEFORE_BASIC:
        t = pattern.sub(replacement, t)
    if len(_JOINERS.findall(t)) > 3:
        t = _JOINERS.sub(" ", t)
    t = html.unescape(html.unescape(fix_text(t))).strip()
    for pattern, replacement in _AFTER_BASIC:
        t = pattern.sub(replacement, t)
    return t.strip()


class FlanT5Encoder:
    """FLAN-T5 encoder features through transformers (`T5EncoderModel`), loaded on construction."""

    # the repo files it reads (config, tokenizer) and its weights in WEIGHTS order: safetensors, else .bin
    # (transformers' order; never both, never the TF / Flax copies)
    FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model")
    WEIGHTS = WEIGHT_ORDER

    def __init__(self, repo_id: str = "google/flan-t5-xl", local_path: str | None = None,
                 cache_dir: str | None = None, max_length: int = 120, dtype: str = "bf16",
                 device: str | None = None, clean: bool = True) -> None:
        try:
            from transformers import AutoTokenizer, T5EncoderModel
        except ImportError as err:
            raise ImportError("LlamaGen's caption encoder needs transformers (and sentencepiece): "
                              "pip install transformers sentencepiece") from err
        folder = weights_snapshot(repo_id, local_path, cache_dir, self.FILES, self.WEIGHTS)
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
