"""The shapes world: caption grammar, scene generator, renderer and detector (with the GenEval
rule engine as the judge of consistency)."""
from __future__ import annotations

import functools
import itertools
import logging
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch

from evaluators.geneval_rules import Detection, GenEvalRules
from harness.shapes import captions
from harness.shapes.captions import MAX_WORDS, TAGS, VOCAB, parse, tokenize
from harness.shapes.detector import ShapesDetector
from harness.shapes.scenes import (BACKGROUND, COLORS, GAP, MARGIN, SHAPES, Scene, prompt_set,
                                   render, sample_scene, scene_for_caption)

log = logging.getLogger(__name__)
RULES = GenEvalRules()
N_SCENES = 500


@functools.cache
def scenes() -> tuple[Scene, ...]:
    rng = np.random.default_rng(1234)
    return tuple(sample_scene(rng) for _ in range(N_SCENES))


@functools.cache
def detections(size: int) -> tuple[list, ...]:
    detector = ShapesDetector()
    return tuple(detector.detect(render(s, size)) for s in scenes())


# ----------------------------------------------------------------------------- grammar

def test_grammar_examples_and_geneval_schema() -> None:
    assert parse("a photo of a circle right of a square") == {
        "tag": "position",
        "include": [{"class": "square", "count": 1},
                    {"class": "circle", "count": 1, "position": ["right of", 0]}],
        "prompt": "a photo of a circle right of a square"}
    counting = parse("a photo of three triangles")
    assert list(counting) == ["tag", "include", "exclude", "prompt"]
    assert counting["include"] == [{"class": "triangle", "count": 3}]
    assert counting["exclude"] == [{"class": "triangle", "count": 4}]
    assert parse("a photo of an orange circle and a blue square")["include"] == [
        {"class": "circle", "count": 1, "color": "orange"},
        {"class": "square", "count": 1, "color": "blue"}]
    assert parse("a photo of a circle and a square")["tag"] == "two_object"
    assert parse("a photo of a red circle")["tag"] == "colors"
    assert parse("a photo of a cross")["tag"] == "single_object"


def test_every_caption_roundtrips_and_fits_the_vocabulary() -> None:
    longest = 0
    for tag in TAGS:
        metas = captions.all_metas(tag)
        assert len({m["prompt"] for m in metas}) == len(metas)
        for m in metas:
            assert m["tag"] == tag and parse(m["prompt"]) == m
            longest = max(longest, len(m["prompt"].split()))
    assert longest == MAX_WORDS
    assert VOCAB[0] == "<pad>" and len(set(VOCAB)) == len(VOCAB)
    used = {w for tag in TAGS for m in captions.all_metas(tag) for w in m["prompt"].split()}
    assert used == set(VOCAB[1:])


def test_twin_swaps_meaning_not_words() -> None:
    """A twin caption uses the same words, means the other binding, parses back, and is an
    involution; a scene of the caption fails its twin under GenEval's rules."""
    rules, rng = GenEvalRules(), np.random.default_rng(0)
    for tag in captions.TWIN_TAGS:
        for meta in captions.all_metas(tag)[:40]:
            other = captions.twin(meta)
            assert sorted(other["prompt"].split()) == sorted(meta["prompt"].split())
            assert other["prompt"] != meta["prompt"]
            assert parse(other["prompt"]) == other
            assert captions.twin(other) == meta
            dets = ShapesDetector().detect(render(scene_for_caption(meta, rng), 64))
            assert rules.evaluate(dets, meta)[0] and not rules.evaluate(dets, other)[0]
    with pytest.raises(ValueError, match="word-swapped twins"):
        captions.twin(parse("a photo of a circle"))


def test_tokenize_pads_right() -> None:
    ids = tokenize(["a photo of a circle", "a photo of a red circle and a blue square"])
    assert ids.dtype == torch.long and ids.shape == (2, MAX_WORDS)
    assert [VOCAB[i] for i in ids[0, :5]] == "a photo of a circle".split()
    assert ids[0, 5:].eq(0).all() and ids[1].ne(0).all()


