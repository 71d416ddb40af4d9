"""The recorded runs the page plays before any live one (static/data/trace-example.json for the
walkthrough, static/data/serving-trace.json for the serving chapter) each name the route they ran on
(weights dtype, quantization), the machine and its load; the route is the one `--dtype auto` picks on the
machine that recorded it, and the one the page names for that run (its `data-recorded-route` markers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from model_runner.loading.routes import fast_route_for
from model_runner.protocol.trace import ROUTE_FIELDS

ROOT = Path(__file__).resolve().parents[2]
TRACES = {"trace-example": "static/data/trace-example.json", "serving-trace": "static/data/serving-trace.json"}
# The page names a recorded run's route where it describes that run, e.g.
# <span data-recorded-route="trace-example:int4">int4</span>: the trace's file name, then the route.
MARKER = re.compile(r'data-recorded-route="([\w-]+):(\w+)"')


def recorded(name: str) -> dict:
    return json.loads((ROOT / TRACES[name]).read_text(encoding="utf-8"))


def route_of(name: str) -> str:
    return recorded(name)["recorded_on"]["route"]["dtype_route"]


@pytest.mark.parametrize("name", TRACES)
def test_each_recorded_run_names_its_route_machine_and_load(name):
    on = recorded(name)["recorded_on"]
    assert set(on["route"]) == set(ROUTE_FIELDS) and all(on["route"][k] for k in ("dtype_route", "weights_dtype"))
    assert on["route"]["quantization"] == "none" or on["route"]["dtype_route"] in on["route"]["quantization"]
    assert on["cpu_capability"] and on["cpus"] >= 1 and on["machine"]
    assert re.search(r"load average: [\d.]+, [\d.]+, [\d.]+", on["uptime"])  # the `uptime` line, as it printed


@pytest.mark.parametrize("name", TRACES)
def test_the_route_is_what_auto_picks_on_the_machine_that_recorded_it(name):
    on = recorded(name)["recorded_on"]
    assert on["route"]["dtype_route"] == (fast_route_for(on["cpu_capability"]) or "float32")


def test_the_walkthrough_runs_route_is_its_models():
    trace = recorded("trace-example")
    assert trace["recorded_on"]["route"] == {k: trace["model"][k] for k in ROUTE_FIELDS}


def test_the_serving_runs_route_is_named_with_its_model_and_in_every_answer():
    trace = recorded("serving-trace")
    route = route_of("serving-trace")
    assert trace["recorded_on"]["model"].endswith(f", {route}")
    assert {body["machine"]["route"] for body in trace["experiments"].values()} == {route}


def test_the_page_names_each_recorded_runs_route():
    pages = [*sorted((ROOT / "templates").glob("*.html")), *sorted((ROOT / "static/js").rglob("*.js"))]
    named: dict[str, set[str]] = {}
    for page in pages:
        for trace, route in MARKER.findall(page.read_text(encoding="utf-8")):
            named.setdefault(trace, set()).add(route)
    expected = {name: {route_of(name)} for name in TRACES}
    assert named == expected, (
        f"the page names {named or 'no route'} for its recorded runs; the traces ran on {expected} "
        '(mark the text with data-recorded-route="<trace>:<route>")'
    )
