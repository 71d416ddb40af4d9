"""`kvscope serve --class` as a teacher starts it (every interface, join and teacher URLs, one warning
line, the key kept out of the log) and `kvscope class-sim` against a fake-model server: every
simulated student's request ends with exactly one terminal event."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from kvscope_testkit import ROOT, TESTS, LiveServer, free_port, wait_until

pytestmark = pytest.mark.live

KEY = "class-cli-key-7Hq2"


def post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


@pytest.fixture(scope="module")
def class_server(tmp_path_factory):
    """`kvscope serve --class --model fake` with no --host, as a teacher types it."""
    port = free_port()
    out, err = (tmp_path_factory.mktemp("class") / name for name in ("stdout", "stderr"))
    env = {**os.environ, "KVSCOPE_TEACHER_KEY": KEY, "PYTHONUNBUFFERED": "1"}
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvscope.cli", "serve", "--class", "--port", str(port), "--model", "fake"],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    base = f"http://127.0.0.1:{port}"

    def ready():
        try:
            with urllib.request.urlopen(base + "/api/model", timeout=2) as r:
                return json.load(r)["status"] == "ready"
        except OSError:
            return proc.poll() is not None  # ends the wait; the assert below says why

    try:
        wait_until(ready, "the class server to load the fake model", timeout=120, every=0.3)
        assert proc.poll() is None, err.read_text()
        yield proc, port, base, out, err
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_class_prints_the_join_and_teacher_urls_and_one_warning(class_server):
    _, port, base, out, err = class_server
    printed = out.read_text()
    join = re.search(rf"students open (http://(\S+):{port}/)", printed)
    teacher = re.search(rf"teacher view .*: (http://\S+:{port}/class\?key=(\S+))", printed)
    assert join and teacher, printed
    assert teacher.group(1).startswith(join.group(1)) and teacher.group(2) == KEY
    lines = (printed + err.read_text()).splitlines()
    who = [line for line in lines if "can now use the model" in line]
    assert len(who) == 1 and f":{port}" in who[0], lines  # one line says who can reach the model now
    assert not [line for line in lines if "WARNING: listening on" in line]  # not the plain LAN warning too
    with urllib.request.urlopen(base + "/api/class", timeout=30) as r:
        state = json.load(r)
    assert state["class_mode"] is True and state["join_url"] == join.group(1) and state["teacher"] is False


def test_serve_class_starts_with_the_class_policy_says_so_and_the_teacher_can_turn_it_off(class_server):
    _, _, base, out, _ = class_server
    line = next(line for line in out.read_text().splitlines() if "class policy:" in line)
    assert "chunked prefill (64 tokens), prefix caching on" in line and "--no-prefix-caching" in line
    with urllib.request.urlopen(base + "/api/class", timeout=30) as r:
        policy = json.load(r)["policy"]
    assert (policy["chunked_prefill"], policy["chunk_size"], policy["prefix_caching"]) == (True, 64, True)
    for change in ({"prefix_caching": False}, {"chunked_prefill": False}):
        status, body = post(base + "/api/class/policy", change, {"X-Teacher-Key": KEY})
        assert status == 200 and body["policy"] == {**body["policy"], **change}
    status, body = post(
        base + "/api/class/policy", {"chunked_prefill": True, "prefix_caching": True}, {"X-Teacher-Key": KEY}
    )
    assert status == 200 and body["policy"]["chunked_prefill"] and body["policy"]["prefix_caching"]


def test_serve_class_listens_on_every_interface_and_answers_its_lan_name(class_server):
    _, port, _, out, _ = class_server
    lan = re.search(rf"students open http://(\S+):{port}/", out.read_text()).group(1)
    with urllib.request.urlopen(f"http://{lan}:{port}/api/class", timeout=30) as r:  # not only loopback
        assert r.status == 200


def test_teacher_controls_need_the_key_and_the_key_stays_out_of_the_log(class_server):
    _, _, base, out, err = class_server
    status, body = post(base + "/api/class/settings", {"paused": True})
    assert status == 403 and body["error"]["code"] == "teacher_only"
    status, body = post(base + "/api/class/settings", {"per_laptop_cap": 3}, {"X-Teacher-Key": KEY})
    assert status == 200 and body["settings"]["per_laptop_cap"] == 3
    no_redirect = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as answer:
        no_redirect.open(f"{base}/class?key={KEY}", timeout=30)
    assert answer.value.code == 303 and answer.value.headers["Location"].endswith("/class")
    assert "kvscope_teacher=" in answer.value.headers["Set-Cookie"]
    logged = out.read_text() + err.read_text()
    assert logged.count(KEY) == 1, "only the printed teacher URL may hold the key"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_class_sim_against_a_fake_model_server_ends_every_request_exactly_once(tmp_path):
    server = LiveServer("fake:delay=5", args=["--class"])
    try:
        server.wait_ready(120)
        report = tmp_path / "summary.json"
        pythonpath = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
        result = subprocess.run(
            [sys.executable, "-m", "kvscope.cli", "class-sim", "--url", server.url, "--students", "6"]
            + ["--minutes", "0.12", "--seed", "3", "--short", "--json", str(report)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": pythonpath},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(report.read_text())
    assert summary["ok"] and summary["terminal_violations"] == 0 and summary["connect_failures"] == 0
    assert summary["requests"] >= 6 and summary["finished"] > 0
    assert summary["finished"] + summary["cancelled"] + sum(summary["errors"].values()) == summary["requests"]
    assert summary["class_stats_seen"] >= 1 and summary["feed_events"] > summary["requests"]
    assert "one terminal event each: yes" in result.stdout


@pytest.mark.parametrize(
    "args, words",
    [(["--students", "0"], "--students must be between 1 and 200"), (["--minutes", "90"], "--minutes must be between")],
)
def test_class_sim_refuses_bad_sizes_in_one_line(args, words):
    result = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "class-sim", "--url", "http://127.0.0.1:9", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
