"""The caption grammar of the shapes world, in GenEval's phrasing, and its GenEval metadata.

Six templates, one per GenEval tag:

    single_object  "a photo of a circle"
    two_object     "a photo of a circle and a square"
    counting       "a photo of three triangles"
    colors         "a photo of a red circle"
    position       "a photo of a circle right of a square"
    color_attr     "a photo of a red circle and a blue square"

A caption alone determines its metadata (`parse`), and the metadata determines the caption
(`compose`); metadata dicts follow GenEval's `evaluation_metadata.jsonl` schema, keys in its order
(tag, include, [exclude], prompt).

Two caption encodings feed a shapes GPT (ENCODINGS): "words" (`tokenize`, one slot per word of
VOCAB) and "phrases" (`phrase_tokenize`, one slot per noun phrase of PHRASES).
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
import torch

from harness.api import InputError

TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
SHAPES = ("circle", "square", "triangle", "cross")
COLOR_NAMES = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")
NUMBERS = {2: "two", 3: "three", 4: "four"}
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "cross": "crosses"}

VOCAB: tuple[str, ...] = (
    "<pad>", "a", "an", "photo", "of", "and", *SHAPES, *PLURALS.values(), *NUMBERS.values(),
    *COLOR_NAMES, "left", "right", "above", "below",
)
# The longest template is color_attr: "a photo of a red circle and a blue square".
MAX_WORDS = 10

_INDEX = {word: i for i, word in enumerate(VOCAB)}
_SINGULAR = {plural: shape for shape, plural in PLURALS.items()}
_COUNTS = {word: n for n, word in NUMBERS.items()}
_PREFIX = ("a", "photo", "of")

Meta = dict[str, Any]


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _noun(shape: str, color: str | None = None) -> str:
    """'a circle', 'a red circle', 'an orange square'."""
    phrase = shape if color is None else f"{color} {shape}"
    return f"{_article(phrase)} {phrase}"


def _meta(tag: str, include: list[Meta], exclude: list[Meta] | None = None) -> Meta:
    meta: Meta = {"tag": tag, "include": include}
    if exclude is not None:
        meta["exclude"] = exclude
    meta["prompt"] = compose(tag, include)
    return meta


def compose(tag: str, include: Sequence[Meta]) -> str:
    """The caption of a GenEval `include` list for `tag` (inverse of `parse`)."""
    if tag == "single_object":
        return f"a photo of {_noun(include[0]['class'])}"
    if tag == "two_object":
        return f"a photo of {_noun(include[0]['class'])} and {_noun(include[1]['class'])}"
    if tag == "counting":
        group = include[0]
        return f"a photo of {NUMBERS[group['count']]} {PLURALS[group['class']]}"
    if tag == "colors":
        return f"a photo of {_noun(include[0]['class'], include[0]['color'])}"
    if tag == "position":
        target, subject = include
        relation = subject["position"][0]
        return f"a photo of {_noun(subject['class'])} {relation} {_noun(target['class'])}"
    if tag == "color_attr":
        first, second = include
        return (f"a photo of {_noun(first['class'], first['color'])} "
                f"and {_noun(second['class'], second['color'])}")
    raise ValueError(f"unknown GenEval tag {tag!r}; expected one of {TAGS}")


def make_meta(tag: str, shapes: Sequence[str], colors: Sequence[str] = (), count: int = 1,
              relation: str | None = None) -> Meta:
    """GenEval metadata for one caption of the grammar.

    `shapes`: the shape kinds in caption order (one, or two for two_object/position/color_attr);
    `colors`: their colours (colors/color_attr); `count`: 2-4 for counting; `relation`: position.
    """
    if tag in ("single_object", "two_object"):
        include = [{"class": s, "count": 1} for s in shapes]
        return _meta(tag, include)
    if tag == "counting":
        if count not in NUMBERS:
            raise ValueError(f"counting captions use counts {sorted(NUMBERS)}, got {count}")
        return _meta(tag, [{"class": shapes[0], "count": count}],
                     [{"class": shapes[0], "count": count + 1}])
    if tag in ("colors", "color_attr"):
        include = [{"class": s, "count": 1, "color": c} for s, c in zip(shapes, colors, strict=True)]
        return _meta(tag, include)
    if tag == "position":
        subject, target = shapes
        include = [{"class": target, "count": 1},
                   {"class": subject, "count": 1, "position": [relation, 0]}]
        return _meta(tag, include)
    raise ValueError(f"unknown GenEval tag {tag!r}; expected one of {TAGS}")


TWIN_TAGS = ("color_attr", "position")


def twin(meta: Meta) -> Meta:
    """The word-swapped twin of a color_attr or position caption: the same words with the other
    meaning ("a red circle and a blue square" -> "a blue circle and a red square"; "a circle left
    of a square" -> "a square left of a circle"). A reader of word order tells them apart; a
    bag-of-words reader cannot."""
    if meta["tag"] == "color_attr":
        first, second = meta["include"]
        return make_meta("color_attr", [first["class"], second["class"]], [second["color"], first["color"]])
    if meta["tag"] == "position":
        target, subject = meta["include"]
        return make_meta("position", [target["class"], subject["class"]], relation=subject["position"][0])
    raise ValueError(f"only {TWIN_TAGS} captions have word-swapped twins, got tag {meta['tag']!r}")


def all_metas(tag: str) -> list[Meta]:
    """Every caption of the grammar for `tag`, in a fixed order (4 to 1080 of them)."""
    pairs = list(itertools.permutations(SHAPES, 2))
    if tag == "single_object":
        return [make_meta(tag, [s]) for s in SHAPES]
    if tag == "two_object":
        return [make_meta(tag, p) for p in pairs]
    if tag == "counting":
        return [make_meta(tag, [s], count=n) for n in NUMBERS for s in SHAPES]
    if tag == "colors":
        return [make_meta(tag, [s], [c]) for c in COLOR_NAMES for s in SHAPES]
    if tag == "position":
        return [make_meta(tag, p, relation=r) for r in RELATIONS for p in pairs]
    if tag == "color_attr":
        color_pairs = list(itertools.permutations(COLOR_NAMES, 2))
        return [make_meta(tag, p, c) for p in pairs for c in color_pairs]
    raise ValueError(f"unknown GenEval tag {tag!r}; expected one of {TAGS}")


def sample_meta(tag: str, rng: np.random.Generator) -> Meta:
    """One caption of `tag` drawn uniformly from the grammar (two different shape kinds, and two
    different colours for color_attr, as GenEval's create_prompts)."""
    if tag not in TAGS:
        raise ValueError(f"unknown GenEval tag {tag!r}; expected one of {TAGS}")
    shapes = [SHAPES[i] for i in rng.permutation(len(SHAPES))[:2]]
    colors = [COLOR_NAMES[i] for i in rng.permutation(len(COLOR_NAMES))[:2]]
    if tag == "single_object":
        return make_meta(tag, shapes[:1])
    if tag == "counting":
        return make_meta(tag, shapes[:1], count=int(rng.integers(2, 5)))
    if tag == "colors":
        return make_meta(tag, shapes[:1], colors[:1])
    if tag == "position":
        return make_meta(tag, shapes, relation=RELATIONS[int(rng.integers(len(RELATIONS)))])
    return make_meta(tag, shapes, colors)


class CaptionError(InputError, ValueError):
    """A caption outside the shapes grammar (the message quotes it, shortened)."""


def _check_words(caption: str) -> list[str]:
    words = caption.split()
    for word in words:
        if word not in _INDEX or word == "<pad>":
            raise CaptionError(
                f"word {word!r} of caption {quoted(caption)} is not in the shapes grammar; "
                f"captions use only: {' '.join(VOCAB[1:])}")
    return words


def quoted(caption: str, limit: int = 80) -> str:
    """`caption` quoted for an error message, cut to about `limit` characters ("..." and the total
    length mark a cut), so a runaway prompt line does not flood the terminal."""
    if len(caption) <= limit:
        return repr(caption)
    return f"{caption[:limit]!r}... ({len(caption)} characters)"


def _grammar_error(caption: str) -> CaptionError:
    return CaptionError(
        f"caption {quoted(caption)} does not follow the shapes grammar; expected e.g. 'a photo of a "
        f"circle', 'a photo of three triangles', 'a photo of a red circle and a blue square', "
        f"'a photo of a circle right of a square'")


def _parse_noun(words: list[str], caption: str) -> tuple[str, str | None, list[str]]:
    """Consume '(a|an) [colour] shape' -> (shape, colour or None, remaining words)."""
    if len(words) < 2 or words[0] not in ("a", "an"):
        raise _grammar_error(caption)
    color = words[1] if words[1] in COLOR_NAMES else None
    rest = words[2:] if color else words[1:]
    if not rest or rest[0] not in SHAPES:
        raise _grammar_error(caption)
    return rest[0], color, rest[1:]


def parse(caption: str) -> Meta:
    """Caption -> GenEval metadata dict (`prompt` = the caption as given).

    Raises ValueError naming the word when a word is outside the grammar, or naming the caption
    when the words are known but do not form one of the six templates.
    """
    words = _check_words(caption)
    if tuple(words[:3]) != _PREFIX:
        raise _grammar_error(caption)
    words = words[3:]
    if len(words) == 2 and words[0] in _COUNTS and words[1] in _SINGULAR:
        meta = make_meta("counting", [_SINGULAR[words[1]]], count=_COUNTS[words[0]])
    else:
        shape, color, rest = _parse_noun(words, caption)
        if not rest:
            meta = (make_meta("colors", [shape], [color]) if color
                    else make_meta("single_object", [shape]))
        elif rest[0] == "and":
            shape2, color2, tail = _parse_noun(rest[1:], caption)
            if tail or (color is None) != (color2 is None):
                raise _grammar_error(caption)
            meta = (make_meta("color_attr", [shape, shape2], [color, color2]) if color
                    else make_meta("two_object", [shape, shape2]))
        else:
            relation = " ".join(rest[:2]) if rest[0] in ("left", "right") else rest[0]
            rest = rest[len(relation.split()):]
            if relation not in RELATIONS or color is not None:
                raise _grammar_error(caption)
            shape2, color2, tail = _parse_noun(rest, caption)
            if tail or color2 is not None:
                raise _grammar_error(caption)
            meta = make_meta("position", [shape, shape2], relation=relation)
    meta["prompt"] = caption
    return meta


def tokenize(captions: Sequence[str]) -> torch.Tensor:
    """Captions [B] -> word ids LongTensor [B, MAX_WORDS], right-padded with 0 ("<pad>").

    Raises ValueError naming the word and caption when a word is outside the grammar.
    """
    if isinstance(captions, str):
        raise TypeError("tokenize expects a sequence of captions, got a single str; wrap it in a list")
    out = torch.zeros(len(captions), MAX_WORDS, dtype=torch.long)
    for row, caption in enumerate(captions):
        words = _check_words(caption)
        if len(words) > MAX_WORDS:
            raise CaptionError(f"caption {quoted(caption)} has {len(words)} words; the shapes grammar "
                             f"allows at most MAX_WORDS={MAX_WORDS}")
        out[row, :len(words)] = torch.tensor([_INDEX[w] for w in words], dtype=torch.long)
    return out


# The phrase lexicon: the shapes world's text encoder. Word ids carry no binding: with the shapes
# GPT's conditioning, "a red circle and a blue square" and "a blue circle and a red square" read
# alike (benchmarks/caption_binding.py: 0.0 nats apart after 2400 steps). A pretrained text encoder
# gives contextual features in which "red" belongs to "circle"; the lexicon stands in for one by
# giving every noun phrase of the grammar its own token: "red circle", "three triangles", and for
# position captions each object with its own relation ("circle left of", "square right of").
INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
PHRASES: tuple[str, ...] = (
    "<pad>", *SHAPES, *(f"{c} {s}" for c in COLOR_NAMES for s in SHAPES),
    *(f"{NUMBERS[n]} {PLURALS[s]}" for n in NUMBERS for s in SHAPES),
    *(f"{s} {r}" for r in RELATIONS for s in SHAPES),
)
MAX_PHRASES = 2
_PHRASE_INDEX = {phrase: i for i, phrase in enumerate(PHRASES)}


def phrases(meta: Meta) -> list[str]:
    """The noun phrases of a caption's metadata, in caption order (one or two of PHRASES)."""
    include = meta["include"]
    if meta["tag"] == "counting":
        return [f"{NUMBERS[include[0]['count']]} {PLURALS[include[0]['class']]}"]
    if meta["tag"] == "position":
        target, subject = include
        relation = subject["position"][0]
        return [f"{subject['class']} {relation}", f"{target['class']} {INVERSE[relation]}"]
    return [f"{g['color']} {g['class']}" if "color" in g else g["class"] for g in include]


def phrase_tokenize(captions: Sequence[str]) -> torch.Tensor:
    """Captions [B] -> phrase ids LongTensor [B, MAX_PHRASES], right-padded with 0 ("<pad>").

    Raises ValueError naming the word (or the caption) when a caption is outside the grammar.
    """
    if isinstance(captions, str):
        raise TypeError("phrase_tokenize expects a sequence of captions, got a single str; wrap it in a list")
    out = torch.zeros(len(captions), MAX_PHRASES, dtype=torch.long)
    for row, caption in enumerate(captions):
        ids = [_PHRASE_INDEX[p] for p in phrases(parse(caption))]
        out[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


# Caption encodings a shapes GPT can be trained on: name -> (tokenize, prefix slots, vocabulary).
ENCODINGS = {"words": (tokenize, MAX_WORDS, len(VOCAB)),
             "phrases": (phrase_tokenize, MAX_PHRASES, len(PHRASES))}
ENCODINGS_SUMMARY = ", ".join(f"{n} ({s} slots, {v} tokens)" for n, (_, s, v) in ENCODINGS.items())


def encoding_of(prefix_len: int, word_vocab: int) -> str:
    """The name of the caption encoding a GPT with this prefix and vocabulary was trained on."""
    for name, (_, slots, vocab) in ENCODINGS.items():
        if (slots, vocab) == (prefix_len, word_vocab):
            return name
    raise ValueError(f"no shapes caption encoding has {prefix_len} slots and {word_vocab} tokens; "
                     f"known: {ENCODINGS_SUMMARY}")


def prompt_set(n: int, seed: int) -> list[Meta]:
    """n deterministic GenEval-style metadata dicts, balanced over the six tags.

    Tags alternate round-robin (so any prefix is balanced too); within a tag the captions are a
    seeded permutation of all captions of that tag, cycled when n exceeds them (single_object has
    only 4). n = 64 is the quick default, n = 553 the GenEval-sized set.
    """
    if n < 0:
        raise ValueError(f"prompt_set size must be >= 0, got {n}")
    rng = np.random.default_rng(seed)
    pools = {tag: all_metas(tag) for tag in TAGS}
    orders = {tag: rng.permutation(len(pool)) for tag, pool in pools.items()}
    out: list[Meta] = []
    for i in range(n):
        tag = TAGS[i % len(TAGS)]
        k = i // len(TAGS)
        pool, order = pools[tag], orders[tag]
        out.append(pool[int(order[k % len(pool)])])
    return [dict(m, include=[dict(g) for g in m["include"]]) for m in out]