@pytest.mark.parametrize("fn", [tokenize, lambda c: parse(c[0])])
def test_word_outside_grammar_is_named(fn) -> None:
    with pytest.raises(ValueError, match=r"'hexagon'.*'a photo of a hexagon'"):
        fn(["a photo of a hexagon"])


def test_malformed_captions() -> None:
    for bad in ("a photo of circle a", "a photo of a red circle left of a square",
                "a photo of a red circle and a square", "a photo of two circle", "photo of a circle"):
        with pytest.raises(ValueError, match="does not follow the shapes grammar"):
            parse(bad)
    with pytest.raises(ValueError, match="MAX_WORDS"):
        tokenize([" ".join(["a"] * (MAX_WORDS + 1))])
    with pytest.raises(TypeError):
        tokenize("a photo of a circle")


def test_phrases_tell_twins_apart_and_merge_paraphrases() -> None:
    """One phrase token per noun phrase: a caption and its word-swapped twin get different phrase
    sets (unlike their word bags), and "X left of Y" reads as "Y right of X"."""
    for tag in TAGS:
        for meta in captions.all_metas(tag):
            names = captions.phrases(meta)
            assert 1 <= len(names) <= captions.MAX_PHRASES and set(names) <= set(captions.PHRASES[1:])
    for tag in captions.TWIN_TAGS:
        for meta in captions.all_metas(tag)[:40]:
            assert sorted(captions.phrases(meta)) != sorted(captions.phrases(captions.twin(meta)))
    left = captions.phrase_tokenize(["a photo of a circle left of a square"])[0]
    right = captions.phrase_tokenize(["a photo of a square right of a circle"])[0]
    assert sorted(left.tolist()) == sorted(right.tolist())
    ids = captions.phrase_tokenize(["a photo of three crosses", "a photo of a red circle and a blue square"])
    assert ids.shape == (2, captions.MAX_PHRASES) and ids.dtype == torch.long
    assert [captions.PHRASES[i] for i in ids[0]] == ["three crosses", "<pad>"]
    assert [captions.PHRASES[i] for i in ids[1]] == ["red circle", "blue square"]
    with pytest.raises(ValueError, match="'hexagon'"):
        captions.phrase_tokenize(["a photo of a hexagon"])
    with pytest.raises(TypeError):
        captions.phrase_tokenize("a photo of a circle")


def test_encoding_is_recognised_from_slots_and_vocabulary() -> None:
    for name, (_, slots, vocab) in captions.ENCODINGS.items():
        assert captions.encoding_of(slots, vocab) == name
    with pytest.raises(ValueError, match="no shapes caption encoding has 3 slots and 11 tokens.*words"):
        captions.encoding_of(3, 11)


def test_prompt_set_is_balanced_and_deterministic() -> None:
    for n in (64, 553):
        metas = prompt_set(n, seed=0)
        assert len(metas) == n and metas == prompt_set(n, seed=0)
        counts = Counter(m["tag"] for m in metas)
        assert set(counts) == set(TAGS) and max(counts.values()) - min(counts.values()) <= 1
        assert all(parse(m["prompt"]) == m for m in metas)
    assert prompt_set(64, seed=0) != prompt_set(64, seed=1)
    small = prompt_set(64, seed=0)
    assert {m["prompt"] for m in small if m["tag"] == "single_object"} == {
        f"a photo of a {s}" for s in SHAPES}


# ----------------------------------------------------------------------------- scenes

def test_sample_scene_is_deterministic() -> None:
    a = [sample_scene(np.random.default_rng(7)) for _ in range(2)]
    assert a[0] == a[1]
    assert np.array_equal(render(a[0], 64), render(a[1], 64))
    rng = np.random.default_rng(7)
    assert sample_scene(rng) != sample_scene(rng)


