"""The prepared GPU check (scripts/gpu_check.py) as CI can run it: `gpu_check.py cpu`, a dry run with tiny
counts on the test model, serves the product under gunicorn, drives it over /ws, /v1 and a short
class-sim, runs the padded decode step against the eager one, and writes one JSON report whose every
check passed. On a GPU machine the same script measures the figures docs/performance.md asks for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_checks_cpu_dry_run_passes_and_writes_its_report(tmp_path):
    out = tmp_path / "gpu-check.json"
    run = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "cpu", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["checks"] and all(report["checks"].values()), report["checks"]
    modes = {r["cuda_graphs"]: r for r in report["speed"]}
    assert modes["padded"]["decode"]["mode"] == "padded" and modes["padded"]["decode"]["static_steps"] > 0
    assert modes["off"]["decode"]["mode"] == "eager"
    assert report["served"]["v1"]["completion_tokens"] > 0 and report["served"]["class_sim"]["students"] == 3
    assert report["environment"]["commit"] and "GPU check on" in run.stdout
