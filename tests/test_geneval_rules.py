"""GenEval's rule engine on fabricated detections: every rule and its edge cases."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from evaluators.geneval_rules import (Detection, GenEvalRules, box_iou, paired_difference, summarize,
                                       tag_accuracies)

RULES = GenEvalRules()


def det(cls: str, x: float, y: float, score: float = 0.95, color: str | None = "red",
        size: float = 10.0) -> Detection:
    """A square detection of side `size` centred at (x, y)."""
    h = size / 2
    return Detection(cls=cls, box=(x - h, y - h, x + h, y + h), score=score, mask=None, color=color)


def meta(tag: str, include: list[dict], exclude: list[dict] | None = None) -> dict:
    out = {"tag": tag, "include": include, "prompt": "p"}
    if exclude is not None:
        out["exclude"] = exclude
    return out


SINGLE = meta("single_object", [{"class": "circle", "count": 1}])


def two_of(cls: str) -> dict:
    return meta("counting", [{"class": cls, "count": 2}], [{"class": cls, "count": 3}])


def position(relation: str) -> dict:
    return meta("position", [{"class": "square", "count": 1},
                             {"class": "circle", "count": 1, "position": [relation, 0]}])


def test_defaults_are_the_official_options() -> None:
    assert (RULES.threshold, RULES.counting_threshold, RULES.max_objects, RULES.max_overlap,
            RULES.position_threshold) == (0.3, 0.9, 16, 1.0, 0.1)


def test_threshold_is_strict() -> None:
    assert RULES.evaluate([det("circle", 20, 20, score=0.3)], SINGLE) == (False, "expected circle>=1, found 0")
    assert RULES.evaluate([det("circle", 20, 20, score=0.3001)], SINGLE) == (True, "")


def test_counting_threshold_applies_to_all_classes_only_for_counting() -> None:
    dets = [det("circle", 10, 10, 0.85), det("circle", 40, 40, 0.95)]
    assert not RULES.evaluate(dets, two_of("circle"))[0]
    assert RULES.evaluate(dets, meta("two_object", [{"class": "circle", "count": 2}]))[0]
    exactly = [det("circle", 10, 10, 0.9), det("circle", 40, 40, 0.91)]
    assert not RULES.evaluate(exactly, two_of("circle"))[0]


def test_counting_exclude() -> None:
    dets = [det("circle", 10 + 20 * i, 10) for i in range(3)]
    assert RULES.evaluate(dets[:2], two_of("circle")) == (True, "")
    assert RULES.evaluate(dets, two_of("circle")) == (False, "expected circle<3, found 3")
    assert RULES.evaluate(dets[:1], two_of("circle")) == (False, "expected circle>=2, found 1")
    # other classes do not count towards the exclude clause
    assert RULES.evaluate(dets[:2] + [det("square", 80, 80)], two_of("circle"))[0]


def test_max_objects_caps_the_count() -> None:
    dets = [det("circle", 5 * i, 5, score=0.95 - 0.001 * i) for i in range(20)]
    capped = meta("counting", [{"class": "circle", "count": 16}], [{"class": "circle", "count": 17}])
    assert RULES.evaluate(dets, capped)[0]
    assert not GenEvalRules(max_objects=20).evaluate(dets, capped)[0]


def test_max_overlap_suppresses_duplicates() -> None:
    twins = [det("circle", 20, 20, 0.95), det("circle", 21, 20, 0.9), det("circle", 60, 60, 0.92)]
    assert len(RULES.select(twins, "two_object")["circle"]) == 3  # 1.0 = own NMS off
    kept = GenEvalRules(max_overlap=0.5).select(twins, "two_object")["circle"]
    assert [d.score for d in kept] == [0.95, 0.92]


def test_select_sorts_by_score() -> None:
    dets = [det("circle", 10, 10, 0.5), det("circle", 30, 30, 0.8), det("square", 50, 50, 0.6)]
    kept = RULES.select(dets, "two_object")
    assert [d.score for d in kept["circle"]] == [0.8, 0.5]
    assert set(kept) == {"circle", "square"}


# Float32 parity: evaluate_images.py works on mmdet's float32 result arrays (GenEval pins numpy 1.23.1).


def test_threshold_compares_float32_score_with_float32_threshold() -> None:
    # `bbox[index][ordering, 4] > confidence_threshold`: a float32 array against a Python float, which
    # numpy compares in float32, so the threshold is float32(0.3) = 0.30000001192...
    just_above = 0.30000001
    assert just_above > 0.3 and np.float32(just_above) == np.float32(0.3)
    assert RULES.evaluate([det("circle", 20, 20, score=just_above)], SINGLE) == (False, "expected circle>=1, found 0")
    # a detector's float32 0.3, handed over as a Python float, is above 0.3 in float64 but equal in float32
    f32_point_3 = float(np.float32(0.3))
    assert f32_point_3 > 0.3
    assert not RULES.evaluate([det("circle", 20, 20, score=f32_point_3)], SINGLE)[0]
    # the next float32 up passes
    next_up = float(np.nextafter(np.float32(0.3), np.float32(1)))
    assert RULES.evaluate([det("circle", 20, 20, score=next_up)], SINGLE)[0]
    # counting: 0.9000000001 > 0.9 in float64, but rounds onto float32(0.9) = 0.89999998
    over = 0.9000000001
    assert over > 0.9 and np.float32(over) == np.float32(0.9)
    assert not RULES.evaluate([det("circle", 10, 10, over), det("circle", 40, 40, 0.95)], two_of("circle"))[0]


def test_position_centre_is_a_float32_sum() -> None:
    # b spans x 0..10 (centre 5); a spans x 4 + 2**-21 .. 14, both ends exact in float32.
    # float64: centre 9 + 2**-22, width 10 - 2**-21, dx = (4 + 2**-22 - 0.1 * (20 - 2**-21)) / (4 + 2**-22)
    #   = 0.50000003 > 0.5 -> "right of".
    # float32 (boxes.mean on the float32 boxes): x1 + x2 = 18 + 2**-21 rounds to 18 (float32 spacing at 18
    #   is 2**-19) and the width 10 - 2**-21 rounds (half to even) to 10: dx = (4 - 2) / 4 = 0.5, not > 0.5.
    a = Detection("circle", (4 + 2.0 ** -21, 0.0, 14.0, 10.0), 0.95)
    b = Detection("square", (0.0, 0.0, 10.0, 10.0), 0.95)
    assert float(np.float32(a.box[0])) == a.box[0]
    assert RULES.relative_position(a, b) == set()
    assert RULES.evaluate([b, a], position("right of")) == (False, "expected circle right of target, found  target")


def test_position_threshold_is_float32() -> None:
    # widths 10 (a) and 33 (b): shrink = 0.1 * 43. a starts at float32(20.1) = 20.100000381...
    # float32: float32(0.1) * 43 = 4.30000006 rounds to float32(4.3) = 4.30000019, exactly half the centre
    #   offset float32(20.1) + 5 - 16.5 = 8.60000038, so dx = 0.5: no relation.
    # float64: dx = (8.60000038 - 4.3) / 8.60000038 = 0.50000002 > 0.5: "right of".
    x1 = float(np.float32(20.1))
    a = Detection("circle", (x1, 0.0, x1 + 10, 10.0), 0.95)
    b = Detection("square", (0.0, 0.0, 33.0, 10.0), 0.95)
    offset = x1 + 5 - 16.5
    assert (offset - 0.1 * 43) / offset > 0.5
    assert np.float32(np.float32(0.1) * np.float32(43)) == np.float32(offset) / 2
    assert RULES.relative_position(a, b) == set()
    assert not RULES.evaluate([b, a], position("right of"))[0]


def test_iou_sides_are_float32() -> None:
    # compute_iou on float32 rows: b's side 19.000000001 is 19 in float32, IoU = 100 / 200 = 0.5 exactly,
    # which is not < max_overlap 0.5, so b is suppressed (in float64 IoU is just below 0.5 and b stays)
    a = Detection("circle", (0.0, 0.0, 9.0, 9.0), 0.9)
    b = Detection("circle", (0.0, 0.0, 9.0, 19.000000001), 0.8)
    assert 100 / (10 * 20.000000001) < 0.5
    assert box_iou(a.box, b.box) == 0.5
    assert GenEvalRules(max_overlap=0.5).select([a, b], "two_object")["circle"] == [a]
    # only the sides are float32: numpy 1.23 makes `side + 1` float64, so areas and the quotient are
    # float64. c's side 17 + 2**-19 (exact in float32) gives IoU 90 / 180.000019 < 0.5 and c stays;
    # all-float32 arithmetic would round the union to 180 and suppress it
    c = Detection("circle", (0.0, 0.0, 9.0, 17 + 2.0 ** -19), 0.8)
    small = Detection("circle", (0.0, 0.0, 9.0, 8.0), 0.9)
    assert box_iou(small.box, c.box) == 90 / (10 * (18 + 2.0 ** -19)) < 0.5
    assert GenEvalRules(max_overlap=0.5).select([small, c], "two_object")["circle"] == [small, c]


def test_tied_scores_put_the_later_detection_first() -> None:
    # `np.argsort(scores)[::-1]`: numpy's quicksort insertion-sorts up to 16 items, keeping tied ones in
    # input order, and the reversal then ranks the later of two tied detections first
    red = meta("colors", [{"class": "circle", "count": 1, "color": "red"}])
    tied = [det("circle", 10, 10, 0.8, "blue"), det("circle", 40, 40, 0.8, "red")]
    assert RULES.evaluate(tied, red) == (True, "")
    # tied in float32 only: 0.80000001 and 0.8 are both float32(0.8)
    assert 0.80000001 > 0.8 and np.float32(0.80000001) == np.float32(0.8)
    tied32 = [det("circle", 10, 10, 0.80000001, "blue"), det("circle", 40, 40, 0.8, "red")]
    assert [d.color for d in RULES.select(tied32, "colors")["circle"]] == ["red", "blue"]
    assert RULES.evaluate(tied32, red)[0]


def test_many_tied_scores_follow_numpys_introsort() -> None:
    # 20 circles, all 0.5 except 0.2 at inputs 3 and 11. The official code sorts the whole class (below
    # threshold included) with numpy's default argsort, which partitions arrays over 16 items and is then
    # not stable. numpy 1.23.5 (GenEval pins 1.23.1) gives, reversed:
    # [19, 18, 1, 2, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17, 0, 11, 3]; threshold and the cap of 16
    # keep the first 16 of these (inputs 0 and 17 are dropped, not 18 and 19)
    dets = [det("circle", 10 * i, 5, 0.2 if i in (3, 11) else 0.5) for i in range(20)]
    kept = RULES.select(dets, "counting_free")["circle"]
    assert [next(i for i, d0 in enumerate(dets) if d0 is d) for d in kept] == [19, 18, 1, 2, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16]


def test_box_iou_uses_inclusive_pixels() -> None:
    assert box_iou((0, 0, 9, 9), (0, 0, 9, 9)) == 1.0
    assert box_iou((0, 0, 9, 9), (10, 0, 19, 9)) == 0.0
    assert box_iou((0, 0, 9, 9), (5, 0, 14, 9)) == pytest.approx(50 / 150)


def test_colour_single() -> None:
    red = meta("colors", [{"class": "circle", "count": 1, "color": "red"}])
    assert RULES.evaluate([det("circle", 20, 20, color="red")], red)[0]
    ok, reason = RULES.evaluate([det("circle", 20, 20, color="blue")], red)
    assert not ok and reason == "expected red circle>=1, found 0 red; and 1 blue"


def test_colour_uses_only_the_top_count_objects() -> None:
    red = meta("colors", [{"class": "circle", "count": 1, "color": "red"}])
    dets = [det("circle", 10, 10, 0.9, "blue"), det("circle", 40, 40, 0.8, "red")]
    assert not RULES.evaluate(dets, red)[0]


def test_colour_with_count_two() -> None:
    two_red = meta("color_attr", [{"class": "circle", "count": 2, "color": "red"}])
    assert RULES.evaluate([det("circle", 10, 10, 0.9), det("circle", 40, 40, 0.8)], two_red)[0]
    mixed = [det("circle", 10, 10, 0.9), det("circle", 40, 40, 0.8, "blue"), det("circle", 70, 70, 0.7)]
    ok, reason = RULES.evaluate(mixed, two_red)
    assert not ok and "found 1 red; and 1 red, 1 blue" in reason


def test_colour_missing_raises() -> None:
    red = meta("colors", [{"class": "circle", "count": 1, "color": "red"}])
    with pytest.raises(ValueError, match="colour classifier"):
        RULES.evaluate([det("circle", 20, 20, color=None)], red)


def test_color_attr_needs_both() -> None:
    m = meta("color_attr", [{"class": "circle", "count": 1, "color": "red"},
                            {"class": "square", "count": 1, "color": "blue"}])
    assert RULES.evaluate([det("circle", 10, 10, color="red"), det("square", 40, 40, color="blue")], m)[0]
    ok, reason = RULES.evaluate([det("circle", 10, 10, color="blue"), det("square", 40, 40, color="red")], m)
    assert not ok and len(reason.splitlines()) == 2


@pytest.mark.parametrize("relation, dx, dy", [("left of", -30, 0), ("right of", 30, 0),
                                              ("above", 0, -30), ("below", 0, 30)])
def test_position_relations(relation: str, dx: float, dy: float) -> None:
    dets = [det("square", 50, 50), det("circle", 50 + dx, 50 + dy)]
    assert RULES.evaluate(dets, position(relation)) == (True, "")
    for other in {"left of", "right of", "above", "below"} - {relation}:
        assert not RULES.evaluate(dets, position(other))[0]


def test_position_threshold_boundary() -> None:
    # boxes 10 wide: revised dx = (d - 0.1 * 20) / d, which is 0.5 at d = 4 (strict >)
    b = det("square", 50, 50)
    assert RULES.relative_position(det("circle", 54, 50), b) == set()
    assert RULES.relative_position(det("circle", 54.01, 50), b) == {"right of"}


def test_position_no_relation_when_centres_close() -> None:
    b = det("square", 50, 50)
    assert RULES.relative_position(det("circle", 51, 51), b) == set()
    ok, reason = RULES.evaluate([b, det("circle", 51, 51)], position("right of"))
    assert not ok and reason == "expected circle right of target, found  target"


def test_position_diagonal_gives_two_relations() -> None:
    b = det("square", 50, 50, size=0.0)
    assert RULES.relative_position(det("circle", 80, 80, size=0.0), b) == {"right of", "below"}


def test_position_without_target_fails() -> None:
    ok, reason = RULES.evaluate([det("circle", 80, 50)], position("right of"))
    assert not ok
    assert reason.splitlines() == ["expected square>=1, found 0", "no target for circle to be right of"]


def test_position_target_failed_colour_means_no_target() -> None:
    m = meta("position", [{"class": "square", "count": 1, "color": "blue"},
                          {"class": "circle", "count": 1, "position": ["right of", 0]}])
    ok, reason = RULES.evaluate([det("square", 50, 50, color="red"), det("circle", 80, 50)], m)
    assert not ok and "no target for circle to be right of" in reason


def test_position_checks_every_pair_of_top_objects() -> None:
    m = meta("position", [{"class": "square", "count": 2},
                          {"class": "circle", "count": 1, "position": ["right of", 0]}])
    squares = [det("square", 20, 50, 0.9), det("square", 50, 50, 0.8)]
    assert RULES.evaluate(squares + [det("circle", 80, 50)], m)[0]
    assert not RULES.evaluate(squares + [det("circle", 35, 50)], m)[0]
    # a third, lower-ranked square on the wrong side is not among the top 2
    assert RULES.evaluate(squares + [det("square", 95, 50, 0.5), det("circle", 80, 50)], m)[0]


def test_bad_group_reference_raises() -> None:
    m = meta("position", [{"class": "circle", "count": 1, "position": ["right of", 1]}])
    with pytest.raises(ValueError, match="earlier include group"):
        RULES.evaluate([det("circle", 50, 50)], m)


def test_summary_overall_is_unweighted_mean_of_tags() -> None:
    frame = pd.DataFrame({
        "tag": ["counting", "counting", "position", "position", "position", "position"],
        "correct": [True, True, True, False, False, False],
        "prompt_id": ["a", "a", "b", "b", "c", "c"],
    })
    summary = summarize(frame).set_index(["metric", "subset"])
    assert summary.loc[("geneval", "counting"), "value"] == 1.0
    assert summary.loc[("geneval", "position"), "value"] == 0.25
    assert summary.loc[("geneval", "all"), "value"] == pytest.approx(0.625)
    assert summary.loc[("geneval", "all"), "n"] == 6
    assert summary.loc[("geneval_images", "all"), "value"] == 0.5
    assert summary.loc[("geneval_prompts", "all"), "value"] == pytest.approx(2 / 3)
    se = math.sqrt(0.25 * 0.75 / 3)
    assert summary.loc[("geneval", "position"), "stderr"] == pytest.approx(se)
    assert tag_accuracies(frame["tag"], frame["correct"]) == {
        "counting": 1.0, "position": 0.25, "overall": 0.625}


def test_summary_rejects_bad_frames() -> None:
    with pytest.raises(ValueError, match="tag"):
        summarize(pd.DataFrame({"correct": [True]}))
    with pytest.raises(ValueError, match="no images"):
        summarize(pd.DataFrame({"tag": [], "correct": []}))


def test_masks_pass_through() -> None:
    mask = np.zeros((8, 8), dtype=bool)
    d = Detection(cls="circle", box=(0, 0, 4, 4), score=0.5, mask=mask, color="red")
    assert RULES.select([d], "single_object")["circle"][0].mask is mask


def _frame(tags: list[str], correct: list[int], ids: list[str] | None = None) -> pd.DataFrame:
    ids = ids or [f"s{i}" for i in range(len(tags))]
    return pd.DataFrame({"sample_id": ids, "tag": tags, "correct": [bool(c) for c in correct]})


def _overall(frame: pd.DataFrame) -> float:
    s = summarize(frame, prompt_column=None)
    return float(s[(s.metric == "geneval") & (s.subset == "all")].value.iloc[0])


def test_paired_difference_is_the_difference_of_the_overall_scores() -> None:
    tags = ["counting"] * 4 + ["position"] * 3
    a = _frame(tags, [1, 1, 0, 0, 1, 1, 1])
    b = _frame(tags, [0, 1, 0, 1, 0, 0, 1])
    gap, se = paired_difference(a, b)
    assert gap == pytest.approx(_overall(a) - _overall(b))
    # by hand: counting d = (1, 0, 0, -1): var 2/3, / 4 = 1/6; position d = (1, 1, 0): var 1/3, / 3 = 1/9
    assert se == pytest.approx(math.sqrt(1 / 6 + 1 / 9) / 2)
    assert paired_difference(b, a) == pytest.approx((-gap, se))


def test_paired_difference_matches_samples_by_id_and_keeps_the_pairing() -> None:
    tags = ["colors"] * 6
    a = _frame(tags, [1, 1, 1, 0, 0, 1])
    # the same samples in reverse order
    b = _frame(tags[::-1], [1, 0, 0, 1, 1, 1], ids=[f"s{i}" for i in range(6)][::-1])
    gap, se = paired_difference(a, b)
    assert gap == pytest.approx(0.0) and se == pytest.approx(0.0), "identical verdicts once matched by id"
    # one changed verdict: d = (0, 0, 0, 0, 0, 1), var 1/6, / 6; below the unpaired error
    c = _frame(tags, [1, 1, 1, 0, 0, 0])
    gap, se = paired_difference(a, c)
    unpaired = math.sqrt((4 / 6) * (2 / 6) / 5 + (3 / 6) * (3 / 6) / 5)
    assert gap == pytest.approx(1 / 6) and se == pytest.approx(1 / 6) and se < unpaired


def test_paired_difference_refuses_different_samples() -> None:
    a = _frame(["colors", "colors"], [1, 0])
    with pytest.raises(ValueError, match="same samples"):
        paired_difference(a, _frame(["colors", "colors"], [1, 0], ids=["s0", "x"]))
    with pytest.raises(ValueError, match="different tags"):
        paired_difference(a, _frame(["colors", "position"], [1, 0]))
    with pytest.raises(ValueError, match="no samples"):
        paired_difference(a.iloc[:0], a.iloc[:0])
    with pytest.raises(ValueError, match="repeated"):
        paired_difference(a, _frame(["colors", "colors"], [1, 0], ids=["s0", "s0"]))