def test_named_order_puts_the_first_named_object_first_in_raster_order() -> None:
    """The same draws as the free layout, with the two boxes assigned in reading order."""
    for seed in range(60):
        meta = captions.sample_meta(("two_object", "color_attr")[seed % 2], np.random.default_rng(seed))
        free = scene_for_caption(meta, np.random.default_rng([seed, 1]))
        named = scene_for_caption(meta, np.random.default_rng([seed, 1]), named_order=True)
        boxes = lambda scene: sorted((s.cx, s.cy, s.size) for s in scene.shapes)  # noqa: E731
        assert boxes(free) == boxes(named)
        first, second = named.shapes
        assert (first.kind, second.kind) == tuple(g["class"] for g in meta["include"])
        assert (first.box[1], first.box[0]) <= (second.box[1], second.box[0])
        dets = ShapesDetector().detect(render(named, 64))
        assert RULES.evaluate(dets, meta)[0]
    position = captions.all_metas("position")[5]
    assert (scene_for_caption(position, np.random.default_rng(3), named_order=True)
            == scene_for_caption(position, np.random.default_rng(3)))


def test_sample_scene_restricted_to_tags() -> None:
    """The training curriculum draws captions from a subset of tags; unknown tags are refused."""
    rng = np.random.default_rng(3)
    scenes = [sample_scene(rng, ("colors",)) for _ in range(20)]
    assert {s.meta["tag"] for s in scenes} == {"colors"}
    assert all(len(s.shapes) == 1 and s.shapes[0].color == s.meta["include"][0]["color"] for s in scenes)
    with pytest.raises(ValueError, match="subset"):
        sample_scene(rng, ("colours",))


def test_palette() -> None:
    assert list(COLORS) == ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown",
                            "black", "white"]
    palette = np.array([BACKGROUND, *COLORS.values()], dtype=float)
    dist = np.linalg.norm(palette[:, None] - palette[None], axis=-1)
    assert dist[~np.eye(len(palette), dtype=bool)].min() > 80


def _gap(a, b) -> float:
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = a.box, b.box
    return max(bx1 - ax2, ax1 - bx2, by1 - ay2, ay1 - by2)


def test_scenes_match_their_captions() -> None:
    tags = Counter()
    for scene in scenes():
        m, shapes = scene.meta, scene.shapes
        tags[m["tag"]] += 1
        assert scene.caption == m["prompt"] and parse(scene.caption) == m
        wanted = Counter({g["class"]: g["count"] for g in m["include"]})
        assert Counter(s.kind for s in shapes) == wanted and 1 <= len(shapes) <= 4
        for group in m["include"]:
            if "color" in group:
                assert any(s.kind == group["class"] and s.color == group["color"] for s in shapes)
        if m["tag"] in ("two_object", "color_attr", "position"):
            assert shapes[0].kind != shapes[1].kind
        for s in shapes:
            assert 0.2 <= s.size <= 0.4 and s.color in COLORS and s.kind in SHAPES
            assert min(s.box) >= MARGIN - 1e-9 and max(s.box) <= 1 - MARGIN + 1e-9
        for a, b in itertools.combinations(shapes, 2):
            assert _gap(a, b) >= GAP - 1e-9
    assert min(tags.values()) > N_SCENES / 6 * 0.7


def test_position_scenes_hold_the_relation_on_true_boxes() -> None:
    for scene in scenes():
        if scene.meta["tag"] != "position":
            continue
        target, subject = scene.meta["include"]
        a = next(s for s in scene.shapes if s.kind == subject["class"])
        b = next(s for s in scene.shapes if s.kind == target["class"])
        rel = RULES.relative_position(_as_detection(a), _as_detection(b))
        assert rel == {subject["position"][0]}


def _as_detection(shape) -> Detection:
    return Detection(cls=shape.kind, box=tuple(64 * c for c in shape.box), score=1.0,
                     mask=None, color=shape.color)


def test_render_at_both_resolutions() -> None:
    scene = scenes()[0]
    for size in (32, 64):
        image = render(scene, size)
        assert image.dtype == np.uint8 and image.shape == (size, size, 3)
        assert tuple(image[0, 0]) == BACKGROUND
        colours = {tuple(p) for p in image.reshape(-1, 3)}
        assert colours == {BACKGROUND} | {COLORS[s.color] for s in scene.shapes}
    with pytest.raises(ValueError, match="render size"):
        render(scene, 4)


