"""The official evaluators' export / run / import contract, with stand-in scripts.

The stand-ins sit at the official paths of a temporary checkout (evaluation/evaluate_images.py and
summary_scores.py of djghosh13/geneval, dpg_bench/compute_dpg_bench.py of TencentQQGYLab/ELLA) and
run under this interpreter as `env_python`. They read exactly what the official scripts read (the
GenEval folder layout, DPG-Bench's 2x2 grids and question CSV) and write exactly what those write
(pandas' records-lines results.jsonl, summary_scores.py's printout, compute_dpg_bench.py's results
file), with verdicts and VQA answers fabricated from the metadata and the pixels. The rows read back
must equal those computed here from the same fabricated verdicts.
"""
from __future__ import annotations

import csv
import inspect
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pytest

from evaluators.dpg_bench import DPGBenchEvaluator
from evaluators.dpg_bench_official import MPLUG_MODEL, DPGBenchOfficial
from evaluators.geneval_official import CLIP_FILE, DETECTOR, GenEvalOfficial
from harness.assets.asset import ModelScopeModel
from tests.official_envs import DPG_MODULES, GENEVAL_MODULES, standin_env
from evaluators.geneval_rules import summarize
from evaluators.official_env import OfficialEnvError, OfficialOutputError, OfficialScriptError
from harness.api import Prompt
from harness.store.samples import SampleSet, plan
from tests.test_dpg_bench import HEADER


def fabricated_verdict(meta: dict[str, Any], red: int) -> bool:
    """The stand-in detector's verdict on an image: from its metadata and its top-left red value."""
    return (red + len(meta["include"]) + len(meta["prompt"])) % 2 == 0


def fabricated_answer(red: int, question: str) -> str:
    """The stand-in VQA model's answer about a tile: from its top-left red value and the question."""
    return "yes" if (red + len(question)) % 3 != 0 else "no"


# ---------------------------------------------------------------- GenEval stand-ins

GENEVAL_EVALUATE = '''
import argparse, json, os, re, sys
from typing import Any
import pandas as pd
from PIL import Image

MODE = "{mode}"
{verdict}

parser = argparse.ArgumentParser()
parser.add_argument("imagedir", type=str)
parser.add_argument("--outfile", type=str, default="results.jsonl")
parser.add_argument("--model-config", type=str, default=None)
parser.add_argument("--model-path", type=str, default="./")
parser.add_argument("--options", nargs="*", type=str, default=[])
args = parser.parse_args()
options = dict(opt.split("=", 1) for opt in args.options)
detector = os.path.join(args.model_path, options.get("model", "{detector}") + ".pth")
assert os.path.isfile(detector), detector
if MODE == "fail":
    for i in range(30):
        print(f"step-{{i:02d}}")
    print("RuntimeError: ms_deform_attn_impl_forward: implementation for device cuda:0 not found", file=sys.stderr)
    sys.exit(3)
rows = []
for sub in os.listdir(args.imagedir):
    folder = os.path.join(args.imagedir, sub)
    if not os.path.isdir(folder) or not sub.isdigit():
        continue
    with open(os.path.join(folder, "metadata.jsonl")) as fp:
        meta = json.load(fp)
    for name in os.listdir(os.path.join(folder, "samples")):
        path = os.path.join(folder, "samples", name)
        if not os.path.isfile(path) or not re.match(r"\\d+\\.png", name):
            continue
        red = Image.open(path).convert("RGB").getpixel((0, 0))[0]
        correct = fabricated_verdict(meta, red)
        reason = "" if correct else f"expected {{meta['include'][0]['class']}}>=1, found 0"
        rows.append({{"filename": path, "tag": meta["tag"], "prompt": meta["prompt"], "correct": correct,
                     "reason": reason, "metadata": json.dumps(meta), "details": json.dumps({{}})}})
if MODE == "skip":
    rows = rows[1:]
if MODE == "nothing":
    sys.exit(0)
with open(args.outfile, "w") as fp:
    pd.DataFrame(rows).to_json(fp, orient="records", lines=True)
if MODE == "truncated":
    text = open(args.outfile).read().splitlines()
    text[1] = text[1][: len(text[1]) // 2]
    open(args.outfile, "w").write("\\n".join(text) + "\\n")
if MODE == "no_correct":
    lines = [json.loads(line) for line in open(args.outfile)]
    del lines[0]["correct"]
    open(args.outfile, "w").write("".join(json.dumps(line) + "\\n" for line in lines))
'''

