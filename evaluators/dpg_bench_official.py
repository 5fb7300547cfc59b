"""DPG-Bench scored by ELLA's official script in its own environment (evaluator=dpg_bench_official).

TencentQQGYLab/ELLA `dpg_bench/compute_dpg_bench.py` (mPLUG-large VQA through ModelScope) runs as
a subprocess with the `env_python` of the environment built in docs/evaluators.md, launched as
`dpg_bench/dist_eval.sh` launches it (`accelerate launch --mixed_precision fp16 ... --pic-num 4
--vqa-model mplug`). The formats are those of the script at commit
3c228f1dc6c4d3cad0a47493816151a419f14db3:

- export, `<work>/grids/<item_id>.png`: the 4 images of a prompt tiled 2x2 (evaluators/dpg_bench.py
  make_grid), the only files there (the script scores every file of the folder); `--resolution` is
  the size of one tile;
- `--res-path <work>/results.txt`: one line per scored grid, "<image path>, <4 tile scores>, <grid
  score>", then "Model: ...", "L1 category scores:" and "L2 category scores:" with one
  "\\t<category>: <100 x mean>" line each, "Image path: ...", "Save results to: ...",
  "DPG-Bench score: <100 x mean>". An item the script fails (it prints "Failed filename") has no
  line; it is left out of the means, as in the script;
- `<work>/results_detail.txt` (the answers per tile and question) is kept for inspection.

The rows are the in-process evaluator's (evaluators/dpg_bench.py): `dpg_bench` / all (the script's
score, with the standard error of its per-grid scores), `dpg_bench_failed` when items failed,
`dpg_bench_l1` / `dpg_bench_l2` per category (the script's values; `n` = the question scores that
entered them); per prompt: prompt_id, item_id, score, tile_scores, questions, failed.
`<work>` is `<SampleSet root>/official/<evaluator name>/` (evaluators/official_env.py).
"""
from __future__ import annotations

import io
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Sequence

import numpy as np
import pandas as pd
from PIL import Image

from evaluators.dpg_bench import (IMAGES_PER_PROMPT, PER_SAMPLE_COLUMNS, _failed_row, _scored_row,
                                  load_official_questions, make_grid, official_categories)
from evaluators.official_build import command_line
from evaluators.official_env import (MANIFEST, ExportItem, OfficialEnv, OfficialEnvError, OfficialOutputError,
                                     fresh, given, missing_modules, official_home, open_env,
                                     run_script, sync_export, text_digest, unset_keys, work_dir)
from harness.api import EvalResult, checked_number, metric_rows
from harness.datasets.downloads import sha256_file
from harness.datasets.downloads import verify
from harness.datasets.official import DPG_QUESTIONS
from harness.store.samples import SampleSet

log = logging.getLogger(__name__)

SCRIPT = "dpg_bench/compute_dpg_bench.py"
QUESTIONS = "dpg_bench/dpg_bench.csv"
GRIDS = "grids"
RESULTS = "results.txt"  # must end in .txt: the script writes its detail file at .txt -> _detail.txt
RECIPE = f"`{command_line('dpg_bench')}`, docs/evaluators.md 'DPG-Bench's environment'"
MPLUG_MODEL = "damo/mplug_visual-question-answering_coco_large_en"  # the model id compute_dpg_bench.py names
# what compute_dpg_bench.py imports, and ModelScope's mPLUG pipeline (fairseq) with it
MODULES = ("accelerate", "modelscope", "fairseq", "pandas", "PIL")
PRECISIONS = ("no", "fp16", "bf16")


@dataclass
class DPGOutput:
    """What compute_dpg_bench.py's results file says: per item key, (tile scores, grid score); the
    L1 and L2 category scores and the overall score, all as printed (x100)."""

    items: dict[str, tuple[list[float], float]] = field(default_factory=dict)
    l1: dict[str, float] = field(default_factory=dict)
    l2: dict[str, float] = field(default_factory=dict)
    score: float = math.nan


