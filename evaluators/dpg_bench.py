"""DPG-Bench (TencentQQGYLab/ELLA `dpg_bench/compute_dpg_bench.py` @3c228f1) over a SampleSet.

Per prompt, its 4 images are tiled into one 2x2 grid (as the official protocol stores them) and cut
back into tiles (0,0,r,r), (r,0,2r,r), (0,r,r,2r), (r,r,2r,2r). Every question of the item's
graph (`dpg_bench.csv`) is asked of every tile; a question scores 1 iff the answer is "yes"; a
question whose parent scored 0 is set to 0; tile score = mean over questions; grid score = mean
over tiles; DPG-Bench score = 100 x mean over grids. L1/L2 category tables come from the `tuple`
column (L2 = text before "(", L1 = text before "-").

Two modes:
- corrected (default): every CSV row is a question; a failed parent zeroes its descendants
  transitively (in graph order); answers are compared after strip + lower-case; category scores
  are 100 x the mean dependency-adjusted question score over all tiles of all grids; any missing
  image or inconsistent graph raises.
- official_compat: reproduces the script's quirks: the first CSV data row is dropped; an item whose
  question depends on a dropped/unknown id fails and is left out of the mean (as the script's
  swallowed exception does); zeroing looks at the parents' raw answers (one level); exact "yes";
  category scores use the last tile only and the scores before zeroing.
"""
from __future__ import annotations

import csv
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from evaluators.dpg_vqa import VQABackend
from harness.api import EvalResult, metric_rows
from harness.datasets_official import DPG_QUESTIONS
from harness.downloads import resolve
from harness.samples import SampleSet, write_atomic

log = logging.getLogger(__name__)

VERSION = "1"
IMAGES_PER_PROMPT = 4
PER_SAMPLE_COLUMNS = ("prompt_id", "item_id", "score", "tile_scores", "questions", "failed")
CSV_COLUMNS = ("item_id", "proposition_id", "dependency", "tuple", "question_natural_language")


@dataclass(frozen=True, slots=True)
class Question:
    """One node of an item's question graph."""

    pid: int
    parents: tuple[int, ...]
    l1: str
    l2: str
    text: str


def load_questions(path: Path, official_compat: bool = False) -> "OrderedDict[str, list[Question]]":
    """item_id -> its questions, from dpg_bench.csv (compat: the first data row is dropped)."""
    graph: OrderedDict[str, list[Question]] = OrderedDict()
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} lacks columns {missing}; expected the DPG-Bench question graph dpg_bench.csv")
        for index, row in enumerate(reader):
            if official_compat and index == 0:
                continue
            try:
                parents = tuple(int(p) for p in str(row["dependency"]).split(",") if p.strip())
                question = Question(int(row["proposition_id"]), parents, row["tuple"].split("-")[0].strip(),
                                    row["tuple"].split("(")[0].strip(), row["question_natural_language"])
            except (ValueError, AttributeError) as exc:
                raise ValueError(f"{path}:{index + 2}: malformed question row ({exc})") from exc
            graph.setdefault(str(row["item_id"]), []).append(question)
    return graph


def question_scores(questions: Sequence[Question], answers: Sequence[str],
                    official_compat: bool) -> tuple[np.ndarray, np.ndarray]:
    """One tile: (raw 0/1 scores, dependency-adjusted scores), both [Q] float.

    Raises KeyError when a parent id is not a question of the item (compat: the item fails).
    """
    raw = np.array([float(a == "yes") if official_compat else float(a.strip().lower() == "yes")
                    for a in answers])
    index = {q.pid: i for i, q in enumerate(questions)}
    for q in questions:
        for p in q.parents:
            if p != 0 and p not in index:
                raise KeyError(f"question {q.pid} depends on unknown question {p}")
    adjusted = raw.copy()
    if official_compat:
        for i, q in enumerate(questions):
            if any(p != 0 and raw[index[p]] == 0 for p in q.parents):
                adjusted[i] = 0.0
        return raw, adjusted
    for i in _graph_order(questions, index):
        if any(p != 0 and adjusted[index[p]] == 0 for p in questions[i].parents):
            adjusted[i] = 0.0
    return raw, adjusted


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


