"""The one numeric configuration a test process computes under, and the guard that keeps it one.

Contract: at session start (before any fixture of any scope) the process's torch thread count is set to
`KVSCOPE_TEST_THREADS` (default 1) and exported to the servers the tests start; the kernel capability,
default dtype and deterministic flags are whatever the process started with. Every fixture records the
configuration it was set up under; a test whose body runs under another configuration than any of its
fixtures fails, naming the fixture and both configurations, and so does a test that leaves the
configuration changed. A comparison of two results then never mixes two configurations unnoticed,
whatever the CPU's rounding (docs/reliability.md, "One configuration per process"). A test that needs
another configuration computes both sides of its comparison inside `other_configuration()`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, fields

import pytest
import torch

THREADS_VARIABLE = "KVSCOPE_TEST_THREADS"
# The environment that picks kernels at start-up: part of a configuration, though a process cannot change it.
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
RECORD = "_kvscope_numeric_configuration"  # the attribute a fixture definition's configuration is kept in


@dataclass(frozen=True)
class NumericConfiguration:
    """What a bit-exact result depends on besides its inputs and shapes."""

    threads: int
    capability: str
    default_dtype: str
    deterministic: bool
    kernel_env: str

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    def differences(self, other: NumericConfiguration) -> str:
        changed = [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]
        return ", ".join(f"{name} {getattr(self, name)} vs {getattr(other, name)}" for name in changed)


def current() -> NumericConfiguration:
    return NumericConfiguration(
        threads=torch.get_num_threads(),
        capability=torch.backends.cpu.get_cpu_capability(),
        default_dtype=str(torch.get_default_dtype()).removeprefix("torch."),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        kernel_env=" ".join(f"{name}={os.environ[name]}" for name in KERNEL_VARIABLES if name in os.environ) or "-",
    )


def suite_threads() -> int:
    value = os.environ.get(THREADS_VARIABLE, "1")
    if not value.isdigit() or int(value) < 1:
        raise pytest.UsageError(f"{THREADS_VARIABLE} must be a whole number of threads >= 1, got {value!r}")
    return int(value)


def configure_process(threads: int) -> NumericConfiguration:
    """Sets the process's configuration once; servers started later inherit the thread count."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return current()


@contextlib.contextmanager
def other_configuration(threads: int):
    """Both sides of a comparison that needs another thread count run inside this; the suite's comes back."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield current()
    finally:
        torch.set_num_threads(before)


# ---- the pytest plugin ---------------------------------------------------------------------------

_session: dict[str, NumericConfiguration] = {}


def pytest_configure(config):
    _session["configuration"] = configure_process(suite_threads())


def pytest_report_header(config):
    return f"numeric configuration (one per process): {_session['configuration'].describe()}"


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    result = yield
    setattr(fixturedef, RECORD, current())
    return result


def mixed_fixtures(item: pytest.Item, body: NumericConfiguration) -> list[str]:
    """The item's fixtures (any scope) that were set up under another configuration than `body`."""
    mixed = []
    for name in item.fixturenames:
        for fixturedef in getattr(item, "_fixtureinfo").name2fixturedefs.get(name, ()):
            recorded = getattr(fixturedef, RECORD, None)
            if recorded is not None and recorded != body:
                mixed.append(f"{name} ({fixturedef.scope}): {recorded.describe()} — {recorded.differences(body)}")
    return mixed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    body = current()
    mixed = mixed_fixtures(item, body)
    if mixed:
        pytest.fail(
            f"a fixture was computed under another numeric configuration than this test's body "
            f"({body.describe()}):\n  " + "\n  ".join(mixed),
            pytrace=False,
        )
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    now, suite = current(), _session["configuration"]
    if now != suite:
        torch.set_num_threads(suite.threads)  # so the next test is judged on its own
        pytest.fail(
            f"{item.nodeid} left the numeric configuration changed ({now.differences(suite)}); "
            "run another configuration inside numeric_config.other_configuration()",
            pytrace=False,
        )
    return result
