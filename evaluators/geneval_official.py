"""GenEval scored by its official scripts in GenEval's own environment (evaluator=geneval_official).

djghosh13/geneval `evaluation/evaluate_images.py` (mmdet 2.x Mask2Former + open_clip colour
classifier) runs as a subprocess with the `env_python` of the environment built in
docs/evaluators.md; `evaluation/summary_scores.py` then summarises its results.jsonl. The formats
are those of the scripts at commit af4902f24d3ca90ebbb446dd9891a59e0f82725f:

- export, `<work>/images/` (the README's layout): `<index:05d>/metadata.jsonl` holds the prompt's
  line of evaluation_metadata.jsonl (one JSON object), `<index:05d>/samples/<image:04d>.png` its
  images. `index` is the number of a "geneval/NNNNN" prompt id (the official folder name), else the
  prompt's position among the set's prompts;
- results.jsonl (pandas `to_json(orient="records", lines=True)`): one object per image with
  filename (`<imagedir>/<index>/samples/<image>.png`), tag, prompt, correct (bool), reason,
  metadata and details (JSON strings);
- summary_scores.py prints "Overall score (avg. over tasks): <x:.5f>" among its lines.

The rows are the in-process evaluator's (evaluators/geneval.py): `geneval` per tag and "all"
(unweighted mean of the tags), `geneval_images`, `geneval_prompts`, and per-image verdicts, computed
from results.jsonl by the same `summarize`; the overall score is checked against summary_scores.py's.
`<work>` is `<SampleSet root>/official/<evaluator name>/` (evaluators/official_env.py).
"""
from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import replace
from pathlib import Path, PurePath
from typing import Any, Mapping, Sequence

import pandas as pd

from evaluators.geneval import PER_SAMPLE_COLUMNS, geneval_metadata
from evaluators.geneval_rules import summarize
from evaluators.official_build import command_line
from evaluators.official_env import (MANIFEST, ExportItem, OfficialEnv, OfficialEnvError, OfficialOutputError,
                                     fresh, given, missing_modules, official_home, open_env,
                                     run_script, sync_export, text_digest, unset_keys, work_dir)
from harness.api import EvalResult
from harness.datasets.downloads import Pinned, mismatch, sha256_file
from harness.store.samples import SampleSet

log = logging.getLogger(__name__)

EVALUATE_SCRIPT = "evaluation/evaluate_images.py"
SUMMARY_SCRIPT = "evaluation/summary_scores.py"
DETECTOR = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"  # evaluate_images.py's default `model` option
# where evaluation/download_models.sh @af4902f fetches the detector from (saved as <model_path>/<DETECTOR>.pth)
DETECTOR_URL = ("https://download.openmmlab.com/mmdetection/v2.0/mask2former/" + DETECTOR + "/"
                "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth")
# sha256 of that file (275,630,991 bytes): its Git LFS oid on the Hugging Face Hub (Pfei111/mask2former
# @8dd314f, the same file name), whose first 8 digits are the ones OpenMMLab puts in the file name
DETECTOR_SHA256 = "743b7d99015f1224c6d57fd4b14d04b15cc8ec72ae7ee7831e7c71d8873b7a54"
IMAGES = "images"
RESULTS = "results.jsonl"
SUMMARY_OUTPUT = "summary_scores.txt"
RECIPE = f"`{command_line('geneval')}`, docs/evaluators.md 'GenEval's environment'"
# what evaluate_images.py imports (besides numpy, pandas, PIL and torch)
MODULES = ("mmdet", "mmcv", "open_clip", "clip_benchmark", "pandas")
# open_clip 2.20 (environment.yml) loads `pretrained="openai"` ViT-L-14 from this URL into
# ~/.cache/clip/ViT-L-14.pt and accepts a file there whose sha256 is the URL's folder name
CLIP_DIR = "~/.cache/clip"
CLIP_SHA256 = "b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836"
CLIP_FILE = Pinned(name="ViT-L-14.pt", what="GenEval's colour classifier (open_clip ViT-L-14, openai)",
                   url=f"https://openaipublic.azureedge.net/clip/models/{CLIP_SHA256}/ViT-L-14.pt", sha256=CLIP_SHA256)
REQUIRED_FIELDS = ("filename", "tag", "correct", "reason")
_OVERALL = re.compile(r"^Overall score \(avg\. over tasks\): (\S+)\s*$", re.MULTILINE)
_OVERALL_DECIMALS = 5  # summary_scores.py prints the overall score with 5 decimals
_PROMPT_FOLDER = re.compile(r"geneval/(\d{1,5})")