GENEVAL_SUMMARY = '''
import argparse, os
import numpy as np
import pandas as pd

parser = argparse.ArgumentParser()
parser.add_argument("filename", type=str)
args = parser.parse_args()
with open(os.path.join(os.path.dirname(__file__), "object_names.txt")) as cls_file:
    classnames = [line.strip() for line in cls_file]
df = pd.read_json(args.filename, orient="records", lines=True)
print("Summary")
print(f"Total images: {len(df)}")
print(f"% correct images: {df['correct'].mean():.2%}")
task_scores = []
for tag, task_df in df.groupby("tag", sort=False):
    task_scores.append(task_df["correct"].mean())
    print(f"{tag:<16} = {task_df['correct'].mean():.2%} ({task_df['correct'].sum()} / {len(task_df)})")
print()
print(f"Overall score (avg. over tasks): {np.mean(task_scores):.5f}")
'''

GENEVAL_PROMPTS = [
    Prompt(id="geneval/00002", text="a photo of a cat",
           meta={"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"}),
    Prompt(id="geneval/00007", text="a photo of a dog and a cup",
           meta={"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cup", "count": 1}],
                 "prompt": "a photo of a dog and a cup"}),
    Prompt(id="geneval/00011", text="a photo of three apples",
           meta={"tag": "counting", "include": [{"class": "apple", "count": 3}],
                 "exclude": [{"class": "apple", "count": 4}], "prompt": "a photo of three apples"}),
]


STAND_IN_DETECTOR = b"stand-in"


@pytest.fixture(autouse=True)
def stand_in_detector_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in checkouts carry a stand-in detector file: its sha256 is the pin here
    (test_the_real_detector_pin_refuses_another_file checks the real one)."""
    import hashlib

    import evaluators.geneval_official as official

    monkeypatch.setattr(official, "DETECTOR_SHA256", hashlib.sha256(STAND_IN_DETECTOR).hexdigest())


def sample_set(root: Path, prompts: Sequence[Prompt], per_prompt: int, size: int = 8, seed: int = 0) -> SampleSet:
    """A SampleSet of random images (a different top-left pixel per image, mostly)."""
    samples = SampleSet(root)
    rng = np.random.default_rng(seed)
    for spec in plan(prompts, per_prompt, 0):
        samples.write(spec, rng.integers(0, 256, (size, size, 3), dtype=np.uint8), {})
    return samples


def geneval_repo(root: Path, mode: str = "ok") -> Path:
    """A stand-in djghosh13/geneval checkout (not a git checkout) plus the detector folder."""
    evaluation = root / "geneval" / "evaluation"
    evaluation.mkdir(parents=True, exist_ok=True)
    verdict = inspect.getsource(fabricated_verdict)
    (evaluation / "evaluate_images.py").write_text(
        GENEVAL_EVALUATE.format(mode=mode, verdict=verdict, detector=DETECTOR))
    (evaluation / "summary_scores.py").write_text(GENEVAL_SUMMARY)
    (evaluation / "object_names.txt").write_text("cat\ndog\ncup\napple\n")
    (root / "detector").mkdir(exist_ok=True)
    (root / "detector" / f"{DETECTOR}.pth").write_bytes(STAND_IN_DETECTOR)
    return root / "geneval"


def geneval_official(root: Path, **kwargs: Any) -> GenEvalOfficial:
    """The evaluator on the stand-in checkout, a stand-in environment and the stand-in CLIP file."""
    (root / "clip").mkdir(exist_ok=True)
    (root / "clip" / CLIP_FILE.name).write_bytes(b"stand-in")
    options = {"env_python": str(standin_env(root / "env", GENEVAL_MODULES)), "repo": str(root / "geneval"),
               "model_path": str(root / "detector"), "clip_dir": str(root / "clip"), "commit": "standin0", **kwargs}
    return GenEvalOfficial(**options)


def checked(evaluator: Any) -> Any:
    """`evaluator` after its check() (which opens the environment and finds the commit)."""
    evaluator.check()
    return evaluator


def expected_geneval(samples: SampleSet) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-image verdicts and summary rows computed here from the fabricated verdicts."""
    records = samples.records()
    metas = [json.loads(m) for m in records["meta"]]
    reds = [int(samples.load_image(s)[0, 0, 0]) for s in records["sample_id"]]
    correct = [fabricated_verdict(m, r) for m, r in zip(metas, reds)]
    per_sample = pd.DataFrame({
        "sample_id": records["sample_id"], "prompt_id": records["prompt_id"], "tag": [m["tag"] for m in metas],
        "correct": correct,
        "reason": ["" if c else f"expected {m['include'][0]['class']}>=1, found 0" for c, m in zip(correct, metas)],
    })
    return per_sample, summarize(per_sample)


