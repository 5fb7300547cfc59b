"""The rehearsal of the README's GPU path, with the real download clients and real HTTP: a local model
hub and mirror on 127.0.0.1 (tests/rehearsal/hub.py) serve stand-in repositories under the official
repo ids and file names (tests/rehearsal/standins.py). The README's commands run as a user types them
(tests/doc_commands.rehearsed: the GPU section's words, for each model and protocol, with the local
launcher for SLURM and two shards for eight), each followed by the overrides that shrink the models to
the stand-ins and run them on the CPU: `stages=[fetch]` into empty caches, then the sharded generate
and the evaluate stage with the network unreachable (`unshare -n`, HF_HUB_OFFLINE=1); every evaluator
row of the protocol must be in summary.csv. The official evaluators of protocol=geneval / dpg_bench
run their stand-in scripts in stand-in environments built where `python -m evaluators.official_build` builds the
real ones (tests/rehearsal/official.py).

Marked `rehearsal` (minutes; run by .ci/run with `pytest -m rehearsal`). Needs ../shared/data (the
prompt files the mirror serves, so that their pins hold), transformers (the FLAN-T5 and Qwen2
stand-ins) and `unshare -n`.
"""
from __future__ import annotations

import json
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

from tests.doc_commands import rehearsed  # noqa: E402 - after the skips
from tests.rehearsal import official, standins  # noqa: E402
from tests.rehearsal.hub import Hub, serve  # noqa: E402

CAN_UNSHARE = subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
MODELS = {"llamagen": "llamagen_xl_512", "tar": "tar_1.5b_512"}
# per protocol: the overrides that keep the job to a few images, and the evaluator rows it must write
PROTOCOLS = {
    "geneval": (["dataset_limit=1", f"++evaluator.geneval_official.clip_sha256={official.CLIP_SHA256}"],
                {"geneval_official"}),
    "dpg_bench": (["dataset_limit=2", "evaluator.dpg_bench_official.verify_questions=false",
                   "evaluator.dpg_bench_official.accelerate=false"], {"dpg_bench_official"}),
    "coco5k": (["dataset_limit=2"], {"fid", "hpsv2"}),
    "latency": (["dataset_limit=1"], set()),
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Hub:
    root = tmp_path_factory.mktemp("hub")
    standins.build(root, SHARED)
    pins = root / standins.STANDIN_PINS  # the stand-in detector's hash in place of the real one's
    pins.write_text(json.dumps({**json.loads(pins.read_text()), **official.serve_files(root / "mirror")}, indent=1))
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
        "HF_ENDPOINT": hub.url, "MULO_BENCH_MIRROR": f"{hub.url}/mirror", "HOME": str(caches / "home"),
        "MODELSCOPE_DOMAIN": f"{hub.url.split('://', 1)[1]}/mirror/modelscope",  # the modelscope client's mirror
        "REHEARSAL_STANDIN_PINS": str(hub.root / standins.STANDIN_PINS),
    })
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _harness(args: list[str], env: dict[str, str], cwd: Path, offline: bool = False, module: str = "harness"):
    command = [sys.executable, "-m", module, *args]
    if offline and CAN_UNSHARE:
        command = ["unshare", "-n", *command]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def _standin(family: str, protocol: str, hub: Hub) -> list[str]:
    """What the rehearsal adds to a README command: the stand-ins' sizes, the CPU, a few prompts."""
    args = [*standins.OVERRIDES[MODELS[family]], *PROTOCOLS[protocol][0], "device=cpu", "threads=1", "batch_size=4",
            "warmup_batches=0", "timing.reps=1", "timing.images=1", "report=false", "require_cuda=false",
            "evaluate_on_cpu=true"]
    if protocol == "dpg_bench":
        args += [f"dataset.prompts={SHARED / 'dpg_bench' / 'prompts'}",
                 f"evaluator.dpg_bench_official.questions={hub.root / 'dpg_bench.csv'}"]
    if protocol != "coco5k":  # the paper's rows on one protocol; raster alone on the others
        args.append("decoder=[raster]")
    return args


def _job(family: str, protocol: str, hub: Hub, extra: list[str] = ()) -> list[str]:
    model = MODELS[family]
    return ["+experiment=paper_main", f"model={model}", f"protocol={protocol}", *_standin(family, protocol, hub),
            *extra]