class GenEvalOfficial:
    """GenEval accuracy of a SampleSet, computed by the official scripts in their own environment.

    Args:
        env_python: the interpreter of GenEval's environment (null: `<home>/env/bin/python`).
        repo: the djghosh13/geneval checkout whose evaluation/ scripts run (null: `<home>/repo`).
        model_path: the folder holding `<model>.pth` (null: `<home>/models`; fetch brings it there).
        home: the folder `python -m evaluators.official_build geneval` builds (null: $MULO_BENCH_CACHE/official/geneval).
        clip_dir: where the environment's open_clip 2.20 reads `ViT-L-14.pt` (its `~/.cache/clip`, of
            the user who runs the job); fetch brings the pinned file there.
        clip_sha256: the CLIP file's pin (open_clip 2.20 checks the file against the same hash).
        name: evaluator name (the `evaluator` column, per_sample/<decoder>/<name>.csv).
        model_config: mmdet config file (None: the script's default, read from mmdet's source tree).
        options: evaluate_images.py `--options` (threshold, counting_threshold, max_objects,
            max_overlap, position_threshold, model, clip_model, bgcolor, crop); {}: the official defaults.
        commit: the commit the checkout must be at (a git checkout: its HEAD; otherwise recorded as given).

    Nothing is checked on construction (fetch builds it to list its assets); `check()` runs before
    generation.
    """

    def __init__(self, env_python: str | None = None, repo: str | None = None, model_path: str | None = None,
                 name: str = "geneval_official", model_config: str | None = None,
                 options: Mapping[str, Any] | None = None, commit: str | None = None, home: str | None = None,
                 clip_dir: str = CLIP_DIR, clip_sha256: str = CLIP_SHA256) -> None:
        self.name = name
        self.key = f"evaluator.{name}"
        root = official_home("geneval", home)
        self.paths = {"env_python": env_python if given(env_python) else str(root / "env" / "bin" / "python"),
                      "repo": repo if given(repo) else str(root / "repo"),
                      "model_path": model_path if given(model_path) else str(root / "models")}
        self.clip_dir = Path(clip_dir).expanduser()
        self.clip_file = replace(CLIP_FILE, sha256=clip_sha256)
        self.model_config = model_config if given(model_config) else None
        self.options = {str(k): str(v) for k, v in (options or {}).items()}
        self.commit = commit
        self._env: OfficialEnv | None = None

    @property
    def version(self) -> str:
        """e.g. "geneval-official@af4902f2.../mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco(threshold=0.5)"."""
        commit = self._env.commit if self._env is not None else "unknown"
        detector = self.options.get("model", DETECTOR)
        rest = {k: v for k, v in sorted(self.options.items()) if k != "model"}
        options = f"({','.join(f'{k}={v}' for k, v in rest.items())})" if rest else ""
        return f"geneval-official@{commit}/{detector}{options}"

    def check(self) -> None:
        """Before generation (harness/run.py): the environment runs and imports what the script
        imports, the checkout is at `commit` and holds the scripts, the detector is in `model_path`
        and the CLIP file in `clip_dir`; OfficialEnvError naming what is missing and the command
        that fixes it."""
        env = self._env or self._open()
        missing_modules(self.key, env.python, MODULES, f"build the environment with {RECIPE}")
        for asset in self.assets():
            absent = asset.missing()
            if absent:
                raise OfficialEnvError(f"{self.key}: {', '.join(absent)} is not in {asset.path.parent} "
                                       f"({asset.what}); fetch it with the same command and stages=[fetch], or "
                                       f"`{asset.command()}`")
        if "model" not in self.options:  # the default detector decides every verdict: its pinned bytes
            detector = Path(str(self.paths["model_path"])).expanduser() / f"{DETECTOR}.pth"
            found = mismatch(detector, detector_pin(detector.parent))
            if found is not None:
                raise OfficialEnvError(f"{self.key}: {detector} has {found}, not the pinned sha256 {DETECTOR_SHA256} "
                                       f"of GenEval's detector (a damaged, truncated or substituted file); delete "
                                       f"it (rm {detector}) and fetch it again with stages=[fetch]")
        self._env = env

    def assets(self) -> list:
        """What `stages=[fetch]` brings for the official script (harness/assets): its detector, into
        `model_path` under the name download_models.sh gives it (the default detector only), and
        open_clip 2.20's ViT-L-14 `openai` file into `clip_dir` (the default CLIP only)."""
        from harness.assets.asset import UrlFile

        found = []
        if "model" not in self.options:
            folder = Path(str(self.paths["model_path"])).expanduser()
            found.append(UrlFile("evaluator geneval_official", detector_pin(folder), str(folder)))
        if "clip_model" not in self.options:
            found.append(UrlFile("evaluator geneval_official CLIP", self.clip_file, str(self.clip_dir)))
        return found

    def _open(self) -> OfficialEnv:
        """The checked environment; OfficialEnvError naming the option that is wrong and the fix."""
        unset_keys(self.key, self.paths)
        env = open_env(self.key, str(self.paths["env_python"]), str(self.paths["repo"]),
                       (EVALUATE_SCRIPT, SUMMARY_SCRIPT), self.commit, RECIPE)
        if self.model_config is not None and not Path(self.model_config).expanduser().is_file():
            raise OfficialEnvError(f"{self.key}.model_config={self.model_config} does not exist; give an mmdet 2.x "
                                   "config file, or null for the script's default")
        return env

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """Export, run evaluate_images.py and summary_scores.py, read the verdicts back.

        Returns: the rows of evaluators/geneval.py (`geneval` per tag and "all", `geneval_images`,
        `geneval_prompts`) and per_sample with PER_SAMPLE_COLUMNS, one row per image.
        """
        self.check()
        assert self._env is not None  # check() opened it
        records = samples.records()
        if records.empty:
            raise ValueError(f"{samples} has no complete samples; run the generate stage first")
        metas = [geneval_metadata(row) for row in records.itertuples(index=False)]
        work = work_dir(samples.root, self.name)
        places = official_layout(records["prompt_id"].tolist(), records["image_index"].tolist())
        sync_export(work / IMAGES, export_items(samples, records["sample_id"].tolist(), places, metas),
                    work / MANIFEST)
        results = fresh(work / RESULTS)
        run_script(self._env, EVALUATE_SCRIPT, self._arguments(work / IMAGES, results),
                   work / "evaluate_images.log")
        found = read_results(results, dict(zip(places, records["sample_id"], strict=True)),
                             {place: meta["tag"] for place, meta in zip(places, metas, strict=True)})
        per_sample = pd.DataFrame({
            "sample_id": records["sample_id"].tolist(),
            "prompt_id": records["prompt_id"].tolist(),
            "tag": [found[s]["tag"] for s in records["sample_id"]],
            "correct": [found[s]["correct"] for s in records["sample_id"]],
            "reason": [found[s]["reason"] for s in records["sample_id"]],
        }, columns=list(PER_SAMPLE_COLUMNS))
        summary = summarize(per_sample)
        run_script(self._env, SUMMARY_SCRIPT, [results], fresh(work / SUMMARY_OUTPUT))
        overall = float(summary[(summary["metric"] == "geneval") & (summary["subset"] == "all")]["value"].iloc[0])
        check_overall(work / SUMMARY_OUTPUT, overall, results)
        log.info("%s: GenEval overall %.4f over %d images (%s)", samples, overall, len(per_sample), self.version)
        return EvalResult(summary=summary, per_sample=per_sample)

    def _arguments(self, images: Path, results: Path) -> list[str]:
        """evaluate_images.py's command line after the script."""
        args = [str(images), "--outfile", str(results), "--model-path",
                str(Path(str(self.paths["model_path"])).expanduser().absolute())]
        if self.model_config is not None:
            args += ["--model-config", str(Path(self.model_config).expanduser().absolute())]
        if self.options:
            args += ["--options", *(f"{k}={v}" for k, v in self.options.items())]
        return args


