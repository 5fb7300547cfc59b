"""The shape of the house (docs/layout.md): a small core, one folder per model family, the decoding
framework apart from the methods and from training, layers that import one way, no import circles
(type-level ones included), and old paths honoured for one release (harness/moved.py)."""
from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import warnings
from pathlib import Path

from harness import moved
from tests.conftest import ROOT, compose_cfg

PACKAGES = ("harness", "baselines", "evaluators")
CORE_LIMIT = 12
FAMILIES = ("llamagen", "tar", "random")


def _modules() -> dict[str, Path]:
    """{dotted module name: file} of every project module."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports at module level, under `if TYPE_CHECKING:` included
    (imports inside functions are deliberate late imports and left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return {t for t in targets if t in modules and t != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_no_import_circles_type_level_included() -> None:
    graph = _graph()
    assert len(graph) > 100, "the walk found the project's modules"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_core_stays_small() -> None:
    core = sorted(p.stem for p in (ROOT / "harness").glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(core) <= CORE_LIMIT, core
    for folder in ("runtime", "store", "models", "report", "datasets", "shapes"):
        assert (ROOT / "harness" / folder / "__init__.py").is_file(), folder


def test_every_package_folder_opens_with_a_comment() -> None:
    for package in PACKAGES:
        for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
            if not any(folder.glob("*.py")):
                continue
            init = folder / "__init__.py"
            assert init.is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"
            assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), f"{init.relative_to(ROOT)}"


def test_layers_import_one_way() -> None:
    graph = _graph()
    for name, targets in graph.items():
        top = name.split(".")[0]
        if top == "harness":
            assert not any(t.startswith(("baselines", "evaluators")) for t in targets), name
        if name.startswith("baselines.framework"):
            assert not any(t.startswith(("baselines.methods", "baselines.training")) for t in targets), name
        if name.startswith("baselines.methods"):
            assert not any(t.startswith("baselines.training") for t in targets), name
        if name.startswith("harness.runtime") or name.startswith("harness.store"):
            assert not any(t.startswith(("harness.models", "harness.report")) or t in ("harness.run", "harness.generate")
                           for t in targets), name


def test_a_model_family_imports_no_other_family() -> None:
    graph = _graph()
    for family in FAMILIES:
        inside = f"harness.models.{family}"
        for name, targets in graph.items():
            if name == inside or name.startswith(inside + "."):
                others = [t for t in targets for f in FAMILIES
                          if f != family and (t == f"harness.models.{f}" or t.startswith(f"harness.models.{f}."))]
                assert not others, f"{name} imports {others}"


def test_moved_paths_lead_to_modules_and_the_old_files_are_gone() -> None:
    for old, new in moved.MOVED.items():
        assert importlib.util.find_spec(new) is not None, new
        old_file = ROOT / (old.replace(".", "/") + ".py")
        assert not old_file.exists() or old in ("harness.results",), old_file  # harness.results: the CLI alias
    assert moved.current("baselines.speculative.SpeculativeDecoder") == "baselines.framework.speculative.SpeculativeDecoder"
    assert moved.current("harness.models.tar.build") == "harness.models.tar.bundle.build"
    assert moved.current("harness.models.tar.bundle.build") == "harness.models.tar.bundle.build"
    assert moved.current("evaluators.fid.FIDEvaluator") == "evaluators.fid.FIDEvaluator"


def test_every_shipped_target_is_current() -> None:
    """No shipped config names an old path (they would warn on every run)."""
    for path in (ROOT / "conf").rglob("*.yaml"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if "_target_:" in line:
                target = line.split("_target_:")[1].split("#")[0].strip()
                assert moved.current(target) == target, f"{path.relative_to(ROOT)}: {target}"


def _old(tree: object) -> object:
    """`tree` with every `_target_` written under the old layout (the inverse of harness/moved.py)."""
    back = {new: old for old, new in moved.MOVED.items()}
    if isinstance(tree, list):
        return [_old(item) for item in tree]
    if not isinstance(tree, dict):
        return tree
    out = {}
    for key, value in tree.items():
        if key == "_target_" and isinstance(value, str):
            module, _, attr = value.rpartition(".")
            value = f"{back.get(module, module)}.{attr}"
        out[key] = _old(value)
    return out


def test_a_config_with_old_paths_runs_with_a_warning_and_sets_bound_before_the_move_resume(tmp_path: Path) -> None:
    from harness.run import run

    overrides = ["+experiment=smoke", "decoder=[raster,mulo_sd]", "evaluator=[speed]", "dataset_limit=2"]
    run(compose_cfg(overrides), tmp_path / "first")
    # The sets as a release before the move stored them: every target under its old path.
    old_root = tmp_path / "old"
    shutil.copytree(tmp_path / "first" / "samples", old_root)
    for binding in old_root.glob("*/binding.json"):
        binding.write_text(json.dumps(_old(json.loads(binding.read_text()))))
    assert "baselines.speculative.SpeculativeDecoder" in (old_root / "mulo_sd" / "binding.json").read_text()
    images = {p: p.stat().st_mtime_ns for p in old_root.rglob("*.png")}
    cfg = compose_cfg([*overrides, f"samples_dir={old_root}"])
    cfg.decoder.mulo_sd._target_ = "baselines.speculative.SpeculativeDecoder"  # a user's config, old path
    moved._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(cfg, tmp_path / "second")
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert any("decoder.mulo_sd._target_" in s and "baselines.framework.speculative.SpeculativeDecoder" in s
               for s in said), said
    assert {p: p.stat().st_mtime_ns for p in old_root.rglob("*.png")} == images, "resumed, nothing redrawn"


def test_a_stored_binding_never_imports_a_module_outside_the_trusted_packages() -> None:
    from harness.store.binding import signature_defaults, without_defaults

    tree = {"_target_": "tests.nonexistent_payload.run", "x": 1}
    assert without_defaults(tree) == tree
    assert signature_defaults("os.system") == {}, "outside harness, baselines, evaluators: never imported"
    assert signature_defaults("baselines.methods.pooled.PooledThresholdRule")["below"] == 0
    assert signature_defaults("json.dumps") == {}
    assert signature_defaults("json.dumps", frozenset({"json"}))["indent"] is None  # trusted: read
