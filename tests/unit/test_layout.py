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
