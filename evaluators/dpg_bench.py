"""DPG-Bench (TencentQQGYLab/ELLA `dpg_bench/compute_dpg_bench.py` @3c228f1) over a SampleSet.

Per prompt, its 4 images are tiled into one 2x2 grid (as the official protocol stores them) and cut
back into tiles (0,0,r,r), (r,0,2r,r), (0,r,r,2r), (r,r,2r,2r) (the script's `--pic-num 4` of
`dist_eval.sh`). Every question of the item's graph (`dpg_bench.csv`) is asked of every tile; a
question scores 1 iff the answer is "yes"; a question whose parent scored 0 is set to 0; tile score =
mean over questions; grid score = mean over tiles; DPG-Bench score = 100 x mean over grids (one grid
per prompt, as the script's one image file per item). Nothing is rounded.

Two modes:
- corrected (default): every CSV row is a question (rows of an item need not be contiguous); a
  failed parent zeroes its descendants transitively (in graph order); answers are compared after
  strip + lower-case; category scores are 100 x the mean dependency-adjusted question score over all
  tiles of all grids, L2 = tuple text before "(", L1 = tuple text before "-"; any missing image,
  unknown item or inconsistent graph raises.
- official_compat: reproduces the script exactly, quirks included (line numbers of the script):
  the CSV is read with pandas and its first data row is dropped (l.71-74); an item whose rows are
  not contiguous starts over and a repeated question id is one entry (l.84-92); zeroing walks the
  questions once in CSV order writing zeros back, so a failure runs down the chain of later
  descendants (l.140-153); an unknown parent fails the item only when that walk looks it up, and a
  failed item, or one the CSV lacks, is left out of the mean (l.120-121, l.146, l.213-215); exact
  "yes" (l.135); tile and grid means are Python sums in CSV / tile order (l.155, l.157); category
  scores use the last tile's scores before zeroing (l.138, l.161, l.208-211), L2 = tuple text before
  "(" and L1 = that L2 before "-" (l.209, l.232).

report_both scores the other mode too, from the same VQA answers (each tile and question is asked
once, `SharedAnswers`): the evaluator's own mode writes the rows above, the other mode the same rows
under metric names prefixed `dpg_bench_corrected` or `dpg_bench_official` (`dpg_bench_corrected`,
`dpg_bench_corrected_l1`, ...). The per-prompt frame is the evaluator's own mode's.
"""
from __future__ import annotations

import csv
import hashlib
import logging
import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from evaluators.dpg_vqa import VQABackend
from harness.api import EvalResult, metric_rows
from harness.datasets.official import DPG_QUESTIONS
from harness.datasets.downloads import resolve
from harness.progress import progress
from harness.store.samples import SampleSet, write_atomic

log = logging.getLogger(__name__)

VERSION = "2"  # 2: official_compat reproduces compute_dpg_bench.py exactly (chain zeroing, CSV quirks)
IMAGES_PER_PROMPT = 4
# report_both: the other mode's metric prefix, by the evaluator's own official_compat
OTHER_MODE_PREFIX = {True: "dpg_bench_corrected", False: "dpg_bench_official"}
PER_SAMPLE_COLUMNS = ("prompt_id", "item_id", "score", "tile_scores", "questions", "failed")
CSV_COLUMNS = ("item_id", "proposition_id", "dependency", "tuple", "question_natural_language")


@dataclass(frozen=True, slots=True)
class Question:
    """One node of an item's question graph (l1/l2 None: the official script cannot split its tuple)."""

    pid: int
    parents: tuple[int, ...]
    l1: str | None
    l2: str | None
    text: str


def _check_columns(path: Path, columns: Sequence[str]) -> None:
    """ValueError unless the question-graph columns are all there."""
    missing = [c for c in CSV_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"{path} lacks columns {missing}; expected the DPG-Bench question graph "
                         "dpg_bench.csv")


def load_questions(path: Path, official_compat: bool = False) -> "OrderedDict[Hashable, list[Question]]":
    """item_id -> its questions, from dpg_bench.csv (compat: as the official script reads it)."""
    if official_compat:
        return load_official_questions(path)
    graph: OrderedDict[Hashable, list[Question]] = OrderedDict()
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        _check_columns(path, reader.fieldnames or [])
        for index, row in enumerate(reader):
            try:
                parents = tuple(int(p) for p in str(row["dependency"]).split(",") if p.strip())
                question = Question(int(row["proposition_id"]), parents, row["tuple"].split("-")[0].strip(),
                                    row["tuple"].split("(")[0].strip(), row["question_natural_language"])
            except (ValueError, AttributeError) as exc:
                raise ValueError(f"{path}:{index + 2}: malformed question row ({exc})") from exc
            graph.setdefault(str(row["item_id"]), []).append(question)
    return graph