class DPGBenchOfficial:
    """DPG-Bench score of a SampleSet (dataset=dpg_bench, 4 images per prompt), computed by the
    official script in its own environment.

    Args:
        env_python: the interpreter of DPG-Bench's environment (null: `<home>/env/bin/python`).
        repo: the TencentQQGYLab/ELLA checkout whose dpg_bench/compute_dpg_bench.py runs (null: `<home>/repo`).
        home: the folder `python -m evaluators.official_build dpg_bench` builds (null: $MULO_BENCH_CACHE/official/dpg_bench).
        modelscope_cache: the MODELSCOPE_CACHE the evaluate step sets, where fetch puts mPLUG (null:
            `<home>/modelscope`). The script runs there, so that the model id it names,
            `damo/mplug_visual-question-answering_coco_large_en`, is that local folder: ModelScope loads
            it without the network and the script is not edited.
        name: evaluator name.
        questions: the question graph passed as `--csv` (None: the checkout's dpg_bench/dpg_bench.csv).
        verify_questions: check that file against the pinned dpg_bench.csv @3c228f1 (off: a custom
            graph, recorded in `version`).
        accelerate: launch through `python -m accelerate.commands.launch` as dist_eval.sh does (off:
            plain `python`, one process, no mixed precision).
        processes: accelerate's --num_processes (GPUs; more than 1 adds --multi_gpu).
        mixed_precision: accelerate's --mixed_precision (dist_eval.sh: fp16).
        port: accelerate's --main_process_port.
        commit: the commit the checkout must be at (a git checkout: its HEAD; otherwise recorded as given).

    Nothing on disk is checked on construction (fetch builds it to list its assets); `check()` runs
    before generation.
    """

    def __init__(self, env_python: str | None = None, repo: str | None = None, name: str = "dpg_bench_official",
                 questions: str | None = None, verify_questions: bool = True, accelerate: bool = True,
                 processes: int = 1, mixed_precision: str = "fp16", port: int = 29500,
                 commit: str | None = None, home: str | None = None, modelscope_cache: str | None = None) -> None:
        self.name = name
        self.key = f"evaluator.{name}"
        root = official_home("dpg_bench", home)
        self.paths = {"env_python": env_python if given(env_python) else str(root / "env" / "bin" / "python"),
                      "repo": repo if given(repo) else str(root / "repo")}
        self.modelscope_cache = (Path(modelscope_cache).expanduser() if given(modelscope_cache)
                                 else root / "modelscope").absolute()
        self.questions = questions if given(questions) else None
        self.verify_questions, self.accelerate, self.commit = verify_questions, accelerate, commit
        self.processes = checked_number(f"{self.key}.processes", processes, integer=True, low=1)
        self.port = checked_number(f"{self.key}.port", port, integer=True, low=1, high=65535)
        if mixed_precision not in PRECISIONS:
            raise OfficialEnvError(f"{self.key}.mixed_precision must be one of {list(PRECISIONS)}, got "
                                   f"{mixed_precision!r} (dist_eval.sh uses fp16)")
        self.mixed_precision = mixed_precision
        self._env: OfficialEnv | None = None
        self._questions: Path | None = None

    @property
    def version(self) -> str:
        """e.g. "dpg_bench-official@3c228f1d...(accelerate,fp16)/mplug" (",custom-questions" when unverified)."""
        commit = self._env.commit if self._env is not None else "unknown"
        launch = f"accelerate,{self.mixed_precision}" if self.accelerate else "python"
        custom = "" if self.verify_questions else ",custom-questions"
        return f"dpg_bench-official@{commit}({launch}{custom})/mplug"

    def assets(self) -> list:
        """What `stages=[fetch]` brings: mPLUG, fetched by the modelscope of DPG-Bench's environment
        into `modelscope_cache` (harness/assets)."""
        from harness.assets.asset import ModelScopeModel

        return [ModelScopeModel("evaluator dpg_bench_official (mPLUG)", MPLUG_MODEL, str(self.paths["env_python"]),
                                str(self.modelscope_cache))]

    def check(self) -> None:
        """Before generation (harness/run.py): the environment runs and imports what the script
        imports, the checkout is at `commit`, the question graph is the pinned one and mPLUG is in
        `modelscope_cache`; OfficialEnvError naming what is missing and the command that fixes it."""
        env, questions = (self._env, self._questions) if self._env is not None else self._open()
        missing_modules(self.key, env.python, MODULES, f"build the environment with {RECIPE}")
        for asset in self.assets():
            if asset.missing():
                raise OfficialEnvError(f"{self.key}: the ModelScope model {MPLUG_MODEL} is not in {self.modelscope_cache} "
                                       "(the MODELSCOPE_CACHE the script runs with); fetch it with the same command "
                                       f"and stages=[fetch], or `{asset.command()}`")
        self._env, self._questions = env, questions

    def _open(self) -> tuple[OfficialEnv, Path]:
        """The checked environment and question file; OfficialEnvError naming the option and the fix."""
        unset_keys(self.key, self.paths)
        env = open_env(self.key, str(self.paths["env_python"]), str(self.paths["repo"]), (SCRIPT,), self.commit,
                       RECIPE)
        questions = (Path(self.questions).expanduser() if self.questions else env.repo / QUESTIONS).absolute()
        if not questions.is_file():
            option = f"{self.key}.questions={questions}" if self.questions else f"{self.key}.repo={env.repo}"
            raise OfficialEnvError(f"{option}: {questions} does not exist; give the DPG-Bench question graph "
                                   "dpg_bench.csv")
        if self.verify_questions:
            verify(questions, DPG_QUESTIONS)
        return env, questions

    def launcher(self) -> list[str]:
        """The arguments between the interpreter and the script: accelerate's launcher as
        dist_eval.sh calls it, or none."""
        if not self.accelerate:
            return []
        multi = ["--multi_gpu"] if self.processes > 1 else []
        return ["-m", "accelerate.commands.launch", "--num_machines", "1", "--num_processes", str(self.processes),
                *multi, "--mixed_precision", self.mixed_precision, "--main_process_port", str(self.port)]

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """Export the grids, run compute_dpg_bench.py, read its results file back."""
        self.check()
        assert self._env is not None and self._questions is not None  # check() opened them
        groups = item_groups(samples)
        work = work_dir(samples.root, self.name)
        items = {f"{item}.png": grid_item(samples, ids) for item, ids in groups.values()}
        sync_export(work / GRIDS, items, work / MANIFEST)
        tile = samples.load_image(next(iter(groups.values()))[1][0]).shape[0]
        results = fresh(work / RESULTS)
        fresh(work / RESULTS.replace(".txt", "_detail.txt"))
        args = ["--image-root-path", work / GRIDS, "--resolution", tile, "--csv", self._questions,
                "--res-path", results, "--pic-num", IMAGES_PER_PROMPT, "--vqa-model", "mplug"]
        run_script(self._env, SCRIPT, [str(a) for a in args], work / "compute_dpg_bench.log", self.launcher(),
                   cwd=self.modelscope_cache, variables={"MODELSCOPE_CACHE": str(self.modelscope_cache)})
        output = read_results(results)
        unknown = sorted(set(output.items) - {item.split(".")[0] for item, _ in groups.values()})
        if unknown:
            raise OfficialOutputError(f"{results} scores {len(unknown)} files this export does not hold "
                                      f"({unknown[:3]}); remove them from {work / GRIDS} and rerun")
        per_sample, counts = self._per_prompt(groups, output)
        return EvalResult(summary=summary_rows(output, per_sample, counts, results), per_sample=per_sample)

    def _per_prompt(self, groups: dict[str, tuple[str, list[str]]],
                    output: DPGOutput) -> tuple[pd.DataFrame, dict[str, Counter]]:
        """Per-prompt rows, and how many question scores of each L1 / L2 category the scored items
        gave the script's category means (its own walk, evaluators/dpg_bench.official_categories)."""
        graph = load_official_questions(self._questions) if self._questions is not None else {}
        rows, counts = [], {"l1": Counter(), "l2": Counter()}
        for prompt_id, (item, _) in groups.items():
            key = item.split(".")[0]  # the script's key: the file name up to its first "."
            questions = graph.get(key) or []
            if key in output.items:
                tiles, score = output.items[key]
                rows.append({"prompt_id": prompt_id, "item_id": item, **_scored_row(score, tiles, len(questions))})
                for cat in official_categories(questions, np.zeros(len(questions))):
                    counts["l1"][cat["l1"]] += 1
                    counts["l2"][cat["l2"]] += 1
            else:
                rows.append({"prompt_id": prompt_id, "item_id": item, **_failed_row(len(questions))})
        return pd.DataFrame(rows, columns=list(PER_SAMPLE_COLUMNS)), counts


