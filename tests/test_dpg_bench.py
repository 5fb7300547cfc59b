"""DPG-Bench scoring on a hand-built question graph with fabricated VQA answers, in both modes."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from evaluators.dpg_bench import DPGBenchEvaluator, Question, load_questions, make_grid, question_scores, split_grid
from harness.api import Prompt
from harness.samples import SampleSet, plan

HEADER = ["item_id", "text", "keywords", "proposition_id", "dependency", "category_broad", "category_detailed",
          "tuple", "question_natural_language"]
# item "a": 1 cat (root) <- 2 cat is black <- 3 black cat is fluffy; 4 sofa (root) <- 5 cat on sofa (1, 4)
# item "b": 1 dog (root) <- 2 dog is running
ROWS = [
    ("a", 1, "0", "entity - whole (cat)", "Is there a cat?"),
    ("a", 2, "1", "attribute - color (cat, black)", "Is the cat black?"),
    ("a", 3, "2", "attribute - texture (cat, fluffy)", "Is the black cat fluffy?"),
    ("a", 4, "0", "entity - whole (sofa)", "Is there a sofa?"),
    ("a", 5, "1,4", "relation - spatial (cat, sofa, on)", "Is the cat on the sofa?"),
    ("b", 1, "0", "entity - whole (dog)", "Is there a dog?"),
    ("b", 2, "1", "entity - state (dog, run)", "Is the dog running?"),
]


def write_csv(path: Path, rows=ROWS) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        for item, pid, dep, tup, question in rows:
            writer.writerow([item, "text", "kw", pid, dep, tup.split(" - ")[0], tup.split("(")[0], tup, question])
    return path


class FakeVQA:
    """Answers from a table keyed by (tile brightness, question); unknown -> "no"."""

    name = "fake"

    def __init__(self, table: dict[tuple[int, str], str]) -> None:
        self.table = table
        self.calls = 0

    def answer(self, image: np.ndarray, questions: Sequence[str]) -> list[str]:
        self.calls += 1
        return [self.table.get((int(image[0, 0, 0]), q), "no") for q in questions]


def graph_a(tmp_path: Path, compat: bool = False) -> list[Question]:
    return load_questions(write_csv(tmp_path / "q.csv"), official_compat=compat)["a"]


def test_dependency_rule_corrected_is_transitive(tmp_path: Path) -> None:
    questions = graph_a(tmp_path)
    # cat yes, black no, fluffy yes (zeroed: parent failed), sofa yes, on yes
    raw, adjusted = question_scores(questions, ["yes", "no", "yes", "yes", "yes"], official_compat=False)
    assert raw.tolist() == [1, 0, 1, 1, 1] and adjusted.tolist() == [1, 0, 0, 1, 1]
    # no cat: everything depending on it goes, transitively (3 depends on 2 depends on 1)
    raw, adjusted = question_scores(questions, ["no", "yes", "yes", "yes", "yes"], official_compat=False)
    assert adjusted.tolist() == [0, 0, 0, 1, 0]
    # answers are normalised in corrected mode only
    assert question_scores(questions, [" Yes"] * 5, False)[1].tolist() == [1] * 5
    assert question_scores(questions, [" Yes"] * 5, True)[1].tolist() == [0] * 5


def test_dependency_rule_official_is_one_level(tmp_path: Path) -> None:
    questions = graph_a(tmp_path)
    raw, adjusted = question_scores(questions, ["no", "yes", "yes", "yes", "yes"], official_compat=True)
    # 2 and 5 have the failed parent 1; 3's parent 2 answered "yes", so 3 keeps its 1 (one level only)
    assert adjusted.tolist() == [0, 0, 1, 1, 0]


def test_compat_drops_first_row_and_the_item_fails(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "q.csv")
    assert len(load_questions(path)["a"]) == 5
    compat = load_questions(path, official_compat=True)["a"]
    assert [q.pid for q in compat] == [2, 3, 4, 5]
    with pytest.raises(KeyError):
        question_scores(compat, ["yes"] * 4, official_compat=True)


def test_grid_round_trip() -> None:
    tiles = [np.full((8, 8, 3), v, np.uint8) for v in (10, 20, 30, 40)]
    grid = make_grid(tiles)
    assert grid.shape == (16, 16, 3)
    assert [t[0, 0, 0] for t in split_grid(grid, 8)] == [10, 20, 30, 40]
    with pytest.raises(ValueError, match="4 square images"):
        make_grid(tiles[:3])


def sample_set(root: Path, items: Sequence[str]) -> SampleSet:
    prompts = [Prompt(id=f"dpg_bench/{i}", text=f"prompt {i}", meta={"item_id": i}) for i in items]
    samples = SampleSet(root)
    for spec in plan(prompts, 4, 0):
        samples.write(spec, np.full((8, 8, 3), 10 * (spec.image_index + 1), np.uint8), {})
    return samples


def table() -> dict[tuple[int, str], str]:
    """Tile brightness 10/20/30/40 = image index 0..3 of a prompt."""
    answers: dict[tuple[int, str], str] = {}
    for tile in (10, 20, 30, 40):
        for _, _, _, _, q in ROWS:
            answers[(tile, q)] = "yes"
    answers[(20, "Is there a cat?")] = "no"       # tile 2: cat missing -> 2, 3, 5 zeroed (corrected)
    answers[(40, "Is the cat black?")] = "no"     # tile 4: black missing -> 3 zeroed
    answers[(30, "Is the dog running?")] = "no"
    return answers


def test_evaluator_corrected_scores(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "s", ["a", "b"])
    ev = DPGBenchEvaluator(FakeVQA(table()), questions=str(write_csv(tmp_path / "q.csv")), show_progress=False,
                           verify_questions=False)
    res = ev.evaluate(samples)
    per = res.per_sample.set_index("item_id")
    # a: tiles 1.0, (1 of 5 -> sofa only) 0.2, 1.0, (cat, sofa, on) 0.6 ; b: 1, 1, 0.5, 1
    assert per.loc["a", "score"] == pytest.approx((1 + 0.2 + 1 + 0.6) / 4)
    assert per.loc["b", "score"] == pytest.approx(3.5 / 4)
    summary = res.summary.set_index(["metric", "subset"])["value"]
    assert summary[("dpg_bench", "all")] == pytest.approx(100 * (0.7 + 0.875) / 2)
    # L1 "entity": a: cat (1,0,1,1) sofa (1,1,1,1); b: dog 4x1, running (1,1,0,1) -> 14/16
    assert summary[("dpg_bench_l1", "entity")] == pytest.approx(100 * 14 / 16)
    assert ("dpg_bench_l2", "attribute - color ") not in summary.index
    assert summary[("dpg_bench_l2", "attribute - color")] == pytest.approx(100 * 2 / 4)
    assert "corrected" in ev.version


def test_evaluator_official_compat_quirks(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "s", ["a", "b"])
    ev = DPGBenchEvaluator(FakeVQA(table()), questions=str(write_csv(tmp_path / "q.csv")), official_compat=True,
                           show_progress=False,
                           verify_questions=False)
    res = ev.evaluate(samples)
    per = res.per_sample.set_index("item_id")
    assert bool(per.loc["a", "failed"]) and np.isnan(per.loc["a", "score"])  # its first question was dropped
    summary = res.summary.set_index(["metric", "subset"])["value"]
    assert summary[("dpg_bench", "all")] == pytest.approx(100 * 3.5 / 4)  # only item b counts
    assert summary[("dpg_bench_failed", "all")] == 1
    # categories from the last tile only (tile 40: all yes for b) before zeroing
    assert summary[("dpg_bench_l1", "entity")] == pytest.approx(100.0)


def test_evaluator_rejects_wrong_inputs(tmp_path: Path) -> None:
    questions = str(write_csv(tmp_path / "q.csv"))
    ev = DPGBenchEvaluator(FakeVQA({}), questions=questions, show_progress=False,
                           verify_questions=False)
    coco = SampleSet(tmp_path / "coco")
    for spec in plan([Prompt(id="coco5k/1", text="a cat")], 4, 0):
        coco.write(spec, np.zeros((8, 8, 3), np.uint8), {})
    with pytest.raises(ValueError, match="needs dataset=dpg_bench"):
        ev.evaluate(coco)
    one = SampleSet(tmp_path / "one")
    for spec in plan([Prompt(id="dpg_bench/a", text="x")], 1, 0):
        one.write(spec, np.zeros((8, 8, 3), np.uint8), {})
    with pytest.raises(ValueError, match="images_per_prompt=4"):
        ev.evaluate(one)
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="lacks columns"):
        load_questions(bad)
    with pytest.raises(Exception, match="not the pinned file"):
        DPGBenchEvaluator(FakeVQA({}), questions=questions, show_progress=False).evaluate(one)
