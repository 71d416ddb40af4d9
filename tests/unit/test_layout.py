"""The architecture holds: the engine package imports neither the web app nor the benchmark, and
the benchmark does not import the web app (the `kvscope` command in app/cli.py sits on top)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "model_runner": {"app", "bench", "serving_experiments"},
    "serving_experiments": {"app", "bench"},
    "bench": {"app"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in a module, wherever it sits (late imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(package):
    offenders = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in imported_packages(path) & FORBIDDEN[package]
    }
    assert not offenders, sorted(offenders)


def test_the_checker_sees_late_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from app.cli import main\n    import bench.runner\n")
    assert imported_packages(module) == {"app", "bench"}


def test_the_readme_names_every_module_in_what_runs_where():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## What runs where") : readme.index("## Tests")]
    modules = [
        path
        for package in ("app", "bench", "model_runner", "serving_experiments", "scripts")
        for path in (ROOT / package).rglob("*.py")
    ]
    modules += [path for path in (ROOT / "static/js/shared").glob("*.js")]
    missing = sorted(str(path.relative_to(ROOT)) for path in modules if f"`{path.name}`" not in section)
    assert not missing, f"README's 'What runs where' does not name: {missing}"