def mtimes(folder: Path) -> dict[str, tuple[int, int]]:
    """file -> (inode, mtime_ns) of every file under `folder`."""
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_geneval_official_reads_back_the_official_results(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=2)
    geneval_repo(tmp_path)
    result = geneval_official(tmp_path).evaluate(samples)
    per_sample, summary = expected_geneval(samples)
    assert 0 < per_sample["correct"].sum() < len(per_sample), "the fabricated verdicts must mix"
    pd.testing.assert_frame_equal(result.per_sample.reset_index(drop=True), per_sample.reset_index(drop=True))
    pd.testing.assert_frame_equal(result.summary.reset_index(drop=True), summary.reset_index(drop=True))
    assert set(summary["metric"]) == {"geneval", "geneval_images", "geneval_prompts"}


def test_a_relative_samples_dir_reaches_the_script_as_an_absolute_path(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """README's samples_dir is relative to where the job runs; the script runs in its checkout."""
    geneval_repo(tmp_path)
    evaluator = geneval_official(tmp_path)
    monkeypatch.chdir(tmp_path)
    samples = sample_set(Path("results") / "samples", GENEVAL_PROMPTS, per_prompt=1)
    result = evaluator.evaluate(samples)
    assert len(result.per_sample) == 3


def test_geneval_official_export_is_the_official_layout(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=2)
    geneval_repo(tmp_path)
    evaluator = geneval_official(tmp_path)
    evaluator.evaluate(samples)
    images = samples.root / "official" / "geneval_official" / "images"
    assert sorted(p.name for p in images.iterdir()) == ["00002", "00007", "00011"]
    for prompt in GENEVAL_PROMPTS:
        folder = images / prompt.id.split("/")[1]
        assert json.loads((folder / "metadata.jsonl").read_text()) == prompt.meta
        assert list(json.loads((folder / "metadata.jsonl").read_text())) == list(prompt.meta), "official key order"
        assert sorted(p.name for p in (folder / "samples").iterdir()) == ["0000.png", "0001.png"]
        for index in range(2):
            sample_id = f"{prompt.id.replace('/', '-')}_{index:02d}"
            assert (folder / "samples" / f"{index:04d}.png").read_bytes() == samples.image_path(sample_id).read_bytes()
    assert evaluator.version == f"geneval-official@standin0/{DETECTOR}"


def test_geneval_official_rerun_reuses_the_export(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=2)
    geneval_repo(tmp_path)
    evaluator = geneval_official(tmp_path)
    evaluator.evaluate(samples)
    images = samples.root / "official" / "geneval_official" / "images"
    before = mtimes(images)
    evaluator.evaluate(samples)
    assert mtimes(images) == before, "nothing is exported again"
    # a regenerated image is exported again, alone, and scored as it is now
    spec = plan(GENEVAL_PROMPTS, 2, 0)[3]
    samples.write(spec, np.full((8, 8, 3), 7, np.uint8), {})
    result = evaluator.evaluate(samples)
    after = mtimes(images)
    assert [k for k in after if after[k] != before[k]] == ["00007/samples/0001.png"]
    pd.testing.assert_frame_equal(result.per_sample, expected_geneval(samples)[0])


def test_an_exported_file_changed_in_place_is_exported_again_not_scored(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The export is trusted by its own digest too: a PNG edited after export (a conversion tool,
    disk damage) keeps its source digest in the manifest, and is still replaced by the SampleSet's."""
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=2)
    geneval_repo(tmp_path)
    evaluator = geneval_official(tmp_path)
    evaluator.evaluate(samples)
    exported = samples.root / "official" / "geneval_official" / "images" / "00007" / "samples" / "0001.png"
    sample_id = "geneval-00007_01"
    exported.write_bytes(sample_set(tmp_path / "other", GENEVAL_PROMPTS, 2, seed=5).image_path(sample_id).read_bytes())
    assert exported.read_bytes() != samples.image_path(sample_id).read_bytes()
    # read the module's logger itself: an earlier in-process job of the suite may leave it disabled
    module_log = logging.getLogger("evaluators.official_env")
    module_log.disabled = False
    with caplog.at_level("WARNING", logger="evaluators.official_env"):
        result = evaluator.evaluate(samples)
    assert exported.read_bytes() == samples.image_path(sample_id).read_bytes()
    assert any(str(exported) in r.getMessage() and "changed" in r.getMessage() for r in caplog.records)
    pd.testing.assert_frame_equal(result.per_sample, expected_geneval(samples)[0])


_KILL_ON_PNG = """
import os, signal, sys
real_replace, count, at = os.replace, [0], int(sys.argv[1])
def replace(src, dst, *a, **k):
    if str(dst).endswith(".png") and "official" in str(dst):
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)  # the exported PNG's temporary file is written, not renamed
    return real_replace(src, dst, *a, **k)
os.replace = replace
import hashlib
import evaluators.geneval_official as official
from evaluators.geneval_official import GenEvalOfficial
from harness.store.samples import SampleSet
official.DETECTOR_SHA256 = hashlib.sha256(b"stand-in").hexdigest()  # the stand-in checkout's detector
root = sys.argv[2]
GenEvalOfficial(env_python=sys.argv[3], repo=root + "/geneval", model_path=root + "/detector",
                clip_dir=root + "/clip", commit="standin0").evaluate(SampleSet(root + "/samples"))
"""


def test_the_real_detector_pin_refuses_another_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GenEval's detector decides every verdict: a file in model_path without its pinned sha256 (a
    substitute, a truncated download) is refused before generation, naming it and the refetch."""
    import evaluators.geneval_official as official

    monkeypatch.setattr(official, "DETECTOR_SHA256", "743b7d99015f1224c6d57fd4b14d04b15cc8ec72ae7ee7831e7c71d8873b7a54")
    geneval_repo(tmp_path)
    detector = tmp_path / "detector" / f"{DETECTOR}.pth"
    with pytest.raises(OfficialEnvError) as refused:
        geneval_official(tmp_path).check()
    message = str(refused.value)
    assert str(detector) in message and official.DETECTOR_SHA256 in message and "stages=[fetch]" in message
    [asset] = [a for a in geneval_official(tmp_path).assets() if a.pinned.name == detector.name]
    assert asset.pinned.sha256 == official.DETECTOR_SHA256 and asset.pinned.url == official.DETECTOR_URL


def _work_folder(root: Path) -> dict[str, bytes]:
    """Every file of `<root>/samples/official/`, by relative path, with `root` in its bytes replaced
    (the script's log and results name the folder they ran in; pandas' JSON escapes its slashes)."""
    folder = root / "samples" / "official"
    named = (str(root).encode(), str(root).replace("/", "\\/").encode())
    return {str(p.relative_to(folder)): p.read_bytes().replace(named[0], b"<root>").replace(named[1], b"<root>")
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_geneval_official_export_killed_while_writing_resumes_to_an_uninterrupted_folder(tmp_path: Path) -> None:
    """SIGKILL between an exported PNG's temporary file and its rename, then a rerun: the official
    folder (export, manifest, outputs) is file for file an uninterrupted evaluation's."""
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    for root in (killed, whole):
        sample_set(root / "samples", GENEVAL_PROMPTS, per_prompt=2)
        geneval_repo(root)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    env_python = geneval_official(killed).paths["env_python"]  # the stand-in environment and CLIP file
    status = subprocess.run([sys.executable, "-c", _KILL_ON_PNG, "3", str(killed), env_python], env=env,
                            capture_output=True, timeout=120).returncode
    assert status == -9
    assert list((killed / "samples" / "official").rglob("*.tmp")), "the kill left no temporary file"
    resumed = geneval_official(killed).evaluate(SampleSet(killed / "samples"))
    uninterrupted = geneval_official(whole).evaluate(SampleSet(whole / "samples"))
    assert _work_folder(killed) == _work_folder(whole)
    pd.testing.assert_frame_equal(resumed.per_sample, uninterrupted.per_sample)