def load_official_questions(path: Path) -> "OrderedDict[Hashable, list[Question]]":
    """item key -> its questions, built as the script's `prepare_dpg_data` (l.65-99) builds them.

    Official quirks kept:
    - `pandas.read_csv` parses the file (l.71), so keys keep pandas' types: an item_id column that
      pandas reads as numbers gives int keys, which never equal an image's (text) file name, and
      "", "NA", "None", ... in a cell become NaN;
    - the row with index 0, the first data row, is skipped (l.73-74);
    - a row whose item_id differs from the previous row's starts the item over, dropping what an
      earlier, non-contiguous run of its rows collected (l.84-92);
    - a repeated proposition_id inside an item is one entry: the first row's place, the last row's
      tuple, dependency and question (dict assignment, l.85-87).
    """
    frame = pd.read_csv(path)
    _check_columns(path, list(frame.columns))
    items: dict[Hashable, dict[int, Question]] = {}
    previous: Hashable = ""
    for index, row in frame.iterrows():
        if index == 0:
            continue
        key = row["item_id"]
        question = _official_question(path, index, row)
        if key == previous:
            items[key][question.pid] = question
        else:
            items[key] = {question.pid: question}
        previous = key
    return OrderedDict((key, list(questions.values())) for key, questions in items.items())


def _official_question(path: Path, index: Hashable, row: pd.Series) -> Question:
    """One row as the script reads it (l.77-82, l.94, l.209, l.232).

    `int(proposition_id)`, a dependency text split on "," with every piece an int, and a question
    text are required: anything else stops the whole script, here a ValueError. L2 = tuple text
    before "(", stripped; L1 = that L2 before "-", stripped; a tuple that is not text (NaN) gets
    None, which ends the item's category rows (see `official_categories`).
    """
    dependency, text, tup = row["dependency"], row["question_natural_language"], row["tuple"]
    try:
        pid = int(row["proposition_id"])
        if not isinstance(dependency, str) or not isinstance(text, str):
            raise TypeError(f"dependency {dependency!r} and question {text!r} must be text")
        parents = tuple(int(piece.strip()) for piece in dependency.split(","))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: data row {index}: the official script stops here ({exc})") from exc
    l2 = tup.split("(")[0].strip() if isinstance(tup, str) else None
    l1 = l2.split("-")[0].strip() if l2 is not None else None
    return Question(pid, parents, l1, l2, text)


def question_scores(questions: Sequence[Question], answers: Sequence[str],
                    official_compat: bool) -> tuple[np.ndarray, np.ndarray]:
    """One tile: (raw 0/1 scores, dependency-adjusted scores), both [Q] float.

    Raises KeyError when a parent id is not a question of the item (compat: only when the official
    walk looks it up; the item fails).
    """
    if official_compat:
        raw = np.array([float(a == "yes") for a in answers])
        return raw, official_zeroing(questions, raw)
    raw = np.array([float(a.strip().lower() == "yes") for a in answers])
    index = {q.pid: i for i, q in enumerate(questions)}
    for q in questions:
        for p in q.parents:
            if p != 0 and p not in index:
                raise KeyError(f"question {q.pid} depends on unknown question {p}")
    adjusted = raw.copy()
    for i in _graph_order(questions, index):
        if any(p != 0 and adjusted[index[p]] == 0 for p in questions[i].parents):
            adjusted[i] = 0.0
    return raw, adjusted


def official_zeroing(questions: Sequence[Question], raw: np.ndarray) -> np.ndarray:
    """Dependency zeroing of one tile as the script does it (l.140-153).

    One walk over the questions in CSV order that writes each zero back into the table it reads
    parents from: a failed question zeroes every later descendant down its chain, while a child
    listed before its parent reads the parent's score before zeroing. Parent 0 is skipped; the walk
    over a question's parents stops at the first one scoring 0, so an unknown parent raises KeyError
    only when the walk actually looks it up.
    """
    scores = {q.pid: float(s) for q, s in zip(questions, raw)}
    for q in questions:
        for parent in q.parents:
            if parent == 0:
                continue
            if parent not in scores:
                raise KeyError(f"question {q.pid} depends on unknown question {parent}")
            if scores[parent] == 0:
                scores[q.pid] = 0.0
                break
    return np.array([scores[q.pid] for q in questions])


def official_mean(values: Sequence[float]) -> float:
    """`sum(values) / len(values)` in Python floats and in order, as the script's means (l.155, l.157)."""
    return sum(values) / len(values)