def official_layout(prompt_ids: Sequence[str], image_indices: Sequence[int]) -> list[str]:
    """Per sample, its exported image's path in the official layout, "<index:05d>/samples/<image:04d>.png".

    `index` is NNNNN of "geneval/NNNNN" when every prompt id has that form (the official folder
    names), else the prompt's position in sorted prompt-id order.
    """
    distinct = sorted(set(prompt_ids))
    matches = [_PROMPT_FOLDER.fullmatch(p) for p in distinct]
    if all(matches):
        index = {p: int(m.group(1)) for p, m in zip(distinct, matches) if m is not None}
    else:
        index = {p: i for i, p in enumerate(distinct)}
    return [f"{index[p]:05d}/samples/{int(i):04d}.png" for p, i in zip(prompt_ids, image_indices, strict=True)]


def detector_pin(folder: Path) -> Pinned:
    """GenEval's default detector as download_models.sh saves it in `folder`, pinned by its sha256."""
    return Pinned(name=f"{DETECTOR}.pth", url=DETECTOR_URL, sha256=DETECTOR_SHA256,
                  what=f"GenEval's detector (mmdet 2.x) in {folder}")


def export_items(samples: SampleSet, sample_ids: Sequence[str], places: Sequence[str],
                 metas: Sequence[dict[str, Any]]) -> dict[str, ExportItem]:
    """The exported files: every sample's PNG (its stored bytes, unchanged) and one metadata.jsonl
    per prompt folder."""
    items: dict[str, ExportItem] = {}
    for sample_id, place, meta in zip(sample_ids, places, metas, strict=True):
        items[place] = _copy_of(samples.image_path(sample_id))
        folder = place.split("/")[0]
        line = json.dumps(meta) + "\n"
        items.setdefault(f"{folder}/metadata.jsonl", ExportItem(text_digest(line), lambda line=line: line.encode()))
    return items