def test_a_failing_script_is_named_with_its_last_lines_and_the_export_is_kept(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=2)
    geneval_repo(tmp_path, mode="fail")
    evaluator = geneval_official(tmp_path)
    with pytest.raises(OfficialScriptError) as err:
        evaluator.evaluate(samples)
    message = str(err.value)
    assert "evaluation/evaluate_images.py" in message and "status 3" in message and "\n" not in message
    assert "cuda:0 not found" in message and "step-29" in message and "step-11" in message
    assert "step-10" not in message, "only the last 20 lines are quoted"
    assert str(samples.root / "official" / "geneval_official" / "evaluate_images.log") in message
    images = samples.root / "official" / "geneval_official" / "images"
    before = mtimes(images)
    assert len([k for k in before if k.endswith(".png")]) == 6, "the export is kept"
    geneval_repo(tmp_path, mode="ok")  # the environment fixed: the rerun reuses the export
    evaluator.evaluate(samples)
    assert mtimes(images) == before


@pytest.mark.parametrize("mode,words", [
    ("truncated", ["results.jsonl:2", "not a JSON line"]),
    ("no_correct", ["results.jsonl:1", "lacks fields ['correct']"]),
    ("nothing", ["exited with status 0 but did not write", "results.jsonl"]),
    ("skip", ["results.jsonl has no verdict for 1 of 6 exported images"]),
])
def test_malformed_geneval_results_are_named(tmp_path: Path, mode: str, words: list[str]) -> None:
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=2)
    geneval_repo(tmp_path, mode=mode)
    with pytest.raises(OfficialOutputError) as err:
        geneval_official(tmp_path).evaluate(samples)
    for word in words:
        assert word in str(err.value), (word, str(err.value))
    assert "\n" not in str(err.value)


