"""The suite computes under one numeric configuration per process, and a test that mixes two fails loudly
whatever the CPU's rounding: the guard (tests/numeric_config.py) is run here on small suites of its own."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numeric_config
import torch

pytest_plugins = ["pytester"]

# The shape of the fixture-order defect found on an AMD EPYC: the module's reference run is set up before the
# function-scoped fixture that changes the thread count, so the reference and the subject ran on different
# thread counts; on a CPU where both give the same bits the comparison passed anyway.
# A module-scoped reference run and a test that compares a fresh result with it bit for bit.
ONE_CONFIGURATION = """
    import pytest, torch

    @pytest.fixture(scope="module")
    def reference():
        torch.manual_seed(0)
        a = torch.randn(64, 64)
        return a, a @ a

    def test_the_subject_matches_the_reference(reference):
        a, want = reference
        assert torch.equal(a @ a, want)  # equal bits on many CPUs: only the guard can tell
"""

OLD_FIXTURE_ORDER = (
    ONE_CONFIGURATION
    + """
    @pytest.fixture
    def one_torch_thread():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)

    pytestmark = pytest.mark.usefixtures("one_torch_thread")
"""
)


LEAKS = """
    import torch

    def test_leaks():
        torch.set_num_threads(1)
"""

OTHER_CONFIGURATION_BOTH_SIDES = """
    import torch
    from numeric_config import other_configuration

    def test_both_sides_inside():
        torch.manual_seed(0)
        a = torch.randn(64, 64)
        with other_configuration(threads=1) as inside:
            assert inside.threads == 1
            assert torch.equal(a @ a, a @ a)
"""

SUITE_THREADS_FROM_THE_START = """
    import os, pytest, torch

    @pytest.fixture(scope="session")
    def seen_at_session_setup():
        return torch.get_num_threads()

    def test_threads(seen_at_session_setup):
        assert seen_at_session_setup == torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
"""


def run_suite(pytester, monkeypatch, modules: dict[str, str], threads: str = "2"):
    """Runs `modules` as a fresh suite that loads the guard, in a subprocess (the guard sets its process's threads)."""
    pytester.makeconftest('pytest_plugins = ["numeric_config"]\n')
    pytester.makepyfile(**{name: textwrap.dedent(source) for name, source in modules.items()})
    monkeypatch.setenv(numeric_config.THREADS_VARIABLE, threads)
    monkeypatch.setenv("PYTHONPATH", str(Path(numeric_config.__file__).parent))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")


def test_the_guard_fails_the_old_fixture_order_and_passes_one_configuration(pytester, monkeypatch):
    modules = {
        "test_old_order": OLD_FIXTURE_ORDER,
        "test_one_configuration": ONE_CONFIGURATION,
        "test_leaks": LEAKS,
        "test_other_configuration": OTHER_CONFIGURATION_BOTH_SIDES,
        "test_suite_threads": SUITE_THREADS_FROM_THE_START,
    }
    result = run_suite(pytester, monkeypatch, modules)
    output = result.stdout.str()
    # old order: failed, naming the module fixture and both thread counts; the leak: passed, then an error
    result.assert_outcomes(passed=4, failed=1, errors=1)
    assert "FAILED test_old_order.py::test_the_subject_matches_the_reference" in output, output
    assert "reference (module)" in output and "threads 2 vs 1" in output, output
    assert "left the numeric configuration changed (threads 1 vs 2)" in output, output
    assert "numeric configuration (one per process): threads=2" in output, output
    for passing in ("test_one_configuration.py", "test_other_configuration.py", "test_suite_threads.py"):
        assert f"PASSED {passing}" in output, output


def test_a_bad_thread_count_is_refused_by_name(pytester, monkeypatch):
    result = run_suite(pytester, monkeypatch, {"test_any": ONE_CONFIGURATION}, "two")
    assert "KVSCOPE_TEST_THREADS must be a whole number of threads >= 1, got 'two'" in result.stderr.str()


def test_this_process_runs_under_the_suite_configuration():
    assert torch.get_num_threads() == numeric_config.suite_threads()
    assert numeric_config.current() == numeric_config._session["configuration"]
