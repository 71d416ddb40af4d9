"""tests/clients/run_clients.py runs each client in another working folder (lm-eval's task folder,
artifacts/clients), so the clients' venv it is given must be anchored at the caller's folder first:
`make test-clients` passes `.venv-clients/bin/python` relative, as a fresh clone would."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[1] / "clients" / "run_clients.py"


def load_runner():
    spec = importlib.util.spec_from_file_location("run_clients", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_clients_venv(root: Path) -> None:
    """A venv's shape: bin/python a symlink to the system python, a console script beside it."""
    bin_dir = root / ".venv-clients" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    script = bin_dir / "lm_eval"
    script.write_text('#!/bin/sh\necho ran-from "$PWD"\n')
    script.chmod(0o755)


def test_a_relative_clients_python_is_anchored_at_the_callers_folder(tmp_path, monkeypatch):
    fake_clients_venv(tmp_path)
    monkeypatch.chdir(tmp_path)
    bin_dir = load_runner().client_bin_dir(".venv-clients/bin/python")
    assert bin_dir == tmp_path / ".venv-clients" / "bin"
    assert bin_dir.is_absolute()


def test_the_venv_folder_is_kept_not_the_symlinked_system_pythons(tmp_path, monkeypatch):
    fake_clients_venv(tmp_path)
    monkeypatch.chdir(tmp_path)
    bin_dir = load_runner().client_bin_dir(str(tmp_path / ".venv-clients" / "bin" / "python"))
    assert (bin_dir / "lm_eval").exists(), "resolving the symlink would point at the system python's folder"


def test_a_client_starts_from_another_working_folder(tmp_path, monkeypatch):
    fake_clients_venv(tmp_path)
    elsewhere = tmp_path / "lm_eval_tasks"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    bin_dir = load_runner().client_bin_dir(".venv-clients/bin/python")
    done = subprocess.run([str(bin_dir / "lm_eval")], cwd=elsewhere, capture_output=True, text=True, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ran-from {elsewhere}"
