"""The rehearsal of the README's GPU path, with the real download clients and real HTTP: a local model
hub and mirror on 127.0.0.1 (tests/rehearsal/hub.py) serve stand-in repositories under the official
repo ids and file names (tests/rehearsal/standins.py); `stages=[fetch]` fetches from them into empty
caches; then generate and evaluate run with the network unreachable (`unshare -n`, HF_HUB_OFFLINE=1)
and every evaluator row of the protocol must be in summary.csv.

Marked `rehearsal` (minutes; run by .ci/run with `pytest -m rehearsal`). Needs ../shared/data (the
prompt files the mirror serves, so that their pins hold), transformers (the FLAN-T5 and Qwen2
stand-ins) and `unshare -n`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT

SHARED = ROOT.parent / "shared" / "data"
pytestmark = [pytest.mark.rehearsal]

if not SHARED.is_dir():
    pytest.skip(f"{SHARED} is absent: the rehearsal serves the real prompt files", allow_module_level=True)
pytest.importorskip("transformers", reason="the FLAN-T5 / Qwen2 stand-ins load through transformers")

from tests.rehearsal import standins  # noqa: E402 - after the skips
from tests.rehearsal.hub import Hub, serve  # noqa: E402

CAN_UNSHARE = subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
MODELS = {"llamagen": "llamagen_xl_512", "tar": "tar_1.5b_512"}
# per protocol: the overrides that keep the job to a few images, and the evaluator rows it must write
PROTOCOLS = {
    "geneval": (["dataset_limit=1", "evaluator=[speed,geneval_hf]"], {"geneval_hf"}),
    "dpg_bench": (["dataset_limit=2", "evaluator.dpg_bench.vqa._target_=evaluators.dpg_vqa.HFVQA",
                   "evaluator.dpg_bench.vqa.model=Salesforce/blip-vqa-base", "evaluator.dpg_bench.verify_questions=false"],
                  {"dpg_bench"}),
    "coco5k": (["dataset_limit=2"], {"fid", "hpsv2"}),
    "latency": (["dataset_limit=1"], set()),
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Hub:
    root = tmp_path_factory.mktemp("hub")
    standins.build(root, SHARED)
    standins.question_graph(root / "dpg_bench.csv")
    server = serve(root)
    yield server
    server.shutdown()


def _env(hub: Hub, caches: Path, offline: bool) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "MULO_BENCH"))}
    env.update({
        "PYTHONPATH": f"{ROOT / 'tests' / 'rehearsal' / 'site'}{os.pathsep}{ROOT}",
        "HF_HOME": str(caches / "hf"), "MULO_BENCH_CACHE": str(caches / "mulo_bench"),
        "TORCH_HOME": str(caches / "torch"), "HF_HUB_DISABLE_XET": "1", "OMP_NUM_THREADS": "1",
        "HF_ENDPOINT": hub.url, "MULO_BENCH_MIRROR": f"{hub.url}/mirror",
        "REHEARSAL_STANDIN_PINS": str(hub.root / standins.STANDIN_PINS),
    })
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _harness(args: list[str], env: dict[str, str], cwd: Path, offline: bool = False):
    command = [sys.executable, "-m", "harness", *args]
    if offline and CAN_UNSHARE:
        command = ["unshare", "-n", *command]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def _job(family: str, protocol: str, hub: Hub, extra: list[str] = ()) -> list[str]:
    model = MODELS[family]
    args = ["+experiment=paper_main", f"model={model}", f"protocol={protocol}", *standins.OVERRIDES[model],
            *PROTOCOLS[protocol][0], "device=cpu", "threads=1", "batch_size=4", "warmup_batches=0",
            "timing.reps=1", "timing.images=1", "report=false", "require_cuda=false"]
    if protocol == "dpg_bench":
        args += [f"dataset.prompts={SHARED / 'dpg_bench' / 'prompts'}",
                 f"evaluator.dpg_bench.questions={hub.root / 'dpg_bench.csv'}"]
    if protocol != "coco5k":  # the paper's rows on one protocol; raster alone on the others
        args.append("decoder=[raster]")
    return [*args, *extra]


@pytest.mark.skipif(not CAN_UNSHARE, reason="`unshare -n` is not permitted here: the offline half needs it")
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@pytest.mark.parametrize("family", list(MODELS))
def test_rehearsal_fetch_then_offline(family: str, protocol: str, hub: Hub, tmp_path: Path) -> None:
    caches, run = tmp_path / "caches", tmp_path / "run"
    fetched = _harness([*_job(family, protocol, hub), "stages=[fetch]", f"hydra.run.dir={tmp_path / 'fetch'}"],
                       _env(hub, caches, offline=False), tmp_path)
    assert fetched.returncode == 0, fetched.stderr[-4000:]
    done = _harness([*_job(family, protocol, hub), f"hydra.run.dir={run}"], _env(hub, caches, offline=True),
                    tmp_path, offline=True)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = pd.read_csv(run / "summary.csv")
    assert PROTOCOLS[protocol][1] <= set(summary.evaluator), sorted(set(summary.evaluator))
    assert "speed" in set(summary.evaluator)
    hf = caches / "hf" / "hub"
    if family == "llamagen":  # only the files the loaders read came down
        t5 = list((hf / "models--google--flan-t5-xl").rglob("*"))
        assert {p.name for p in t5 if p.is_file() or p.is_symlink()} >= {"config.json", "model.safetensors"}
        assert not {"pytorch_model.bin", "tf_model.h5", "flax_model.msgpack"} & {p.name for p in t5}
        assert not any(p.name == "t2i_XL_stage1_512.pt" for p in hf.rglob("*"))


@pytest.mark.skipif(not CAN_UNSHARE, reason="`unshare -n` is not permitted here")
def test_rehearsal_left_out_asset_stops_before_generation(hub: Hub, tmp_path: Path) -> None:
    caches = tmp_path / "caches"
    job = _job("tar", "coco5k", hub, ["decoder=[raster]"])
    assert _harness([*job, "stages=[fetch]", f"hydra.run.dir={tmp_path / 'f'}"],
                    _env(hub, caches, False), tmp_path).returncode == 0
    blob = next((caches / "hf" / "hub" / "models--xswu--HPSv2" / "snapshots").rglob("HPS_v2.1_compressed.pt"))
    blob.unlink()  # an asset fetch did not leave behind
    res = _harness([*job, f"hydra.run.dir={tmp_path / 'run'}"], _env(hub, caches, True), tmp_path, offline=True)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "HPS_v2.1_compressed.pt" in res.stderr and "xswu/HPSv2" in res.stderr and "stages=[fetch]" in res.stderr
    assert not (tmp_path / "run" / "samples").exists()


def test_rehearsal_fetch_twice_downloads_nothing_and_resumes(hub: Hub, tmp_path: Path) -> None:
    caches, job = tmp_path / "caches", _job("llamagen", "latency", hub, ["stages=[fetch]"])
    env = _env(hub, caches, False)
    hub.truncate = {"vq_ds16_t2i.pt"}  # the connection drops half-way through one file
    try:
        cut = _harness([*job, f"hydra.run.dir={tmp_path / 'a'}"], env, tmp_path)
    finally:
        hub.truncate = set()
    assert cut.returncode == 2 and "peizesun/llamagen_t2i" in cut.stderr, cut.stderr[-3000:]
    complete = {p.name for p in (caches / "hf" / "hub").glob("models--*/snapshots/*/*")}  # fetched before the cut
    before = dict(hub.requests)
    first = _harness([*job, f"hydra.run.dir={tmp_path / 'b'}"], env, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    got = {path for path, n in hub.requests.items() if n > before.get(path, 0)}
    assert any(path.endswith("vq_ds16_t2i.pt") for path in got)  # the cut file again ...
    assert not {Path(path).name for path in got} & complete  # ... and nothing that was complete before
    served = dict(hub.requests)
    second = _harness([*job, f"hydra.run.dir={tmp_path / 'c'}"], env, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert dict(hub.requests) == served  # nothing downloaded the second time
    assert "nothing to download" in second.stdout + second.stderr


def test_rehearsal_missing_hub_file_and_unreachable_mirror_are_one_line(hub: Hub, tmp_path: Path) -> None:
    caches = tmp_path / "caches"
    repo = hub.repo("xswu/HPSv2")
    saved = tmp_path / "saved.pt"
    shutil.move(repo / "HPS_v2.1_compressed.pt", saved)
    try:
        res = _harness([*_job("tar", "coco5k", hub, ["decoder=[raster]", "stages=[fetch]"]),
                        f"hydra.run.dir={tmp_path / 'a'}"], _env(hub, caches, False), tmp_path)
    finally:
        shutil.move(saved, repo / "HPS_v2.1_compressed.pt")
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert "xswu/HPSv2" in lines[0] and "HPS_v2.1_compressed.pt" in lines[0]
    env = {**_env(hub, tmp_path / "other", False), "MULO_BENCH_MIRROR": "http://127.0.0.1:9/mirror"}
    res = _harness([*_job("tar", "coco5k", hub, ["decoder=[raster]", "stages=[fetch]"]),
                    f"hydra.run.dir={tmp_path / 'b'}"], env, tmp_path)
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-3000:]
    assert "127.0.0.1:9/mirror" in lines[0] and "mirror" in lines[0]


def test_rehearsal_official_geneval_assets_are_fetched(hub: Hub, tmp_path: Path) -> None:
    """GenEval's own detector (mmdet) cannot run here, but fetch must bring all it reads: the mmdet
    checkpoint through the mirror, object_names.txt and the ViT-L-14 colour classifier."""
    caches = tmp_path / "caches"
    res = _harness([*_job("llamagen", "geneval", hub, ["decoder=[raster]", "evaluator=[speed,geneval]",
                                                         "stages=[fetch]"]), f"hydra.run.dir={tmp_path / 'a'}"],
                   _env(hub, caches, False), tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    data = caches / "mulo_bench" / "data"
    assert (data / "geneval_object_names.txt").is_file()
    assert any(p.name.startswith("mask2former_swin-s") for p in data.iterdir())
    assert list((caches / "hf" / "hub").glob("models--timm--vit_large_patch14_clip_224.openai"))
