"""`kvscope serve`: one-line errors for bad arguments, and a real gunicorn server on the chosen port."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from urllib.parse import urlsplit

import pytest


def serve(*args):
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "serve", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "./no/such/model"], "no such file or folder"),
        (["--device", "tpu"], "--device must be auto, cuda, mps or cpu"),
        (["--dtype", "float8"], "--dtype must be auto, float32, bfloat16 or float16"),
    ],
)
def test_bad_arguments_give_one_line_that_says_what_to_do(args, words):
    result = serve(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr


def test_a_folder_without_a_chat_template_is_refused(tmp_path):
    result = serve("--model", str(tmp_path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1


def test_server_answers_at_the_address_it_prints_on_the_chosen_port_under_gunicorn(fake_server):
    # The address comes from what `kvscope serve` printed, not from the port the test chose: a server
    # that printed or bound another port fails here.
    printed = fake_server.announced_url()
    assert urlsplit(printed).port == fake_server.port, printed
    with urllib.request.urlopen(printed + "/", timeout=30) as r:
        assert r.status == 200 and r.headers["Server"].startswith("gunicorn")
        assert b"Inside a streaming answer" in r.read()