def item_groups(samples: SampleSet) -> dict[str, tuple[str, list[str]]]:
    """prompt_id -> (item_id, its IMAGES_PER_PROMPT sample ids in image order), as evaluators/dpg_bench.py
    groups them; ValueError naming a prompt that is not DPG-Bench's or lacks images."""
    records = samples.records()
    if records.empty:
        raise ValueError(f"{samples} has no complete samples; run the generate stage first")
    groups: dict[str, tuple[str, list[str]]] = {}
    for prompt_id, part in records.sort_values(["prompt_id", "image_index"]).groupby("prompt_id", sort=False):
        if not str(prompt_id).startswith("dpg_bench/"):
            raise ValueError(f"prompt {prompt_id!r} is not a DPG-Bench prompt; the DPG-Bench evaluators need "
                             "dataset=dpg_bench (prompt ids dpg_bench/<item_id>)")
        ids = part["sample_id"].tolist()
        if len(ids) != IMAGES_PER_PROMPT:
            raise ValueError(f"prompt {prompt_id} has {len(ids)} images {ids}; DPG-Bench needs "
                             f"images_per_prompt={IMAGES_PER_PROMPT}")
        groups[str(prompt_id)] = (str(prompt_id).removeprefix("dpg_bench/"), ids)
    return groups