def test_summary_scores_disagreeing_with_the_results_is_refused(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=2)
    repo = geneval_repo(tmp_path)
    (repo / "evaluation" / "summary_scores.py").write_text('print("Overall score (avg. over tasks): 0.12345")\n')
    with pytest.raises(OfficialOutputError, match="summary_scores.txt gives overall score 0.12345"):
        geneval_official(tmp_path).evaluate(samples)


def test_wrong_env_python_and_repo_are_named(tmp_path: Path) -> None:
    geneval_repo(tmp_path)
    with pytest.raises(OfficialEnvError, match=r"evaluator.geneval_official.env_python=\S*nowhere/bin/python does "
                                               "not exist.*python -m evaluators.official_build geneval"):
        geneval_official(tmp_path, env_python=str(tmp_path / "nowhere" / "bin" / "python")).check()
    with pytest.raises(OfficialEnvError, match="is a folder; give the environment's interpreter"):
        geneval_official(tmp_path, env_python=str(tmp_path)).check()
    impostor = tmp_path / "impostor"
    impostor.write_text("#!/bin/sh\necho 'not python' >&2\nexit 1\n")
    impostor.chmod(0o755)
    with pytest.raises(OfficialEnvError, match="does not run as Python 3 .exit status 1: not python"):
        geneval_official(tmp_path, env_python=str(impostor)).check()
    with pytest.raises(OfficialEnvError, match=r"evaluator.geneval_official.repo=\S+ has no "
                                               "evaluation/evaluate_images.py"):
        geneval_official(tmp_path, repo=str(tmp_path / "detector")).check()
    missing_detector = geneval_official(tmp_path, model_path=str(tmp_path))  # stages=[fetch] can build it
    with pytest.raises(OfficialEnvError, match=f"{DETECTOR}.pth is not in \\S+ .*stages=\\[fetch\\]"):
        missing_detector.check()
    bare = standin_env(tmp_path / "bare", ())  # runs, but lacks what evaluate_images.py imports
    with pytest.raises(OfficialEnvError, match="cannot import what the official script imports .mmdet, mmcv, "
                                               "clip_benchmark.*python -m evaluators.official_build geneval"):
        geneval_official(tmp_path, env_python=str(bare)).check()
    (tmp_path / "clip" / CLIP_FILE.name).unlink()
    no_clip = geneval_official(tmp_path)
    (tmp_path / "clip" / CLIP_FILE.name).unlink()
    with pytest.raises(OfficialEnvError, match="ViT-L-14.pt is not in .*clip .*stages=\\[fetch\\]"):
        no_clip.check()


