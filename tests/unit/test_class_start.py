"""`kvscope serve --class` before the server starts (app/classroom/start.py with kvscope/cli.py): the class's
default policy (chunked prefill 64 and prefix caching on, each turned off by its flag, the environment
and other flags kept), the start banner's policy line, and the LAN host names and URLs."""

from __future__ import annotations

import pytest

from app.classroom.start import CLASS_POLICY, REMOTE_POLICY_LINE, class_policy, class_setup
from kvscope.cli import build_parser, policy_of
from model_runner.local import config as engine_defaults

pytestmark = pytest.mark.unit

LAN = "192.168.1.20"


def starting_policy(*flags: str) -> dict:
    """The policy changes `kvscope serve --class FLAGS` hands the engine, as serve() computes them."""
    args = build_parser().parse_args(["serve", "--class", *flags])
    return class_policy(policy_of(args))


def started(*flags: str):
    """The engine's policy at start, from the engine's defaults and those changes."""
    return engine_defaults.POLICY.updated(starting_policy(*flags))


@pytest.fixture(autouse=True)
def no_policy_in_the_environment(monkeypatch):
    monkeypatch.delenv("KVSCOPE_POLICY", raising=False)


def test_a_class_starts_with_chunked_prefill_64_and_prefix_caching():
    policy = started()
    assert (policy.chunked_prefill, policy.chunk_size, policy.prefix_caching) == (True, 64, True)
    assert policy.batching == "continuous"  # the rest is the engine's default
    assert not engine_defaults.POLICY.chunked_prefill and not engine_defaults.POLICY.prefix_caching


def test_without_class_the_defaults_stay_off():
    assert policy_of(build_parser().parse_args(["serve"])) == {}


@pytest.mark.parametrize(
    "flags, chunked, size, caching",
    [
        (["--no-chunked-prefill"], False, 64, True),
        (["--chunked-prefill", "0"], False, 64, True),
        (["--chunked-prefill", "32"], True, 32, True),
        (["--no-prefix-caching"], True, 64, False),
        (["--no-chunked-prefill", "--no-prefix-caching"], False, 64, False),
    ],
)
def test_each_class_default_is_turned_off_by_its_flag(flags, chunked, size, caching):
    policy = started(*flags)
    assert (policy.chunked_prefill, policy.chunk_size, policy.prefix_caching) == (chunked, size, caching)


def test_the_environment_and_other_flags_are_kept_over_the_class_defaults(monkeypatch):
    monkeypatch.setenv("KVSCOPE_POLICY", '{"prefix_caching": false, "max_num_seqs": 8}')
    policy = started("--batching", "static")
    assert (policy.prefix_caching, policy.max_num_seqs, policy.batching) == (False, 8, "static")
    assert policy.chunked_prefill  # the class default the environment did not mention


def test_the_banner_says_which_policy_runs_and_how_to_turn_it_off():
    _, lines = class_setup(LAN, 8000, None, CLASS_POLICY, key="k")
    line = lines[-1]
    assert line.startswith("kvscope: class policy: continuous batching, up to 16 in a batch")
    assert "chunked prefill (64 tokens), prefix caching on" in line
    assert "--no-chunked-prefill" in line and "--no-prefix-caching" in line
    _, lines = class_setup(LAN, 8000, None, starting_policy("--no-chunked-prefill", "--no-prefix-caching"), key="k")
    assert "whole-prompt prefill, prefix caching off" in lines[-1] and "--no-" not in lines[-1]
    _, lines = class_setup(LAN, 8000, None, None, key="k")  # a remote engine: its server schedules
    assert lines[-1] == REMOTE_POLICY_LINE and "chunked" not in lines[-1]


def test_class_setup_gives_the_lan_urls_host_names_and_a_key(monkeypatch):
    monkeypatch.setattr("socket.gethostname", lambda: "teacher-laptop")
    config, lines = class_setup(LAN, 8000, ["class.example"], {}, key="secret-key")
    assert config["JOIN_URL"] == f"http://{LAN}:8000/" and config["TEACHER_KEY"] == "secret-key"
    assert config["CLASS_HOSTS"] == [LAN, "teacher-laptop", "class.example", "teacher-laptop.local"]
    assert lines[0] == f"kvscope: class mode: students open http://{LAN}:8000/"
    assert lines[1].endswith(f"http://{LAN}:8000/class?key=secret-key")
    assert sum("WARNING" in line for line in lines) == 1