def official_categories(questions: Sequence[Question], raw: np.ndarray) -> list[dict]:
    """Category rows of a scored item as the script collects them (l.207-211).

    The scores are the last tile's before zeroing (`qid2scores_orig`, l.138, l.161), one per
    question in CSV order. A tuple the script cannot split (NaN) raises inside its try after the
    item's score was kept (l.205, l.209), so the item keeps its score and loses the category rows
    from that question on.
    """
    rows = []
    for q, score in zip(questions, raw):
        if q.l1 is None or q.l2 is None:
            break
        rows.append({"l1": q.l1, "l2": q.l2, "score": float(score)})
    return rows


def _graph_order(questions: Sequence[Question], index: dict[int, int]) -> list[int]:
    """Question indices with parents before children; ValueError on a cycle."""
    order: list[int] = []
    state: dict[int, int] = {}

    def visit(i: int) -> None:
        if state.get(i) == 2:
            return
        if state.get(i) == 1:
            raise ValueError(f"question graph has a cycle through question {questions[i].pid}")
        state[i] = 1
        for p in questions[i].parents:
            if p != 0:
                visit(index[p])
        state[i] = 2
        order.append(i)

    for i in range(len(questions)):
        visit(i)
    return order


def make_grid(tiles: Sequence[np.ndarray]) -> np.ndarray:
    """4 images uint8 [r, r, 3] -> 2x2 grid [2r, 2r, 3] (row-major: top-left, top-right, ...)."""
    if len(tiles) != IMAGES_PER_PROMPT or len({t.shape for t in tiles}) != 1 or tiles[0].shape[0] != tiles[0].shape[1]:
        raise ValueError(f"DPG-Bench needs {IMAGES_PER_PROMPT} square images of one size per prompt, got "
                         f"{[t.shape for t in tiles]}")
    return np.concatenate([np.concatenate(tiles[:2], axis=1), np.concatenate(tiles[2:], axis=1)], axis=0)


def split_grid(grid: np.ndarray, tile: int) -> list[np.ndarray]:
    """The official crops (0,0,r,r), (r,0,2r,r), (0,r,r,2r), (r,r,2r,2r) of a grid [H, W, 3]."""
    r = tile
    return [grid[y:y + r, x:x + r] for (x, y) in ((0, 0), (r, 0), (0, r), (r, r))]


class SharedAnswers:
    """A VQABackend that asks its backend each (tile, question) once and answers repeats from memory,
    so that report_both's two modes score the same answers for the price of one."""

    def __init__(self, backend: VQABackend) -> None:
        self.backend = backend
        self.name = backend.name
        self._answers: dict[tuple[str, str], str] = {}

    def answer(self, image: np.ndarray, questions: Sequence[str]) -> list[str]:
        """The backend's answers; only questions not yet asked of this exact tile reach it."""
        tile = hashlib.blake2b(np.ascontiguousarray(image).tobytes() + str(image.shape).encode(),
                               digest_size=16).hexdigest()
        new = list(dict.fromkeys(q for q in questions if (tile, q) not in self._answers))
        if new:
            self._answers.update(((tile, q), a) for q, a in zip(new, self.backend.answer(image, new)))
        return [self._answers[(tile, q)] for q in questions]