def test_unbuilt_default_environment_names_the_build_command(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With no path configured, both official evaluators look in $MULO_BENCH_CACHE/official/<name> and,
    when nothing is built there, say which command builds it; constructing them checks nothing."""
    monkeypatch.setenv("MULO_BENCH_CACHE", str(tmp_path / "cache"))
    for evaluator, name in ((GenEvalOfficial(), "geneval"), (DPGBenchOfficial(), "dpg_bench")):
        home = tmp_path / "cache" / "official" / name
        with pytest.raises(OfficialEnvError, match=f"env_python={home}/env/bin/python does not exist.*"
                                                   f"python -m evaluators.official_build {name}"):
            evaluator.check()
        with pytest.raises(OfficialEnvError):
            evaluator.evaluate(sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=1))


def test_the_commit_is_the_checkouts_head(tmp_path: Path) -> None:
    repo = geneval_repo(tmp_path)
    with pytest.raises(OfficialEnvError, match=r"is not a git checkout.*evaluator.geneval_official.commit="):
        checked(geneval_official(tmp_path, commit=None))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "stand-in"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert checked(geneval_official(tmp_path, commit=None)).version.startswith(f"geneval-official@{head}/")
    assert head in checked(geneval_official(tmp_path, commit=head[:7])).version
    with pytest.raises(OfficialEnvError, match=f"is at commit {head}, not evaluator.geneval_official.commit=abc"):
        checked(geneval_official(tmp_path, commit="abc"))
    (repo / "evaluation" / "summary_scores.py").write_text("# changed\n")
    assert f"@{head}-dirty/" in checked(geneval_official(tmp_path, commit=None)).version


# ---------------------------------------------------------------- DPG-Bench stand-ins

DPG_SCRIPT = '''
import argparse, os, os.path as osp, sys
from collections import defaultdict
import numpy as np
import pandas as pd
from PIL import Image

MODE = "{mode}"
{answer}

parser = argparse.ArgumentParser()
parser.add_argument("--image-root-path", type=str, default=None)
parser.add_argument("--resolution", type=int, default=None)
parser.add_argument("--csv", type=str, default="./dpg_bench/dpg_bench.csv")
parser.add_argument("--res-path", type=str, default=None)
parser.add_argument("--pic-num", type=int, default=1)
parser.add_argument("--vqa-model", type=str, default="mplug")
args = parser.parse_args()
if MODE == "fail":
    print("ModuleNotFoundError: No module named 'fairseq'")
    sys.exit(1)

questions, previous = dict(), ""
for i, line in pd.read_csv(args.csv).iterrows():
    if i == 0:
        continue
    qid, deps = int(line.proposition_id), [int(d.strip()) for d in line.dependency.split(",")]
    if line.item_id == previous:
        questions[line.item_id]["tuple"][qid] = line.tuple
        questions[line.item_id]["dependency"][qid] = deps
        questions[line.item_id]["question"][qid] = line.question_natural_language
    else:
        questions[line.item_id] = dict(tuple={{qid: line.tuple}}, dependency={{qid: deps}},
                                       question={{qid: line.question_natural_language}})
    previous = line.item_id

open(args.res_path, "w").close()
open(args.res_path.replace(".txt", "_detail.txt"), "w").close()
r = args.resolution
crops = [(0, 0, r, r), (r, 0, 2 * r, r), (0, r, r, 2 * r), (r, r, 2 * r, 2 * r)][:args.pic_num]
grid_scores, category_scores = [], defaultdict(list)
for fn in os.listdir(args.image_root_path):
    path = osp.join(args.image_root_path, fn)
    try:
        image = Image.open(path)
        value = questions.get(osp.basename(path).split(".")[0], None)
        scores, answers_scores = [], dict()
        for crop in crops:
            red = image.crop(crop).convert("RGB").getpixel((0, 0))[0]
            for qid, question in value["question"].items():
                answer = fabricated_answer(red, question)
                answers_scores[qid] = float(answer == "yes")
                with open(args.res_path.replace(".txt", "_detail.txt"), "a") as f:
                    f.write(path + ", " + str(crop) + ", " + question + ", " + answer + "\\n")
            before = answers_scores.copy()
            for qid, parents in value["dependency"].items():
                for parent in parents:
                    if parent == 0:
                        continue
                    if answers_scores[parent] == 0:
                        answers_scores[qid] = 0
                        break
            scores.append(sum(answers_scores.values()) / len(answers_scores))
        average = sum(scores) / len(scores)
        with open(args.res_path, "a") as f:
            if MODE == "three_tiles":
                scores = scores[:3]
            f.write(path + ", " + ", ".join(str(s) for s in scores) + ", " + str(average) + "\\n")
        grid_scores.append(average)
        for qid in value["tuple"]:
            category_scores[value["tuple"][qid].split("(")[0].strip()].append(before[qid])
    except Exception as e:
        print("Failed filename:", fn, e)

level1 = defaultdict(list)
for category, values in category_scores.items():
    level1[category.split("-")[0].strip()].extend(values)
output = f"Model: {{osp.basename(args.image_root_path)}}\\n"
output += "L1 category scores:\\n"
for name in level1:
    output += f"\\t{{name}}: {{np.mean(level1[name]) * 100}}\\n"
output += "L2 category scores:\\n"
for name in sorted(category_scores):
    output += f"\\t{{name}}: {{np.mean(category_scores[name]) * 100}}\\n"
output += f"Image path: {{args.image_root_path}}\\n"
output += f"Save results to: {{args.res_path}}\\n"
if MODE != "no_score":
    output += f"DPG-Bench score: {{np.mean(grid_scores) * 100}}"
with open(args.res_path, "a") as f:
    f.write(output + "\\n")
print(output)
'''

# The first data row is dropped by the script (its quirk); item c depends on an unknown question and fails.
DPG_ROWS = [
    ("z", 1, "0", "entity - whole (owl)", "Is there an owl?"),
    ("a", 1, "0", "entity - whole (cat)", "Is there a cat?"),
    ("a", 2, "1", "attribute - color (cat, black)", "Is the cat black?"),
    ("a", 3, "2", "attribute - texture (cat, fluffy)", "Is the black cat fluffy?"),
    ("a", 4, "0", "entity - whole (sofa)", "Is there a sofa?"),
    ("a", 5, "1,4", "relation - spatial (cat, sofa, on)", "Is the cat on the sofa?"),
    ("b", 1, "0", "entity - whole (dog)", "Is there a dog?"),
    ("b", 2, "1", "entity - state (dog, run)", "Is the dog running?"),
    ("b", 3, "1", "global - (sunny)", "Is it sunny?"),
    ("c", 1, "0", "entity - whole (car)", "Is there a car?"),
    ("c", 2, "7", "attribute - color (car, red)", "Is the car red?"),
]
DPG_PROMPTS = [Prompt(id=f"dpg_bench/{item}", text=f"prompt {item}", meta={"item_id": item}) for item in "abc"]


def dpg_repo(root: Path, mode: str = "ok") -> Path:
    """A stand-in TencentQQGYLab/ELLA checkout (not a git checkout) with its question CSV."""
    folder = root / "ella" / "dpg_bench"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compute_dpg_bench.py").write_text(
        DPG_SCRIPT.format(mode=mode, answer=inspect.getsource(fabricated_answer)))
    with open(folder / "dpg_bench.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        for item, pid, dep, tup, question in DPG_ROWS:
            writer.writerow([item, "text", "kw", pid, dep, tup.split(" - ")[0], tup.split("(")[0], tup, question])
    return root / "ella"


def dpg_official(root: Path, **kwargs: Any) -> DPGBenchOfficial:
    """The evaluator on the stand-in checkout, a stand-in environment and a stand-in mPLUG in its
    MODELSCOPE_CACHE (fetched: the completion marker written)."""
    cache = root / "modelscope"
    standin_mplug(cache)
    options = {"env_python": str(standin_env(root / "env", DPG_MODULES)), "repo": str(root / "ella"),
               "commit": "standin1", "verify_questions": False, "accelerate": False,
               "modelscope_cache": str(cache), **kwargs}
    return DPGBenchOfficial(**options)


def standin_mplug(cache: Path) -> Path:
    """A stand-in mPLUG folder where ModelScope puts it in `cache`, as a completed fetch leaves it."""
    folder = cache / MPLUG_MODEL
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "configuration.json").write_text('{"task": "visual-question-answering"}')
    asset = ModelScopeModel("mPLUG", MPLUG_MODEL, sys.executable, str(cache))
    asset._marker().write_text('[["configuration.json", 38]]')
    return folder


class FabricatedVQA:
    """The in-process evaluator's VQA backend giving the stand-in script's answers."""

    name = "fabricated"

    def answer(self, image: np.ndarray, questions: Sequence[str]) -> list[str]:
        return [fabricated_answer(int(image[0, 0, 0]), q) for q in questions]


def test_dpg_official_reads_back_the_rows_of_the_official_script(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", DPG_PROMPTS, per_prompt=4)
    repo = dpg_repo(tmp_path)
    result = dpg_official(tmp_path).evaluate(samples)
    expected = DPGBenchEvaluator(FabricatedVQA(), questions=str(repo / "dpg_bench" / "dpg_bench.csv"),
                                 official_compat=True, show_progress=False, verify_questions=False).evaluate(samples)
    got, want = result.summary.set_index(["metric", "subset"]), expected.summary.set_index(["metric", "subset"])
    assert list(got.index) == list(want.index)
    assert ("dpg_bench_failed", "all") in got.index and got.loc[("dpg_bench_failed", "all"), "value"] == 1
    assert ("dpg_bench_l1", "global") in got.index
    for column in ("value", "stderr"):
        assert got[column].to_numpy() == pytest.approx(want[column].to_numpy(), rel=1e-12, nan_ok=True), column
    assert got["n"].tolist() == want["n"].tolist()
    assert got["higher_is_better"].tolist() == want["higher_is_better"].tolist()
    pd.testing.assert_frame_equal(result.per_sample.drop(columns="score"), expected.per_sample.drop(columns="score"))
    assert result.per_sample["score"].to_numpy() == pytest.approx(expected.per_sample["score"].to_numpy(), nan_ok=True)
    assert 0 < got.loc[("dpg_bench", "all"), "value"] < 100, "the fabricated answers must mix"


def test_dpg_official_exports_grids_once(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", DPG_PROMPTS, per_prompt=4)
    dpg_repo(tmp_path)
    evaluator = dpg_official(tmp_path)
    evaluator.evaluate(samples)
    grids = samples.root / "official" / "dpg_bench_official" / "grids"
    assert sorted(p.name for p in grids.iterdir()) == ["a.png", "b.png", "c.png"], "only the grids: the script reads all"
    from PIL import Image
    with Image.open(grids / "b.png") as grid:
        pixels = np.array(grid)
    tiles = [samples.load_image(f"dpg_bench-b_{i:02d}") for i in range(4)]
    assert (pixels[:8, 8:] == tiles[1]).all() and (pixels[8:, :8] == tiles[2]).all()
    before = mtimes(grids)
    evaluator.evaluate(samples)
    assert mtimes(grids) == before
    assert (samples.root / "official" / "dpg_bench_official" / "results_detail.txt").is_file()
    assert evaluator.version == "dpg_bench-official@standin1(python,custom-questions)/mplug"


@pytest.mark.parametrize("mode,words", [
    ("three_tiles", ["results.txt:", "expected '<image>, <4 tile scores>, <grid score>'"]),
    ("no_score", ["results.txt has no 'DPG-Bench score: <score>' line"]),
])
def test_malformed_dpg_results_are_named(tmp_path: Path, mode: str, words: list[str]) -> None:
    samples = sample_set(tmp_path / "samples", DPG_PROMPTS, per_prompt=4)
    dpg_repo(tmp_path, mode=mode)
    with pytest.raises(OfficialOutputError) as err:
        dpg_official(tmp_path).evaluate(samples)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_a_failing_dpg_script_is_named(tmp_path: Path) -> None:
    samples = sample_set(tmp_path / "samples", DPG_PROMPTS, per_prompt=4)
    dpg_repo(tmp_path, mode="fail")
    with pytest.raises(OfficialScriptError, match=r"dpg_bench/compute_dpg_bench.py of \S+ \(@standin1\) exited "
                                                  "with status 1.*No module named 'fairseq'"):
        dpg_official(tmp_path).evaluate(samples)
    assert len(list((samples.root / "official" / "dpg_bench_official" / "grids").iterdir())) == 3


def test_dpg_official_launches_as_dist_eval_sh(tmp_path: Path) -> None:
    dpg_repo(tmp_path)
    assert dpg_official(tmp_path, accelerate=True).launcher() == [
        "-m", "accelerate.commands.launch", "--num_machines", "1", "--num_processes", "1", "--mixed_precision",
        "fp16", "--main_process_port", "29500"]
    assert "--multi_gpu" in dpg_official(tmp_path, accelerate=True, processes=8).launcher()
    with pytest.raises(ValueError, match="evaluator.dpg_bench_official.processes must be >= 1"):
        dpg_official(tmp_path, processes=0)
    with pytest.raises(OfficialEnvError, match=r"evaluator.dpg_bench_official.questions=\S+none.csv: \S+ does not "
                                               "exist"):
        dpg_official(tmp_path, questions=str(tmp_path / "none.csv")).check()


def test_the_script_does_not_see_the_harness_python_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script runs in its environment, not on the harness's PYTHONPATH."""
    samples = sample_set(tmp_path / "samples", GENEVAL_PROMPTS, per_prompt=1)
    repo = geneval_repo(tmp_path)
    probe = textwrap.dedent('''
        import os, sys
        assert "PYTHONPATH" not in os.environ, os.environ["PYTHONPATH"]
        assert os.getcwd() == os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ''')
    script = repo / "evaluation" / "evaluate_images.py"
    script.write_text(probe + script.read_text())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "harness-packages"), *sys.path]))
    result = geneval_official(tmp_path).evaluate(samples)
    assert len(result.per_sample) == 3


