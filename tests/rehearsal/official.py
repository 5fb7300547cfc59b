"""The official evaluators' environments as the rehearsal meets them: stand-ins built where
`python -m evaluators.official_build` builds the real ones (`$MULO_BENCH_CACHE/official/<name>`: `env/`, a Python
environment of its own; `repo/`, the official script paths), so that the README's commands run with
no option added; and the files those scripts read, served by the rehearsal's mirror (GenEval's
detector and CLIP file under their official URLs, mPLUG in ModelScope's layout), which `stages=[fetch]`
must bring.

The stand-in scripts are those of tests/test_official_env.py (the official formats in and out),
each first asserting that the file the real script would read is where it reads it: `ViT-L-14.pt` in
`~/.cache/clip` (open_clip 2.20), the detector in `--model-path`, and for ELLA's script the model
folder `damo/mplug_visual-question-answering_coco_large_en` relative to its working directory (where
ModelScope then loads it without the network). The stand-in environment's `modelscope` fetches from
`http://$MODELSCOPE_DOMAIN/<model id>/` as the real client's mirror setting would."""
from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path

from evaluators.dpg_bench_official import MPLUG_MODEL
from evaluators.geneval_official import CLIP_FILE, DETECTOR, DETECTOR_URL
from tests.official_envs import DPG_MODULES, GENEVAL_MODULES, standin_env
from tests.test_official_env import (DPG_SCRIPT, GENEVAL_EVALUATE, GENEVAL_SUMMARY, fabricated_answer,
                                     fabricated_verdict)

CLIP_BYTES = b"a stand-in of OpenAI's ViT-L-14.pt"
CLIP_SHA256 = hashlib.sha256(CLIP_BYTES).hexdigest()  # the rehearsal's pin (evaluator.geneval_official.clip_sha256)
MPLUG_FILES = {"configuration.json": b'{"framework": "pytorch", "task": "visual-question-answering"}',
               "pytorch_model.bin": b"a stand-in of mPLUG's weights"}

_GENEVAL_READS = '''import os
assert os.path.isfile(os.path.expanduser("~/.cache/clip/ViT-L-14.pt")), "open_clip 2.20 would download ViT-L-14.pt"
'''
_DPG_READS = '''import os
assert os.path.isfile("{model}/configuration.json"), ("ModelScope would look {model} up online", os.getcwd())
assert os.environ["MODELSCOPE_CACHE"] == os.getcwd(), os.environ.get("MODELSCOPE_CACHE")
'''.format(model=MPLUG_MODEL)

# the stand-in modelscope client of DPG-Bench's environment: its snapshot_download and listing
_SNAPSHOT = '''import json, os, urllib.request


def _base(model_id):
    return f"http://{os.environ['MODELSCOPE_DOMAIN']}/{model_id}"


def snapshot_download(model_id, cache_dir=None, **kwargs):
    cache = cache_dir or os.environ["MODELSCOPE_CACHE"]
    folder = os.path.join(cache, model_id)
    os.makedirs(folder, exist_ok=True)
    with urllib.request.urlopen(_base(model_id) + "/files.json") as response:
        files = json.load(response)
    for entry in files:
        with urllib.request.urlopen(_base(model_id) + "/" + entry["Path"]) as response:
            data = response.read()
        with open(os.path.join(folder, entry["Path"]), "wb") as out:
            out.write(data)
    return folder
'''
_API = '''import json, urllib.request
from modelscope.hub.snapshot_download import _base


class HubApi:
    def get_model_files(self, model_id, recursive=False, **kwargs):
        with urllib.request.urlopen(_base(model_id) + "/files.json") as response:
            return json.load(response)
'''


def serve_files(mirror: Path) -> dict[str, str]:
    """Place the files the official scripts read in the mirror (`<host>/<path>` of their URLs; mPLUG
    under `modelscope/<model id>/` with its listing `files.json`); returns the URL -> sha256 of the
    stand-ins served for pinned files (the detector; the CLIP file's pin is an evaluator option)."""
    detector = b"a stand-in of GenEval's mmdet 2.x checkpoint"
    for url, data in ((DETECTOR_URL, detector), (CLIP_FILE.url, CLIP_BYTES)):
        target = mirror / url.split("://", 1)[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    folder = mirror / "modelscope" / MPLUG_MODEL
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in MPLUG_FILES.items():
        (folder / name).write_bytes(data)
    listing = [{"Path": name, "Size": len(data), "Type": "blob"} for name, data in MPLUG_FILES.items()]
    (folder / "files.json").write_text(json.dumps(listing))
    return {DETECTOR_URL: hashlib.sha256(detector).hexdigest()}


def build_homes(cache: Path) -> None:
    """The stand-in official environments and checkouts in `<cache>/official/<name>` (as
    `python -m evaluators.official_build` lays them out; not git checkouts: the configured commit is recorded)."""
    home = cache / "official" / "geneval"
    standin_env(home / "env", GENEVAL_MODULES)
    evaluation = home / "repo" / "evaluation"
    evaluation.mkdir(parents=True, exist_ok=True)
    script = GENEVAL_EVALUATE.format(mode="ok", verdict=inspect.getsource(fabricated_verdict), detector=DETECTOR)
    (evaluation / "evaluate_images.py").write_text(_GENEVAL_READS + script)
    (evaluation / "summary_scores.py").write_text(GENEVAL_SUMMARY)
    (evaluation / "object_names.txt").write_text("person\nbicycle\ncar\n")
    home = cache / "official" / "dpg_bench"
    standin_env(home / "env", DPG_MODULES, {"modelscope/hub/snapshot_download.py": _SNAPSHOT,
                                            "modelscope/hub/api.py": _API})
    folder = home / "repo" / "dpg_bench"
    folder.mkdir(parents=True, exist_ok=True)
    script = DPG_SCRIPT.format(mode="ok", answer=inspect.getsource(fabricated_answer))
    (folder / "compute_dpg_bench.py").write_text(_DPG_READS + script)
