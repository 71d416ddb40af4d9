"""One name per experiment: each serving experiment's figure module is static/js/serving/ named as the
registry names it (serving_experiments/registry.py, `_` written `-`), the chapter imports it under that name,
and its stage's panel runs that experiment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from serving_experiments.registry import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
SERVING = ROOT / "static/js/serving"
INDEX = (SERVING / "index.js").read_text(encoding="utf-8")
TEMPLATE = (ROOT / "templates/_serving.html").read_text(encoding="utf-8")

pytestmark = pytest.mark.unit


def module_of(name: str) -> str:
    return name.replace("_", "-") + ".js"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_each_experiment_has_a_figure_module_of_its_own_name(name):
    assert (SERVING / module_of(name)).is_file(), module_of(name)


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n != "batch_invariance"])
def test_the_chapter_mounts_each_stage_with_the_module_of_its_experiment(name):
    """A stage panel names its experiment (data-experiment); index.js's MODULES gives that panel the module
    named for it."""
    panel = re.search(rf'data-panel="([\w-]+)"[^>]*data-experiment="{name}"', TEMPLATE)
    assert panel, f"no panel runs {name}"
    imported = re.search(rf"import \* as (\w+) from '\./{re.escape(module_of(name))}';", INDEX)
    assert imported, f"index.js does not import {module_of(name)}"
    modules = re.search(r"const MODULES = \{(.*?)\};", INDEX, re.DOTALL).group(1)
    entries = dict(re.findall(r"'?([\w-]+)'?(?:: (\w+))?,?", modules.replace("\n", " ")))
    stage = panel.group(1)
    assert (entries.get(stage) or stage) == imported.group(1), (stage, entries)


def test_the_invariance_section_is_mounted_from_its_own_module():
    assert "import * as invariance from './batch-invariance.js';" in INDEX