def test_geneval_official_rows_reach_summary_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job with evaluator=[speed,geneval_official] writes the GenEval rows under the official
    evaluator's name (and the gap to raster from its verdicts), with the checkout's commit in
    evaluator_version."""
    from tests.test_bad_inputs import outcome

    geneval_repo(tmp_path)
    (tmp_path / "clip").mkdir()
    (tmp_path / "clip" / CLIP_FILE.name).write_bytes(b"stand-in")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": p.id.split("/")[1], **p.meta}) + "\n" for p in GENEVAL_PROMPTS))
    status, err = outcome(tmp_path, [
        "dataset=prompt_file", f"dataset.path={prompts}", "decoder=[raster]", "images_per_prompt=2",
        "evaluator=[speed,geneval_official]",
        f"evaluator.geneval_official.env_python={standin_env(tmp_path / 'env', GENEVAL_MODULES)}",
        f"evaluator.geneval_official.clip_dir={tmp_path / 'clip'}", f"evaluator.geneval_official.repo={tmp_path / 'geneval'}",
        f"evaluator.geneval_official.model_path={tmp_path / 'detector'}", "evaluator.geneval_official.commit=standin0",
    ], capsys)
    assert status == 0, err
    summary = pd.read_csv(tmp_path / "run" / "summary.csv")
    rows = summary[summary["evaluator"] == "geneval_official"]
    assert set(rows["metric"]) == {"geneval", "geneval_images", "geneval_prompts", "geneval_gap_vs_raster"}
    assert set(rows["evaluator_version"]) == {f"geneval-official@standin0/{DETECTOR}"}
    per_sample = pd.read_csv(tmp_path / "run" / "per_sample" / "raster" / "geneval_official.csv")
    assert len(per_sample) == 6 and set(per_sample["tag"]) == {"single_object", "two_object", "counting"}