def grid_item(samples: SampleSet, sample_ids: Sequence[str]) -> ExportItem:
    """The export item of one prompt's 2x2 grid PNG, identified by its images' digests."""
    def content() -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(make_grid([samples.load_image(s) for s in sample_ids])).save(buffer, format="PNG")
        return buffer.getvalue()
    return ExportItem(text_digest(*(sha256_file(samples.image_path(s)) for s in sample_ids)), content)


def read_results(path: Path) -> DPGOutput:
    """compute_dpg_bench.py's results file -> DPGOutput.

    Raises:
        OfficialOutputError: naming the file and line: no file, no summary block ("Model: ..."), an
            item line without 4 tile scores and a grid score, an item twice, a category or score
            line that is not "<name>: <number>", no "DPG-Bench score" line.
    """
    if not path.is_file():
        raise OfficialOutputError(f"{SCRIPT} exited with status 0 but did not write {path}; see its log "
                                  f"{path.parent / 'compute_dpg_bench.log'}")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Model: ")), None)
    if start is None:
        raise OfficialOutputError(f"{path} has no summary block (a 'Model: ...' line followed by the category "
                                  f"scores); the script stopped early, see {path.parent / 'compute_dpg_bench.log'}")
    output = DPGOutput()
    for lineno, line in enumerate(lines[:start], start=1):
        if line.strip():
            key, tiles, score = _item_line(path, lineno, line)
            if key in output.items:
                raise OfficialOutputError(f"{path}:{lineno}: a second line for {key}; each grid is scored once")
            output.items[key] = (tiles, score)
    section: dict[str, float] | None = None
    for lineno, line in enumerate(lines[start + 1:], start=start + 2):
        if line == "L1 category scores:":
            section = output.l1
        elif line == "L2 category scores:":
            section = output.l2
        elif line.startswith("\t") and section is not None:
            name, value = _named_number(path, lineno, line.strip())
            section[name] = value
        elif line.startswith("DPG-Bench score: "):
            output.score = _named_number(path, lineno, line)[1]
            return output
        elif line.startswith(("Image path: ", "Save results to: ")):
            section = None
        elif line.strip():
            raise OfficialOutputError(f"{path}:{lineno}: unexpected line {line[:80]!r} in the summary block")
    raise OfficialOutputError(f"{path} has no 'DPG-Bench score: <score>' line; the script stopped before it, see "
                              f"{path.parent / 'compute_dpg_bench.log'}")


