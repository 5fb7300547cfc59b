"""DPG-Bench scoring on a hand-built question graph with fabricated VQA answers, in both modes."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pytest

from evaluators.dpg_bench import DPGBenchEvaluator, Question, load_questions, make_grid, question_scores, split_grid
from harness.api import Prompt
from harness.store.samples import SampleSet, plan

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
        self.asked: set[str] = set()

    def answer(self, image: np.ndarray, questions: Sequence[str]) -> list[str]:
        self.calls += 1
        self.asked.update(questions)
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


def test_dependency_rule_official_writes_zeros_back(tmp_path: Path) -> None:
    questions = graph_a(tmp_path)
    raw, adjusted = question_scores(questions, ["no", "yes", "yes", "yes", "yes"], official_compat=True)
    # the walk in CSV order: 1 is 0; 2 reads parent 1 = 0 -> 0 (written back); 3 reads parent 2, now 0 -> 0;
    # 4 root -> 1; 5 reads parent 1 = 0 -> 0. Zeroing one level only would have kept 3 at 1.
    assert raw.tolist() == [0, 1, 1, 1, 1] and adjusted.tolist() == [0, 0, 0, 1, 0]


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


# ----------------------------------------------------------------------------- official_compat quirks
# Each table below is scored by hand as compute_dpg_bench.py @3c228f1 would score it. Tiles 1..4 are
# image indices 0..3 of a prompt. SKIP is the first data row, which the script drops (its l.73-74); its
# dependency "0,0" keeps pandas from reading the dependency column as numbers, which stops the script.
SKIP = ("skip", 1, "0,0", "entity - whole (thing)", "Dropped question?")


def fake_vqa(answers: dict[str, str | Sequence[str]]) -> FakeVQA:
    """question -> its answer on all 4 tiles, or one answer per tile; other questions get "no"."""
    table: dict[tuple[int, str], str] = {}
    for question, answer in answers.items():
        per_tile = [answer] * 4 if isinstance(answer, str) else list(answer)
        for brightness, tile_answer in zip((10, 20, 30, 40), per_tile):
            table[(brightness, question)] = tile_answer
    return FakeVQA(table)


def run_mode(folder: Path, rows, answers: dict[str, str | Sequence[str]], items: Sequence[str],
             official: bool = True) -> tuple[pd.Series, pd.DataFrame, FakeVQA]:
    """(summary value by (metric, subset), per-sample frame by item_id, the fake VQA) of one run."""
    folder.mkdir(parents=True, exist_ok=True)
    vqa = fake_vqa(answers)
    ev = DPGBenchEvaluator(vqa, questions=str(write_csv(folder / "q.csv", rows)), official_compat=official,
                           show_progress=False, verify_questions=False)
    res = ev.evaluate(sample_set(folder / ("official" if official else "corrected"), items))
    return res.summary.set_index(["metric", "subset"])["value"], res.per_sample.set_index("item_id"), vqa


def test_official_failure_zeroes_the_whole_chain(tmp_path: Path) -> None:
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A cat?"),
            ("a", 2, "1", "attribute - color (cat, black)", "A black?"),
            ("a", 3, "2", "attribute - texture (cat, fluffy)", "A fluffy?"),
            ("a", 4, "0", "entity - whole (sofa)", "A sofa?")]
    answers = {"A cat?": ["no", "yes", "yes", "yes"], "A black?": "yes", "A fluffy?": "yes", "A sofa?": "yes"}
    summary, per, _ = run_mode(tmp_path, rows, answers, ["a"])
    # tile 1: cat 0; black reads cat = 0 -> 0; fluffy reads black, already zeroed -> 0; sofa 1 -> 1/4.
    # tiles 2-4: all 1. Grid (1/4 + 1 + 1 + 1) / 4 = 0.8125 (one-level zeroing would give 0.875).
    assert per.loc["a", "score"] == pytest.approx(0.8125)
    assert summary[("dpg_bench", "all")] == pytest.approx(81.25)


def test_official_zeroing_walks_csv_order(tmp_path: Path) -> None:
    # fluffy (3, child of 2) is listed before black (2, child of 1)
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A cat?"),
            ("a", 3, "2", "attribute - texture (cat, fluffy)", "A fluffy?"),
            ("a", 2, "1", "attribute - color (cat, black)", "A black?")]
    answers = {"A cat?": "no", "A fluffy?": "yes", "A black?": "yes"}
    summary, per, _ = run_mode(tmp_path, rows, answers, ["a"])
    # every tile: cat 0; fluffy reads black's score not yet zeroed (1) -> keeps 1; black reads cat = 0 -> 0.
    # tile = 1/3, grid = 1/3 (the corrected graph order zeroes all three: 0).
    assert per.loc["a", "score"] == pytest.approx(1 / 3)
    assert summary[("dpg_bench", "all")] == pytest.approx(100 / 3)


def test_official_unknown_parent_fails_only_when_reached(tmp_path: Path) -> None:
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A cat?"),
            ("a", 2, "1,9", "attribute - color (cat, black)", "A black?"),
            ("a", 3, "0", "entity - whole (sofa)", "A sofa?"),
            ("b", 1, "0", "entity - whole (dog)", "B dog?"),
            ("b", 2, "1,9", "attribute - color (dog, brown)", "B brown?"),
            ("b", 3, "0", "entity - whole (ball)", "B ball?"),
            ("c", 1, "0", "entity - whole (cow)", "C cow?"),
            ("c", 2, "9,1", "attribute - color (cow, white)", "C white?")]
    answers = {"A cat?": "no", "A black?": "yes", "A sofa?": "yes",
               "B dog?": ["no", "no", "no", "yes"], "B brown?": "yes", "B ball?": "yes",
               "C cow?": "no", "C white?": "yes"}
    summary, per, _ = run_mode(tmp_path, rows, answers, ["a", "b", "c"])
    # a, every tile: black's parents 1, 9: parent 1 = 0 stops the walk before the unknown 9
    #   -> [0, 0, 1] = 1/3.
    # b: tiles 1-3 like a; tile 4: dog = 1, so the walk looks up 9 -> KeyError -> b fails.
    # c: the unknown 9 comes first -> fails on tile 1. Score: a only, 100/3; 2 failed.
    assert per.loc["a", "score"] == pytest.approx(1 / 3) and not per.loc["a", "failed"]
    assert bool(per.loc["b", "failed"]) and bool(per.loc["c", "failed"])
    assert summary[("dpg_bench", "all")] == pytest.approx(100 / 3)
    assert summary[("dpg_bench_failed", "all")] == 2
    with pytest.raises(ValueError, match="inconsistent"):
        run_mode(tmp_path / "corrected", rows, answers, ["a"], official=False)


def test_official_repeated_question_id_is_one_entry(tmp_path: Path) -> None:
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A cat?"),
            ("a", 2, "1", "attribute - color (cat, black)", "A black?"),
            ("a", 2, "0", "attribute - texture (cat, fluffy)", "A fluffy?"),
            ("a", 3, "0", "entity - whole (dog)", "A dog?")]
    graph = load_questions(write_csv(tmp_path / "graph.csv", rows), official_compat=True)["a"]
    # id 2 keeps its first place and takes the last row's question, dependency and tuple
    assert [(q.pid, q.text, q.parents, q.l2) for q in graph] == [
        (1, "A cat?", (0,), "entity - whole"), (2, "A fluffy?", (0,), "attribute - texture"),
        (3, "A dog?", (0,), "entity - whole")]
    answers = {"A cat?": "no", "A black?": "yes", "A fluffy?": "yes", "A dog?": "yes"}
    summary, per, vqa = run_mode(tmp_path, rows, answers, ["a"])
    # 3 questions [cat 0, fluffy (no parent) 1, dog 1] -> 2/3 per tile and grid
    # (4 rows as in the corrected mode: [0, black zeroed 0, 1, 1] -> 1/2; first row kept: 1/3).
    assert per.loc["a", "score"] == pytest.approx(2 / 3) and per.loc["a", "questions"] == 3
    assert summary[("dpg_bench", "all")] == pytest.approx(200 / 3)
    assert "A black?" not in vqa.asked
    assert summary[("dpg_bench_l2", "attribute - texture")] == pytest.approx(100.0)
    assert ("dpg_bench_l2", "attribute - color") not in summary.index


def test_official_non_contiguous_item_starts_over(tmp_path: Path) -> None:
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A1?"),
            ("a", 2, "1", "attribute - color (cat, black)", "A2?"),
            ("b", 1, "0", "entity - whole (dog)", "B1?"),
            ("a", 3, "0", "entity - whole (sofa)", "A3?"),
            ("c", 1, "0", "entity - whole (cow)", "C1?"),
            ("b", 2, "1", "attribute - color (dog, brown)", "B2?")]
    answers = {"A1?": "no", "A2?": "yes", "A3?": "yes", "B1?": "yes", "B2?": "yes", "C1?": "no"}
    summary, per, _ = run_mode(tmp_path, rows, answers, ["a", "b", "c"])
    # a restarts at its third row: only A3 (yes) -> 1. c: C1 no -> 0.
    # b restarts at B2, whose parent 1 is gone -> KeyError -> b fails. Score (1 + 0) / 2 = 0.5.
    assert per.loc["a", "score"] == 1.0 and per.loc["a", "questions"] == 1
    assert bool(per.loc["b", "failed"])
    assert summary[("dpg_bench", "all")] == pytest.approx(50.0)
    assert summary[("dpg_bench_failed", "all")] == 1


def test_official_categories_names_and_last_tile(tmp_path: Path) -> None:
    rows = [SKIP,
            ("a", 1, "0", "entity (t-shirt)", "A shirt?"),
            ("a", 2, "1", "attribute - color (t-shirt, red-ish)", "A red?"),
            ("a", 3, "0", "global - style", "A style?")]
    answers = {"A shirt?": ["yes", "yes", "yes", "no"], "A red?": "yes", "A style?": "yes"}
    summary, per, _ = run_mode(tmp_path, rows, answers, ["a"])
    # tiles 1-3: 1; tile 4: [shirt 0, red zeroed 0, style 1] -> 1/3; grid (1 + 1 + 1 + 1/3) / 4, summed in
    # Python floats in tile order, nothing rounded.
    assert per.loc["a", "score"] == (1.0 + 1.0 + 1.0 + (0.0 + 0.0 + 1.0) / 3) / 4
    assert summary[("dpg_bench", "all")] == pytest.approx(100 * 10 / 12)
    # categories: the last tile's scores before zeroing: shirt 0, red 1, style 1.
    # L2 = text before "(" ("entity", "attribute - color", "global - style"); L1 = that L2 before "-".
    assert summary[("dpg_bench_l2", "entity")] == 0.0
    assert summary[("dpg_bench_l2", "attribute - color")] == 100.0
    assert summary[("dpg_bench_l2", "global - style")] == 100.0
    assert summary[("dpg_bench_l1", "entity")] == 0.0
    assert summary[("dpg_bench_l1", "attribute")] == 100.0 and summary[("dpg_bench_l1", "global")] == 100.0
    assert not any(level == "dpg_bench_l1" and "(" in cat for level, cat in summary.index)


def test_official_csv_read_by_pandas(tmp_path: Path) -> None:
    numeric = [("0", 1, "0,0", "entity - whole (thing)", "Dropped?"),
               ("7", 1, "0", "entity - whole (cat)", "Cat?"),
               ("7", 2, "1", "attribute - color (cat, black)", "Black?")]
    answers = {"Cat?": "yes", "Black?": "yes"}
    # all item ids numeric: pandas reads ints, which never equal the image name "7" -> the item fails
    summary, per, _ = run_mode(tmp_path / "numeric", numeric, answers, ["7"])
    assert bool(per.loc["7", "failed"]) and np.isnan(summary[("dpg_bench", "all")])
    corrected, _, _ = run_mode(tmp_path / "numeric", numeric, answers, ["7"], official=False)
    assert corrected[("dpg_bench", "all")] == pytest.approx(100.0)
    # an empty tuple is NaN: the item keeps its score (all yes -> 100) but its category rows stop there
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A cat?"),
            ("a", 2, "0", "", "A mystery?"),
            ("a", 3, "0", "relation - spatial (cat, sofa, on)", "A on?")]
    summary, _, _ = run_mode(tmp_path / "nan", rows, {"A cat?": "yes", "A mystery?": "yes", "A on?": "yes"},
                             ["a"])
    assert summary[("dpg_bench", "all")] == pytest.approx(100.0)
    assert summary[("dpg_bench_l1", "entity")] == 100.0
    assert ("dpg_bench_l1", "relation") not in summary.index
    # a dependency column of plain numbers is read as ints, whose missing .split stops the script (l.78)
    with pytest.raises(ValueError, match="official script stops"):
        run_mode(tmp_path / "ints", [("a", 1, "0", "entity - whole (cat)", "A cat?")] * 2, {}, ["a"])


def test_official_item_lookup_by_file_name(tmp_path: Path) -> None:
    rows = [SKIP, ("a", 1, "0", "entity - whole (cat)", "A cat?")]
    # "a.v2" is looked up as "a" (file name up to the first "."): cat yes -> 1; "c" has no questions -> fails
    summary, per, _ = run_mode(tmp_path, rows, {"A cat?": "yes"}, ["a.v2", "c"])
    assert per.loc["a.v2", "score"] == 1.0 and bool(per.loc["c", "failed"])
    assert summary[("dpg_bench", "all")] == pytest.approx(100.0)
    assert summary[("dpg_bench_failed", "all")] == 1
    with pytest.raises(ValueError, match="no questions"):
        run_mode(tmp_path / "corrected", rows, {"A cat?": "yes"}, ["c"], official=False)


def test_corrected_mode_differs_where_it_should(tmp_path: Path) -> None:
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A cat?"),
            ("a", 3, "2", "attribute - texture (cat, fluffy)", "A fluffy?"),
            ("a", 2, "1", "attribute - color (cat, black)", "A black?"),
            ("b", 1, "0", "entity - whole (dog)", "B dog?"),
            ("b", 2, "1", "entity - state (dog, run)", "B run?")]
    answers = {"A cat?": "no", "A fluffy?": "yes", "A black?": "yes",
               "B dog?": ["yes", "yes", "yes", " Yes"], "B run?": "yes"}
    official, _, _ = run_mode(tmp_path, rows, answers, ["a", "b"])
    corrected, _, _ = run_mode(tmp_path, rows, answers, ["a", "b"], official=False)
    # official: a, every tile [cat 0, fluffy reads black's raw 1 -> 1, black 0] = 1/3;
    #   b: tiles 1-3 1, tile 4 " Yes" is not "yes" -> [0, run zeroed 0] = 0 -> 0.75. (1/3 + 0.75) / 2 = 13/24.
    # corrected: a all zero (graph order: cat -> black -> fluffy) = 0; b " Yes" counts -> 1. (0 + 1) / 2.
    assert official[("dpg_bench", "all")] == pytest.approx(100 * 13 / 24)
    assert corrected[("dpg_bench", "all")] == pytest.approx(50.0)
    # L1 "entity": official, last tile before zeroing: cat 0, dog 0, run 1 -> 1/3;
    #   corrected, all tiles after zeroing: cat 4 x 0, dog 4 x 1, run 4 x 1 -> 8/12.
    assert official[("dpg_bench_l1", "entity")] == pytest.approx(100 / 3)
    assert corrected[("dpg_bench_l1", "entity")] == pytest.approx(100 * 8 / 12)
    # L1 "attribute": official fluffy 1, black 1 -> 1; corrected all zeroed -> 0
    assert official[("dpg_bench_l1", "attribute")] == 100.0
    assert corrected[("dpg_bench_l1", "attribute")] == 0.0


def test_report_both_writes_each_mode_from_one_set_of_answers(tmp_path: Path) -> None:
    """report_both: the evaluator's own mode under dpg_bench*, the other under its prefix, each equal
    to a run of that mode alone, while the VQA backend answers every (tile, question) once."""
    rows = [SKIP,
            ("a", 1, "0", "entity - whole (cat)", "A cat?"),
            ("a", 3, "2", "attribute - texture (cat, fluffy)", "A fluffy?"),
            ("a", 2, "1", "attribute - color (cat, black)", "A black?"),
            ("b", 1, "0", "entity - whole (dog)", "B dog?"),
            ("b", 2, "1", "entity - state (dog, run)", "B run?")]
    answers = {"A cat?": "no", "A fluffy?": "yes", "A black?": "yes",
               "B dog?": ["yes", "yes", "yes", " Yes"], "B run?": "yes"}
    alone = {compat: run_mode(tmp_path / str(compat), rows, answers, ["a", "b"], official=compat)
             for compat in (True, False)}
    for compat, prefix, modes in ((True, "dpg_bench_corrected", "(official_compat+corrected"),
                                  (False, "dpg_bench_official", "(corrected+official_compat")):
        vqa = fake_vqa(answers)
        questions = str(write_csv(tmp_path / "q.csv", rows))
        ev = DPGBenchEvaluator(vqa, questions=questions, official_compat=compat, show_progress=False,
                               verify_questions=False, report_both=True)
        res = ev.evaluate(sample_set(tmp_path / f"both-{compat}", ["a", "b"]))
        both = res.summary.set_index(["metric", "subset"])["value"]
        own, own_per, own_vqa = alone[compat]
        other = alone[not compat][0].rename(lambda m: m.replace("dpg_bench", prefix, 1), level="metric")
        assert both[own.index].tolist() == own.tolist()
        assert both[other.index].tolist() == other.tolist()
        assert len(both) == len(own) + len(other)
        assert both[(prefix, "all")] != both[("dpg_bench", "all")]  # the modes do differ on this graph
        assert res.per_sample.set_index("item_id")["score"].tolist() == own_per["score"].tolist()
        assert vqa.calls == own_vqa.calls == 8  # 2 items x 4 tiles: the second mode asked nothing new
        assert modes in ev.version


def test_dpg_bench_protocol_scores_with_the_official_rules() -> None:
    """protocol=dpg_bench scores with the official script (dpg_bench_official); the in-process variant
    selected under it composes with official_compat true (the paper's script's rules) and report_both
    off; the override adds the corrected rows."""
    from tests.conftest import compose_cfg

    default = compose_cfg(["+experiment=paper_main", "protocol=dpg_bench"]).evaluator
    assert "_target_" in default.dpg_bench_official and "_target_" not in default.dpg_bench
    variant = ["+experiment=paper_main", "protocol=dpg_bench", "evaluator=[speed,dpg_bench]"]
    cfg = compose_cfg(variant)
    assert cfg.evaluator.dpg_bench.official_compat is True and cfg.evaluator.dpg_bench.report_both is False
    cfg = compose_cfg([*variant, "evaluator.dpg_bench.report_both=true"])
    assert cfg.evaluator.dpg_bench.official_compat is True and cfg.evaluator.dpg_bench.report_both is True
    assert compose_cfg(["evaluator=[dpg_bench]"]).evaluator.dpg_bench.official_compat is False
