"""The one conftest: tier markers by folder, and every shared fixture, built from kvscope_testkit.

Contract:
- Tiers are folders: unit/ (in-process, seconds, no Chromium or real model), live/ (gunicorn and a
  real client), browser/ (Chromium), model/ (the real default model), reliability/ (misbehaving
  clients and faults). Each test is marked with its folder's name; besides, a test using Playwright
  is marked `browser` and one using the real model is marked `model`, wherever it sits, so
  `-m 'not browser and not model'` never starts Chromium or loads the real model.
- Servers: `live_server(model="fake", env=None, args=())` returns a ready LiveServer (`.url`,
  `.ws_url`, `.port`, `.log()`), one per config for the whole session. `fake_server`, `real_server`
  and `slow_server` are named configs of it. `inprocess_server(engine, **config)` wraps an engine
  the test holds; stopped after the test.
- Engines: `shared_engine(model="fake", **config)` gives one ready engine per config for the session
  (`fake_engine`, `real_engine`); `engine_factory(model="fake", **config)` gives a fresh one that
  the test may break, shut down after the test.
- Browsers: Debian's Chromium; `console_errors` collects the page's console and page errors except
  those named by `ignored_console_errors`, which a module may override.
- `figures`: case number → what a reliability case measured, written to
  artifacts/reliability-figures.json at the end of the session (quoted in docs/reliability.md).
"""

from __future__ import annotations

import fcntl
import functools
import http.server
import json
import threading
from pathlib import Path

import pytest
from kvscope_testkit import (
    ARTIFACTS,
    CHROMIUM,
    InProcessServer,
    LiveServer,
    Pool,
    slow_server_env,
    start_engine,
    start_live_server,
    stop_engine,
)

TESTS = Path(__file__).resolve().parent
# One numeric configuration per process, set at session start before any fixture (tests/numeric_config.py).
pytest_plugins = ["numeric_config"]
TIERS = ("unit", "live", "browser", "model", "reliability", "remote", "vllm")  # remote, vllm: their own make targets
# A test that uses one of these fixtures needs that marker, whichever folder it sits in.
NEEDS = {"browser": {"page", "context", "browser"}, "model": {"real_engine", "real_engine_float32", "real_server"}}


# ---- markers --------------------------------------------------------------------------------------


def tier_of(path: Path) -> str | None:
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


@pytest.hookimpl(tryfirst=True)  # before pytest's own `-m` selection, so it sees these markers
def pytest_collection_modifyitems(items):
    for item in items:
        tier = tier_of(Path(item.path))
        if tier:
            item.add_marker(tier)
        needs = sorted(marker for marker, fixtures in NEEDS.items() if fixtures & set(item.fixturenames))
        if tier == "unit" and needs:  # `make test-fast` runs tests/unit on machines without either
            raise pytest.UsageError(
                f"{item.nodeid} needs {' and '.join(needs)}: it belongs in tests/{needs[0]}, not tests/unit"
            )
        for marker in needs:
            item.add_marker(marker)


# ---- servers and engines -------------------------------------------------------------------------


def config_of(factory: str, *args, **kwargs):
    """A session fixture that is one named config of a shared factory fixture."""

    @pytest.fixture(scope="session")
    def fixture(request):
        return request.getfixturevalue(factory)(*args, **kwargs)

    return fixture


@pytest.fixture(scope="session")
def live_server():
    """live_server(model="fake", env=None, args=()) → a ready LiveServer, shared per config."""
    with Pool(start_live_server, LiveServer.stop, shared=True) as pool:
        yield pool


@pytest.fixture(scope="session")
def shared_engine():
    """shared_engine(model="fake", **config) → a ready engine, one per config for the session.
    Tests must leave it working; a test that breaks its engine uses `engine_factory`."""
    with Pool(start_engine, stop_engine, shared=True) as pool:
        yield pool


@pytest.fixture
def engine_factory():
    """engine_factory(model="fake", **config) → a fresh ready engine; all shut down after the test."""
    with Pool(start_engine, stop_engine, shared=False) as pool:
        yield pool


@pytest.fixture
def inprocess_server():
    """inprocess_server(engine, **app_config) → an InProcessServer; stopped after the test."""
    with Pool(InProcessServer, InProcessServer.stop, shared=False) as pool:
        yield pool


fake_server = config_of("live_server", "fake")
real_server = config_of("live_server", "default")
# The fake model at 30 ms per step, so a request is still running when a test misbehaves at it;
# pings every few seconds and a 1 s send limit, so half-open and non-reading clients are found out
# within the test's time. Same frame limit as the default.
slow_server = config_of("live_server", "fake:delay=30", env=slow_server_env())
fake_engine = config_of("shared_engine", "fake")
real_engine = config_of("shared_engine", "default")
# The bundled model in float32: where a test needs bit-for-bit results that the quantized default
# (int4/int8 weights on bf16 inputs) does not promise, e.g. batched tokens equal to lone ones.
real_engine_float32 = config_of("shared_engine", "default", dtype="float32")


# ---- Playwright: Debian's Chromium, never a downloaded browser ---------------------------------


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    }


@pytest.fixture
def ignored_console_errors() -> tuple[str, ...]:
    """Console errors that are not the page's fault, by a piece of their text or URL: the browser's
    own favicon probe (no page asks for it). A module overrides this to add what it provokes."""
    return ("/favicon.ico",)


@pytest.fixture
def console_errors(page, ignored_console_errors):
    """Console errors ("text url") and page errors; tests assert it stays empty."""
    errors: list[str] = []

    def on_console(msg):
        text = f"{msg.text} {msg.location.get('url', '')}".strip()
        if msg.type == "error" and not any(part in text for part in ignored_console_errors):
            errors.append(text)

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


# ---- reliability figures -------------------------------------------------------------------------

FIGURES_PATH = ARTIFACTS / "reliability-figures.json"


@pytest.fixture(scope="session")
def figures():
    """case number → what it measured; merged into artifacts/reliability-figures.json at the end."""
    record: dict[str, dict] = {}
    yield record
    if record:
        FIGURES_PATH.parent.mkdir(exist_ok=True)
        # Each pytest-xdist worker merges its own cases: one at a time, so none is lost to another's write.
        with open(FIGURES_PATH.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            old = json.loads(FIGURES_PATH.read_text()) if FIGURES_PATH.exists() else {}
            merged = json.dumps({**old, **record}, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
            FIGURES_PATH.write_text(merged)


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no access log in the test output
        pass


@pytest.fixture(scope="session")
def static_url():
    """The repository over plain HTTP, for pure page modules tested without the app (ES modules do not
    load from file://): e.g. page.goto(static_url + "/static/js/class/feed-state.js")."""
    handler = functools.partial(QuietFiles, directory=str(Path(__file__).resolve().parents[1]))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