def test_scene_for_caption_follows_metadata() -> None:
    m = parse("a photo of four crosses")
    scene = scene_for_caption(m, np.random.default_rng(0))
    assert scene.meta == m and [s.kind for s in scene.shapes] == ["cross"] * 4


# ----------------------------------------------------------------------------- detector

def _tag_accuracy(size: int) -> dict[str, float]:
    hits = defaultdict(list)
    for scene, dets in zip(scenes(), detections(size)):
        hits[scene.meta["tag"]].append(RULES.evaluate(dets, scene.meta)[0])
    acc = {tag: float(np.mean(v)) for tag, v in hits.items()}
    log.info("shapes detector, own caption correct at %d px: %s", size, acc)
    return acc


@pytest.mark.parametrize("size, floor", [(64, 0.98), (32, 0.95)])
def test_detector_makes_own_captions_correct(size: int, floor: float) -> None:
    acc = _tag_accuracy(size)
    assert set(acc) == set(TAGS)
    assert min(acc.values()) >= floor, acc


@pytest.mark.parametrize("size", [64, 32])
def test_detections_match_ground_truth(size: int) -> None:
    checks = []
    for scene, dets in zip(scenes(), detections(size)):
        checks.append(len(dets) == len(scene.shapes))
        for shape in scene.shapes:
            cx, cy = shape.cx * size, shape.cy * size
            near = [d for d in dets if abs((d.box[0] + d.box[2]) / 2 - cx) <= 1
                    and abs((d.box[1] + d.box[3]) / 2 - cy) <= 1]
            checks.append(len(near) == 1 and near[0].cls == shape.kind
                          and near[0].color == shape.color and near[0].score > 0.9
                          and near[0].mask.sum() > 0)
    assert np.mean(checks) >= 0.98


def test_wrong_captions_are_rejected() -> None:
    """A scene judged against a caption it does not depict fails."""
    wrong = 0
    total = 0
    for scene, dets in zip(scenes(), detections(64)):
        m = scene.meta
        if m["tag"] == "counting":
            n, cls = m["include"][0]["count"], m["include"][0]["class"]
            other = captions.make_meta("counting", [cls], count={2: 3, 3: 4, 4: 2}[n])
        elif m["tag"] == "position":
            rel = m["include"][1]["position"][0]
            flip = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
            other = captions.make_meta("position", [m["include"][1]["class"], m["include"][0]["class"]],
                                       relation=flip[rel])
        elif m["tag"] == "color_attr":
            a, b = m["include"]
            other = captions.make_meta("color_attr", [a["class"], b["class"]], [b["color"], a["color"]])
        else:
            continue
        total += 1
        wrong += not RULES.evaluate(dets, other)[0]
    assert total > 100 and wrong == total


def test_detector_tolerates_colour_drift() -> None:
    rng = np.random.default_rng(3)
    detector = ShapesDetector()
    ok = []
    for scene in scenes()[:150]:
        image = render(scene, 64).astype(float)
        image += rng.normal(0, 8, image.shape) + rng.normal(0, 8, (1, 1, 3))
        dets = detector.detect(np.clip(image, 0, 255).astype(np.uint8))
        ok.append(RULES.evaluate(dets, scene.meta)[0])
    assert np.mean(ok) >= 0.95


def test_detector_ignores_specks_and_blank_images() -> None:
    image = np.empty((32, 32, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    assert ShapesDetector().detect(image) == []
    image[5, 5] = COLORS["red"]
    image[20, 21:23] = COLORS["blue"]
    assert ShapesDetector().detect(image) == []
    with pytest.raises(ValueError, match="RGB image"):
        ShapesDetector().detect(image[..., 0])


def test_detector_scores_bars_and_blobs_low() -> None:
    image = np.empty((64, 64, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    image[10:14, 5:60] = COLORS["green"]  # a long bar is no shape of the world
    dets = ShapesDetector().detect(image)
    assert len(dets) == 1 and dets[0].score <= RULES.threshold
    assert dets[0].box == (5.0, 10.0, 60.0, 14.0) and dets[0].color == "green"