@pytest.mark.skipif(not CAN_UNSHARE, reason="`unshare -n` is not permitted here: the offline half needs it")
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
@pytest.mark.parametrize("family", list(MODELS))
def test_rehearsal_readme_steps_fetch_then_offline(family: str, protocol: str, hub: Hub, tmp_path: Path) -> None:
    caches = tmp_path / "caches"
    official.build_homes(caches / "mulo_bench")  # as `python -m evaluators.official_build <name>` would
    fetch, generate, evaluate, tables = rehearsed(MODELS[family], protocol)
    extra = _standin(family, protocol, hub)
    online, offline = _env(hub, caches, offline=False), _env(hub, caches, offline=True)
    done = _harness([*fetch.words[2:], *extra, f"hydra.run.dir={tmp_path / 'fetch'}"], online, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    done = _harness([*generate.words[2:], *extra], offline, tmp_path, offline=True)  # the shards, one after the other
    assert done.returncode == 0, done.stderr[-4000:]
    done = _harness([*evaluate.words[2:], *extra], offline, tmp_path, offline=True)
    assert done.returncode == 0, done.stderr[-4000:]
    found = list((tmp_path / "results" / "paper_main").glob("*/summary.csv"))  # the evaluate job's run folder
    assert len(found) == 1, found
    summary = pd.read_csv(found[0])
    assert PROTOCOLS[protocol][1] <= set(summary.evaluator), sorted(set(summary.evaluator))
    assert "speed" in set(summary.evaluator)
    if protocol in ("geneval", "dpg_bench"):  # scored by the official scripts at their pinned commits
        versions = set(summary[summary.evaluator == f"{protocol}_official"].evaluator_version.astype(str))
        assert versions and all(("@af4902f" in v or "@3c228f1" in v) for v in versions), versions
    if (family, protocol) == ("tar", "geneval"):  # the README's own pair: its step 4 as well
        done = _harness(tables.words[2:], offline, tmp_path, offline=True, module="harness.tables")
        assert done.returncode == 0, done.stderr[-4000:]
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


@pytest.mark.skipif(not CAN_UNSHARE, reason="`unshare -n` is not permitted here: the offline half needs it")
def test_rehearsal_sr_network_is_fetched_then_found_offline(hub: Hub, tmp_path: Path) -> None:
    """MuLo-SD's default up-sampler on a real model reads the pinned Real-ESRGAN network of its ratio
    (x2 here): `stages=[fetch]` brings it through the mirror, the offline generate reads it (its
    SampleSet bound to kind sr), and without it the offline job stops before generating, naming it."""
    from baselines.methods.sr_upsampler import REALESRGAN

    caches, pin = tmp_path / "caches", REALESRGAN[2]
    job = _job("llamagen", "coco5k", hub, ["decoder=[raster,mulo_sd]", "evaluator=[speed]"])
    done = _harness([*job, "stages=[fetch]", f"hydra.run.dir={tmp_path / 'f'}"], _env(hub, caches, False), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (caches / "mulo_bench" / "data" / pin.name).is_file()
    assert not (caches / "mulo_bench" / "data" / REALESRGAN[4].name).exists()  # only the network of r
    offline = _env(hub, caches, True)
    done = _harness([*job, "stages=[generate]", f"hydra.run.dir={tmp_path / 'g'}"], offline, tmp_path, offline=True)
    assert done.returncode == 0, done.stderr[-3000:]
    bound = json.loads((tmp_path / "g" / "samples" / "mulo_sd" / "binding.json").read_text())
    upsampler = bound["decoder"]["draft"]["upsampler"]
    assert (upsampler["kind"], upsampler["network"]) == ("sr", "realesrgan")
    (caches / "mulo_bench" / "data" / pin.name).unlink()
    res = _harness([*job, "stages=[generate]", f"hydra.run.dir={tmp_path / 'h'}"], offline, tmp_path, offline=True)
    assert res.returncode == 2, res.stderr[-3000:]
    assert pin.name in res.stderr and "stages=[fetch]" in res.stderr
    assert not (tmp_path / "h" / "samples").exists()