class DPGBenchEvaluator:
    """DPG-Bench score of a SampleSet generated from dataset=dpg_bench with 4 images per prompt.

    Args:
        vqa: the VQABackend (MplugVQA: official; HFVQA: named variant).
        name: evaluator name.
        questions: local dpg_bench.csv (None: download the pinned file, hash-checked).
        official_compat: reproduce the reference script's quirks (see module doc).
        write_grids: also write `<SampleSet root>/dpg_grids/<item_id>.png` for the official script.
        show_progress: progress (a bar on a terminal, a log line a minute otherwise; harness/progress.py).
        verify_questions: check the local dpg_bench.csv against its pinned hash (off: custom graphs,
            recorded in `version`).
        report_both: also score the other mode, from the same answers, under metric names prefixed
            OTHER_MODE_PREFIX (see module doc).
    """

    def __init__(self, vqa: VQABackend, name: str = "dpg_bench", questions: str | None = None,
                 official_compat: bool = False, write_grids: bool = False, show_progress: bool = True,
                 verify_questions: bool = True, report_both: bool = False) -> None:
        self.vqa, self.name, self.questions, self.verify_questions = vqa, name, questions, verify_questions
        self.official_compat, self.write_grids, self.show_progress = official_compat, write_grids, show_progress
        self.report_both = report_both

    def check(self) -> None:
        """Before generation (harness/run.py): what the VQA backend imports."""
        if hasattr(self.vqa, "check"):
            self.vqa.check()

    def assets(self) -> list:
        """What scoring downloads (harness/assets): the question graph (unless given) and the VQA model."""
        from harness.assets.asset import UrlFile

        own = [] if self.questions else [UrlFile("DPG-Bench question graph", DPG_QUESTIONS)]
        return own + (self.vqa.assets() if hasattr(self.vqa, "assets") else [])

    @property
    def version(self) -> str:
        """e.g. "dpg_bench-2(official_compat)/mplug:mplug_visual-question-answering_coco_large_en";
        report_both: "dpg_bench-2(official_compat+corrected)/..." (the evaluator's own mode first)."""
        modes = ("official_compat", "corrected") if self.official_compat else ("corrected", "official_compat")
        mode = "+".join(modes) if self.report_both else modes[0]
        custom = "" if self.verify_questions else ",custom-questions"
        return f"dpg_bench-{VERSION}({mode}{custom})/{self.vqa.name}"

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """Summary rows dpg_bench / all, dpg_bench_l1 / <cat>, dpg_bench_l2 / <cat>; per-prompt frame.
        report_both: the other mode's rows follow (`evaluate_both`)."""
        if self.report_both:
            return self.evaluate_both(samples)
        graph = load_questions(resolve(DPG_QUESTIONS, self.questions, check=self.verify_questions),
                               self.official_compat)
        groups = self._groups(samples, graph)
        rows, cat_rows = [], []
        for prompt_id, (item, sample_ids) in progress(groups.items(), self.name, "prompts",
                                                      enabled=self.show_progress):
            grid = make_grid([samples.load_image(s) for s in sample_ids])
            if self.write_grids:
                self._write_grid(samples.root, item, grid)
            questions = graph.get(self._item_key(item))
            if questions is None:  # compat only: the corrected mode raised in _groups
                log.warning("%s: item %s has no questions, failed as in the official script; left out of "
                            "the mean", self.name, item)
                row, cats = _failed_row(0), []
            else:
                row, cats = self.score_grid(grid, questions)
            rows.append({"prompt_id": prompt_id, "item_id": item, **row})
            cat_rows += cats
        per_sample = pd.DataFrame(rows, columns=list(PER_SAMPLE_COLUMNS))
        return EvalResult(summary=self.summary(per_sample, pd.DataFrame(cat_rows, columns=["l1", "l2", "score"])),
                          per_sample=per_sample)

    def evaluate_both(self, samples: SampleSet) -> EvalResult:
        """This mode's result, then the other mode's summary rows renamed with OTHER_MODE_PREFIX; the
        VQA backend answers each tile and question once for both."""
        answers = SharedAnswers(self.vqa)
        own = DPGBenchEvaluator(answers, self.name, self.questions, self.official_compat, self.write_grids,
                                self.show_progress, self.verify_questions)
        other = DPGBenchEvaluator(answers, self.name, self.questions, not self.official_compat, False,
                                  self.show_progress, self.verify_questions)
        first, second = own.evaluate(samples), other.evaluate(samples)
        metric = second.summary["metric"].str.replace(r"^dpg_bench", OTHER_MODE_PREFIX[self.official_compat],
                                                      regex=True)
        renamed = second.summary.assign(metric=metric)
        return EvalResult(summary=pd.concat([first.summary, renamed], ignore_index=True),
                          per_sample=first.per_sample)

    def score_grid(self, grid: np.ndarray, questions: Sequence[Question]) -> tuple[dict, list[dict]]:
        """One grid -> (per-prompt row, per-question category rows), in the evaluator's mode."""
        if self.official_compat:
            return self._score_official(grid, questions)
        return self._score_corrected(grid, questions)

    def _score_corrected(self, grid: np.ndarray, questions: Sequence[Question]) -> tuple[dict, list[dict]]:
        """Every tile's adjusted scores feed the grid score and the categories; a bad graph raises."""
        texts = [q.text for q in questions]
        tile_scores, cats = [], []
        for tile in split_grid(grid, grid.shape[1] // 2):
            answers = self.vqa.answer(tile, texts)  # the backend's own errors pass through as they are
            try:
                _, adjusted = question_scores(questions, answers, False)
            except KeyError as exc:
                raise ValueError(f"question graph of this item is inconsistent: {exc}") from exc
            tile_scores.append(float(adjusted.mean()))
            cats += [{"l1": q.l1, "l2": q.l2, "score": float(s)} for q, s in zip(questions, adjusted)]
        return _scored_row(float(np.mean(tile_scores)), tile_scores, len(texts)), cats

    def _score_official(self, grid: np.ndarray, questions: Sequence[Question]) -> tuple[dict, list[dict]]:
        """As `compute_dpg_one_sample` (l.109-161) and the loop around it (l.199-215).

        An exception in any tile (an unknown parent reached) fails the whole item: no score, no
        category rows (the script prints it and goes on).
        """
        texts = [q.text for q in questions]
        tile_scores: list[float] = []
        raw = np.zeros(len(questions))
        try:
            for tile in split_grid(grid, grid.shape[1] // 2):
                raw, adjusted = question_scores(questions, self.vqa.answer(tile, texts), True)
                tile_scores.append(official_mean(adjusted.tolist()))
        except KeyError as exc:
            log.warning("%s: item failed as in the official script (%s); left out of the mean",
                        self.name, exc)
            return _failed_row(len(texts)), []
        row = _scored_row(official_mean(tile_scores), tile_scores, len(texts))
        return row, official_categories(questions, raw)

    def _item_key(self, item: str) -> str:
        """The graph key of an item; compat: the image file name up to its first "." (l.119)."""
        return item.split(".")[0] if self.official_compat else item

    def summary(self, per_sample: pd.DataFrame, cats: pd.DataFrame) -> pd.DataFrame:
        """Overall and L1/L2 rows, all x100."""
        scored = per_sample[~per_sample["failed"].astype(bool)]["score"].astype(float)
        n = len(scored)
        rows = [{"metric": "dpg_bench", "subset": "all", "value": 100 * self._mean(scored) if n else math.nan,
                 "stderr": 100 * float(scored.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan, "n": n}]
        failed = int(per_sample["failed"].sum())
        if failed:
            rows.append({"metric": "dpg_bench_failed", "subset": "all", "value": failed, "n": len(per_sample),
                         "higher_is_better": False})
        for level in ("l1", "l2"):
            for cat, values in cats.groupby(level, sort=True)["score"]:
                rows.append({"metric": f"dpg_bench_{level}", "subset": cat, "value": 100 * self._mean(values),
                             "n": len(values)})
        return metric_rows(rows)

    def _mean(self, values: pd.Series) -> float:
        """compat: `np.mean` over the scores, as the script's overall and category means (l.219, l.241,
        l.245); corrected: pandas' mean."""
        return float(np.mean(values.to_numpy(dtype=float))) if self.official_compat else float(values.mean())

    def _groups(self, samples: SampleSet,
                graph: dict[Hashable, list[Question]]) -> dict[str, tuple[str, list[str]]]:
        """prompt_id -> (item_id, its 4 sample ids in image order); errors name what is missing."""
        records = samples.records()
        if records.empty:
            raise ValueError(f"{samples} has no complete samples; run the generate stage first")
        groups: dict[str, tuple[str, list[str]]] = {}
        for prompt_id, part in records.sort_values(["prompt_id", "image_index"]).groupby("prompt_id", sort=False):
            item = str(prompt_id).removeprefix("dpg_bench/")
            if not str(prompt_id).startswith("dpg_bench/"):
                raise ValueError(f"prompt {prompt_id!r} is not a DPG-Bench prompt; the dpg_bench evaluator needs "
                                 "dataset=dpg_bench (prompt ids dpg_bench/<item_id>)")
            if not self.official_compat and item not in graph:
                raise ValueError(f"item {item!r} has no questions in dpg_bench.csv")
            ids = part["sample_id"].tolist()
            if len(ids) != IMAGES_PER_PROMPT:
                raise ValueError(f"prompt {prompt_id} has {len(ids)} images {ids}; DPG-Bench needs "
                                 f"images_per_prompt={IMAGES_PER_PROMPT}")
            groups[str(prompt_id)] = (item, ids)
        return groups

    @staticmethod
    def _write_grid(root: Path, item: str, grid: np.ndarray) -> None:
        import io

        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray(grid).save(buffer, format="PNG")
        (root / "dpg_grids").mkdir(exist_ok=True)
        write_atomic(root / "dpg_grids" / f"{item}.png", buffer.getvalue())


def _scored_row(score: float, tile_scores: Sequence[float], questions: int) -> dict:
    """Per-prompt row of a scored grid."""
    return {"score": score, "tile_scores": " ".join(f"{s:.4f}" for s in tile_scores), "questions": questions,
            "failed": False}


def _failed_row(questions: int) -> dict:
    """Per-prompt row of an item the official script fails (left out of every mean)."""
    return {"score": math.nan, "tile_scores": "", "questions": questions, "failed": True}