def _copy_of(path: Path) -> ExportItem:
    """An export item holding the bytes of `path`."""
    return ExportItem(sha256_file(path), lambda: path.read_bytes())


def read_results(path: Path, samples: Mapping[str, str], tags: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """sample_id -> {tag, correct, reason} from the official results.jsonl.

    Args:
        samples: exported image path ("<index>/samples/<image>.png") -> sample_id.
        tags: exported image path -> the tag its metadata.jsonl gives.

    Raises:
        OfficialOutputError: naming the file (and line) and what is wrong: no file, a line that is not
            a JSON object with the fields, a wrong type, an image that was not exported (a file someone
            put in the export folder), a tag that is not the metadata's, an image judged twice or not
            at all.
    """
    if not path.is_file():
        raise OfficialOutputError(f"{EVALUATE_SCRIPT} exited with status 0 but did not write {path}; see its log "
                                  f"{path.parent / 'evaluate_images.log'}")
    found: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        row = _result_row(path, lineno, line)
        place = "/".join(PurePath(row["filename"]).parts[-3:])
        if place not in samples:
            raise OfficialOutputError(f"{path}:{lineno}: a verdict for {row['filename']}, which this export does "
                                      f"not hold; remove it from the export folder {path.parent / IMAGES} and rerun")
        if tags[place] != row["tag"]:
            raise OfficialOutputError(f"{path}:{lineno}: tag {row['tag']!r} for {place}, whose metadata.jsonl says "
                                      f"{tags[place]!r}; the results are not those of this export")
        sample_id = samples[place]
        if sample_id in found:
            raise OfficialOutputError(f"{path}:{lineno}: a second verdict for {place}; each image is judged once")
        found[sample_id] = {"tag": row["tag"], "correct": row["correct"], "reason": row["reason"] or ""}
    missing = [place for place, sample_id in samples.items() if sample_id not in found]
    if missing:
        raise OfficialOutputError(f"{path} has no verdict for {len(missing)} of {len(samples)} exported images "
                                  f"(first: {missing[0]}); the script skipped them, see "
                                  f"{path.parent / 'evaluate_images.log'}")
    return found


def _result_row(path: Path, lineno: int, line: str) -> dict[str, Any]:
    """One results.jsonl line as a dict with REQUIRED_FIELDS of the right types, else OfficialOutputError."""
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise OfficialOutputError(f"{path}:{lineno}: not a JSON line ({exc}); evaluate_images.py writes one JSON "
                                  "object per image") from exc
    if not isinstance(row, dict):
        raise OfficialOutputError(f"{path}:{lineno}: a JSON {type(row).__name__}, not an object with fields "
                                  f"{list(REQUIRED_FIELDS)}")
    missing = [f for f in REQUIRED_FIELDS if f not in row]
    if missing:
        raise OfficialOutputError(f"{path}:{lineno}: lacks fields {missing}; evaluate_images.py writes "
                                  f"{list(REQUIRED_FIELDS)} and more per image")
    kinds = {"filename": str, "tag": str, "correct": bool}
    for field, kind in kinds.items():
        if not isinstance(row[field], kind):
            raise OfficialOutputError(f"{path}:{lineno}: field {field!r} is {row[field]!r}, not a {kind.__name__}")
    if row["reason"] is not None and not isinstance(row["reason"], str):
        raise OfficialOutputError(f"{path}:{lineno}: field 'reason' is {row['reason']!r}, not a str")
    return row


def check_overall(summary_output: Path, overall: float, results: Path) -> None:
    """OfficialOutputError unless summary_scores.py's printed overall score is `overall` (computed
    here from `results`) to its printed precision."""
    text = summary_output.read_text(encoding="utf-8", errors="replace") if summary_output.is_file() else ""
    match = _OVERALL.search(text)
    if match is None:
        raise OfficialOutputError(f"{summary_output} has no line 'Overall score (avg. over tasks): <score>'; "
                                  f"{SUMMARY_SCRIPT} printed something else (see that file)")
    try:
        printed = float(match.group(1))
    except ValueError as exc:
        raise OfficialOutputError(f"{summary_output}: overall score {match.group(1)!r} is not a number") from exc
    if not math.isclose(printed, overall, abs_tol=0.5 * 10 ** -_OVERALL_DECIMALS + 1e-12):
        raise OfficialOutputError(f"{summary_output} gives overall score {printed}, but {results} averages to "
                                  f"{overall:.6f}; the two official outputs disagree")
