"""The floor plan holds: each layer imports only the layers below it. From the top: the `kvscope`
command line; the web app (`app`) and the benchmarks (`bench`), siblings that never import each other;
the serving chapter's experiments; the engine (`model_runner`), in which what both engines share sits
below the local and the remote engine; and at the bottom the page's formulas (`formulas`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A package (or sub-package) → the modules it must not import, by prefix.
FORBIDDEN = {
    "formulas": {"model_runner", "serving_experiments", "app", "bench", "kvscope", "torch"},
    "model_runner": {"serving_experiments", "app", "bench", "kvscope"},
    "model_runner/shared": {"model_runner.local", "model_runner.remote", "model_runner.loading"},
    "model_runner/remote": {"model_runner.local"},
    "serving_experiments": {"app", "bench", "kvscope"},
    "bench": {"app", "kvscope"},
    "app": {"bench", "kvscope"},
}


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every absolute import in a module, wherever it sits (late imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def breaks(name: str, forbidden: set[str]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_each_layer_imports_only_the_layers_below_it(package):
    offenders = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in imported_modules(path)
        if breaks(name, FORBIDDEN[package])
    }
    assert not offenders, sorted(offenders)


def test_the_checker_sees_late_imports_and_sub_packages(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from app.openai import routes\n    import bench.runner\n")
    names = imported_modules(module)
    assert {"app.openai", "app.openai.routes", "bench.runner"} <= names
    assert breaks("app.openai.routes", {"app"}) and not breaks("application", {"app"})


def test_the_old_floor_plan_would_fail(tmp_path):
    # The command line inside the app (it imported bench) and the remote engine reaching into the local
    # one (the scheduler's Policy) are what this layout moved away from.
    cli = tmp_path / "cli.py"
    cli.write_text("from bench.runner import add_parser\n")
    remote = tmp_path / "engine.py"
    remote.write_text(
        "from model_runner.core.scheduler import Policy\nfrom model_runner.local.scheduler import Policy\n"
    )
    assert any(breaks(n, FORBIDDEN["app"]) for n in imported_modules(cli))
    assert any(breaks(n, FORBIDDEN["model_runner/remote"]) for n in imported_modules(remote))


def test_serving_and_walkthrough_scripts_do_not_import_each_other():
    # What both parts of the page use lives in static/js/shared/.
    offenders = []
    for part, other in (("serving", "walkthrough"), ("walkthrough", "serving")):
        for path in sorted((ROOT / "static/js" / part).glob("*.js")):
            if f"'../{other}/" in path.read_text(encoding="utf-8"):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_the_architecture_page_names_every_module():
    section = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")
    packages = ("kvscope", "app", "bench", "formulas", "model_runner", "serving_experiments", "scripts")
    modules = [path for package in packages for path in (ROOT / package).rglob("*.py")]
    modules += list((ROOT / "static/js").rglob("*.js"))
    missing = sorted(str(path.relative_to(ROOT)) for path in modules if f"`{path.name}`" not in section)
    assert not missing, f"docs/architecture.md does not name: {missing}"


def app_room(path: Path) -> str | None:
    """The feature room an app module belongs to: a door's module (one that defines a Blueprint) is its
    own room at the top of app/, its sub-package's room below it; None for the shared floor and the factory."""
    relative = path.relative_to(ROOT / "app")
    if len(relative.parts) > 1:
        return "app." + relative.parts[0]
    return f"app.{path.stem}" if "Blueprint(" in path.read_text(encoding="utf-8") else None


def test_no_app_room_imports_another_room():
    # Every door (api, pages, metrics, experiments, ws/, classroom/, openai/) stands on the shared floor
    # (engine_ext, errors, protocol, security, outcomes, model_names) and borrows nothing from another door.
    modules = sorted((ROOT / "app").rglob("*.py"))
    rooms = {room for room in map(app_room, modules) if room is not None}
    assert {"app.api", "app.ws", "app.openai", "app.classroom", "app.metrics"} <= rooms
    offenders = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in modules
        if path != ROOT / "app/__init__.py"  # the factory registers every door
        for name in imported_modules(path)
        for room in rooms - {app_room(path)}
        if breaks(name, {room})
    }
    assert not offenders, sorted(offenders)


# ---- the local engine's floors and every module's length ----------------------------------------------

MAX_LOCAL_FLOORS = (
    4  # the engine loop on top; step/ and model/ below it; the scheduler, pool and contract at the bottom
)
MAX_LINES = 400
CODE = ("kvscope", "app", "bench", "formulas", "model_runner", "serving_experiments", "scripts")


def floors(folder: Path, package: str) -> dict[str, int]:
    """Each module under `folder` (dotted under `package`) → its floor in the import graph among them: 1 when it
    imports none of them, else one above the highest it imports (a package's __init__ counts as no floor)."""
    paths = {
        ".".join((package, *path.relative_to(folder).with_suffix("").parts)): path
        for path in sorted(folder.rglob("*.py"))
        if path.name != "__init__.py"
    }
    arrows = {name: {n for n in imported_modules(path) if n in paths and n != name} for name, path in paths.items()}
    found: dict[str, int] = {}

    def floor_of(name: str, climbing: tuple[str, ...] = ()) -> int:
        assert name not in climbing, f"an import cycle: {' → '.join((*climbing, name))}"
        if name not in found:
            found[name] = 1 + max((floor_of(n, (*climbing, name)) for n in arrows[name]), default=0)
        return found[name]

    for name in paths:
        floor_of(name)
    return found


def test_the_local_engine_has_at_most_four_floors():
    found = floors(ROOT / "model_runner/local", "model_runner.local")
    assert found["model_runner.local.engine"] == max(found.values()), "the engine loop sits on top"
    too_high = {name: floor for name, floor in found.items() if floor > MAX_LOCAL_FLOORS}
    assert not too_high, too_high


def long_modules(root: Path, packages: tuple[str, ...]) -> dict[str, int]:
    """Every module of `packages` under `root` longer than MAX_LINES → its length in lines."""
    return {
        str(path.relative_to(root)): lines
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }


def test_no_module_is_longer_than_400_lines():
    assert not long_modules(ROOT, CODE)


def test_the_old_local_tower_and_a_long_module_would_fail(tmp_path):
    # local/ was one flat folder nine floors tall (engine → runner → forward → graphs → static_step → decoders →
    # native → invariant → scheduler), and engine.py grew to 422 lines.
    tower = ["engine", "runner", "forward", "graphs", "static_step", "decoders", "native", "invariant", "scheduler"]
    for upper, lower in zip(tower, tower[1:] + [None]):
        (tmp_path / f"{upper}.py").write_text(f"from old.local.{lower} import x\n" if lower else "x = 1\n")
    found = floors(tmp_path, "old.local")
    assert found["old.local.engine"] == 9 > MAX_LOCAL_FLOORS
    (tmp_path / "local").mkdir()
    (tmp_path / "local/engine.py").write_text("x = 1\n" * 422)
    (tmp_path / "local/config.py").write_text("x = 1\n" * MAX_LINES)
    assert long_modules(tmp_path, ("local",)) == {"local/engine.py": 422}


def test_the_app_probes_no_engine_with_hasattr():
    # Every member a door calls is declared on the engine's interface (model_runner/interface.py): the built-in
    # engine's own controls through `engine.local`, None on a remote one; nothing is found by probing.
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted((ROOT / "app").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hasattr"
    ]
    assert not offenders, offenders
