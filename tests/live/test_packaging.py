"""A non-editable `pip install .` serves the page: static/ and templates/ travel inside the app
package, and the app finds them there rather than beside the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SERVE_FROM_INSTALL = """
import app
from app import create_app
flask_app = create_app({"MODEL": "fake"})
client = flask_app.test_client()
page, script = client.get("/"), client.get("/static/js/main.js")
print(app.__file__, flask_app.static_folder, page.status_code, script.status_code, sep="\\n")
flask_app.extensions["kvscope_engine"].shutdown()
"""


def test_a_built_wheel_installs_and_serves_the_page(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next((tmp_path / "dist").glob("kvscope-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"app/static/js/main.js", "app/static/data/kv_golden.json", "app/templates/index.html"} <= names
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # Run from an empty folder with the installed copy first on the path, so the checkout is not used.
    done = subprocess.run(
        [sys.executable, "-c", SERVE_FROM_INSTALL],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    module_file, static_folder, page_status, script_status = done.stdout.split()[-4:]
    assert module_file.startswith(str(target)) and static_folder.startswith(str(target))
    assert (page_status, script_status) == ("200", "200")