def _item_line(path: Path, lineno: int, line: str) -> tuple[str, list[float], float]:
    """"<image path>, <tile scores...>, <grid score>" -> (the script's item key, tile scores, grid score)."""
    parts = line.rsplit(", ", IMAGES_PER_PROMPT + 1)
    try:
        if len(parts) != IMAGES_PER_PROMPT + 2:
            raise ValueError(f"{len(parts) - 1} numbers")
        numbers = [float(p) for p in parts[1:]]
    except ValueError as exc:
        raise OfficialOutputError(f"{path}:{lineno}: expected '<image>, <{IMAGES_PER_PROMPT} tile scores>, <grid "
                                  f"score>' (--pic-num {IMAGES_PER_PROMPT}), got {line[:120]!r} ({exc})") from exc
    return PurePath(parts[0]).name.split(".")[0], numbers[:-1], numbers[-1]


def _named_number(path: Path, lineno: int, text: str) -> tuple[str, float]:
    """"<name>: <number>" -> (name, number), else OfficialOutputError naming the line."""
    name, _, value = text.rpartition(": ")
    try:
        if not name:
            raise ValueError("no '<name>: ' before it")
        return name, float(value)
    except ValueError as exc:
        raise OfficialOutputError(f"{path}:{lineno}: expected '<name>: <number>', got {text[:120]!r} "
                                  f"({exc})") from exc


def summary_rows(output: DPGOutput, per_sample: pd.DataFrame, counts: dict[str, Counter],
                 path: Path) -> pd.DataFrame:
    """The rows of evaluators/dpg_bench.py from the script's numbers, checked against its item lines.

    Raises:
        OfficialOutputError: the printed score is not the mean of the item lines, or the categories
            printed are not those the question graph gives the scored items.
    """
    scored = per_sample[~per_sample["failed"].astype(bool)]["score"].astype(float)
    n = len(scored)
    mean = 100 * float(np.mean(scored.to_numpy())) if n else math.nan
    if not (math.isclose(mean, output.score, rel_tol=1e-9, abs_tol=1e-9)
            or (math.isnan(mean) and math.isnan(output.score))):
        raise OfficialOutputError(f"{path}: 'DPG-Bench score: {output.score}', but its item lines for this export "
                                  f"average to {mean}; the file mixes runs or exports")
    rows = [{"metric": "dpg_bench", "subset": "all", "value": output.score,
             "stderr": 100 * float(scored.std(ddof=1)) / math.sqrt(n) if n > 1 else math.nan, "n": n}]
    failed = int(per_sample["failed"].sum())
    if failed:
        rows.append({"metric": "dpg_bench_failed", "subset": "all", "value": failed, "n": len(per_sample),
                     "higher_is_better": False})
    for level, printed in (("l1", output.l1), ("l2", output.l2)):
        if set(printed) != set(counts[level]):
            raise OfficialOutputError(
                f"{path}: its {level.upper()} categories {sorted(printed)[:8]} are not those the question graph "
                f"gives the scored items {sorted(counts[level])[:8]}; was the script given another --csv?")
        rows += [{"metric": f"dpg_bench_{level}", "subset": cat, "value": printed[cat], "n": counts[level][cat]}
                 for cat in sorted(printed)]
    return metric_rows(rows)