class DPGBenchEvaluator:
    """DPG-Bench score of a SampleSet generated from dataset=dpg_bench with 4 images per prompt.

    Args:
        vqa: the VQABackend (MplugVQA: official; HFVQA: named variant).
        name: evaluator name.
        questions: local dpg_bench.csv (None: download the pinned file, hash-checked).
        official_compat: reproduce the reference script's quirks (see module doc).
        write_grids: also write `<SampleSet root>/dpg_grids/<item_id>.png` for the official script.
        show_progress: tqdm progress bar.
        verify_questions: check the local dpg_bench.csv against its pinned hash (off: custom graphs,
            recorded in `version`).
    """

    def __init__(self, vqa: VQABackend, name: str = "dpg_bench", questions: str | None = None,
                 official_compat: bool = False, write_grids: bool = False, show_progress: bool = True,
                 verify_questions: bool = True) -> None:
        self.vqa, self.name, self.questions, self.verify_questions = vqa, name, questions, verify_questions
        self.official_compat, self.write_grids, self.show_progress = official_compat, write_grids, show_progress

    @property
    def version(self) -> str:
        """e.g. "dpg_bench-1(corrected)/mplug:mplug_visual-question-answering_coco_large_en"."""
        mode = "official_compat" if self.official_compat else "corrected"
        custom = "" if self.verify_questions else ",custom-questions"
        return f"dpg_bench-{VERSION}({mode}{custom})/{self.vqa.name}"

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """Summary rows dpg_bench / all, dpg_bench_l1 / <cat>, dpg_bench_l2 / <cat>; per-prompt frame."""
        graph = load_questions(resolve(DPG_QUESTIONS, self.questions, check=self.verify_questions),
                               self.official_compat)
        groups = self._groups(samples, graph)
        rows, cat_rows = [], []
        for prompt_id, (item, sample_ids) in tqdm(groups.items(), desc=self.name, unit="prompt",
                                                  disable=None if self.show_progress else True):
            grid = make_grid([samples.load_image(s) for s in sample_ids])
            if self.write_grids:
                self._write_grid(samples.root, item, grid)
            row, cats = self.score_grid(grid, graph[item])
            rows.append({"prompt_id": prompt_id, "item_id": item, **row})
            cat_rows += cats
        per_sample = pd.DataFrame(rows, columns=list(PER_SAMPLE_COLUMNS))
        return EvalResult(summary=self.summary(per_sample, pd.DataFrame(cat_rows, columns=["l1", "l2", "score"])),
                          per_sample=per_sample)

    def score_grid(self, grid: np.ndarray, questions: Sequence[Question]) -> tuple[dict, list[dict]]:
        """One grid -> (per-prompt row, per-question category rows)."""
        texts = [q.text for q in questions]
        tile_scores, cats = [], []
        try:
            tiles = split_grid(grid, grid.shape[1] // 2)
            for t, tile in enumerate(tiles):
                raw, adjusted = question_scores(questions, self.vqa.answer(tile, texts), self.official_compat)
                tile_scores.append(float(adjusted.mean()))
                if not self.official_compat or t == len(tiles) - 1:
                    used = raw if self.official_compat else adjusted
                    cats += [{"l1": q.l1, "l2": q.l2, "score": float(s)} for q, s in zip(questions, used)]
        except KeyError as exc:
            if not self.official_compat:
                raise ValueError(f"question graph of this item is inconsistent: {exc}") from exc
            log.warning("%s: item failed as in the official script (%s); left out of the mean", self.name, exc)
            return {"score": math.nan, "tile_scores": "", "questions": len(texts), "failed": True}, []
        return {"score": float(np.mean(tile_scores)), "tile_scores": " ".join(f"{s:.4f}" for s in tile_scores),
                "questions": len(texts), "failed": False}, cats

    def summary(self, per_sample: pd.DataFrame, cats: pd.DataFrame) -> pd.DataFrame:
        """Overall and L1/L2 rows, all x100."""
        scored = per_sample[~per_sample["failed"].astype(bool)]["score"].astype(float)
        n = len(scored)
        rows = [{"metric": "dpg_bench", "subset": "all", "value": 100 * float(scored.mean()) if n else math.nan,
                 "stderr": 100 * float(scored.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan, "n": n}]
        failed = int(per_sample["failed"].sum())
        if failed:
            rows.append({"metric": "dpg_bench_failed", "subset": "all", "value": failed, "n": len(per_sample),
                         "higher_is_better": False})
        for level in ("l1", "l2"):
            for cat, values in cats.groupby(level, sort=True)["score"]:
                rows.append({"metric": f"dpg_bench_{level}", "subset": cat, "value": 100 * float(values.mean()),
                             "n": len(values)})
        return metric_rows(rows)

    def _groups(self, samples: SampleSet, graph: dict[str, list[Question]]) -> dict[str, tuple[str, list[str]]]:
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
            if item not in graph:
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
