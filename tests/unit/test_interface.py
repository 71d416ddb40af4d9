"""The engine's declared interface (model_runner/interface.py) against the two engines: each defines
every member the Protocol declares, of the same kind (attribute, property, method) and with the same
parameters; `local` is the local engine's own controls and None on the remote one; what both do
alike (the readiness wait, the end listeners) is written once."""

from __future__ import annotations

import inspect

import pytest

from model_runner.interface import EngineInterface, LocalControls
from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from model_runner.remote.engine import RemoteConfig, RemoteEngine
from model_runner.shared.base import EngineBase

PROTOCOL_MACHINERY = {"_is_protocol", "_is_runtime_protocol"}


def declared(protocol: type) -> dict[str, str]:
    """The Protocol's own members by kind: 'attribute' (annotated), 'property' or 'method'."""
    members = {name: "attribute" for name in protocol.__annotations__}
    for name, value in vars(protocol).items():
        if name.startswith("_") or name in PROTOCOL_MACHINERY:
            continue
        members[name] = "property" if isinstance(value, property) else "method"
    return members


def kind_on(instance: object, name: str) -> str | None:
    """What the engine has under this name: looked up statically, so the Protocol's own bodies and
    properties that would run are never what answers."""
    if name in vars(instance):
        return "attribute"
    try:
        value = inspect.getattr_static(type(instance), name)
    except AttributeError:
        return None
    if isinstance(value, property):
        return "property"
    return "method" if callable(value) else "attribute"


def parameters(function) -> list[tuple[str, object, object]]:
    """Names, kinds and defaults: what a caller relies on (annotations are checked apart)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.fixture(scope="module")
def local_engine():
    return Engine(EngineConfig(model="fake"), loaded=load("fake"))  # never started: nothing runs


@pytest.fixture(scope="module")
def remote_engine():
    return RemoteEngine(RemoteConfig(url="openai:http://127.0.0.1:9"))  # never started: nothing connects


@pytest.fixture(params=["local_engine", "remote_engine"])
def engine(request):
    return request.getfixturevalue(request.param)


def test_the_protocol_declares_the_members_the_app_relies_on():
    members = declared(EngineInterface)
    assert {"submit", "cancel_all", "snapshot", "add_end_listener", "wait_ready"} <= members.keys()
    assert members["local"] == members["facts"] == members["policy"] == "property"
    assert members["feed"] == "attribute"
    assert {"set_paused", "admissions_held", "withdraw_feed_text", "loaded", "pool"} <= declared(LocalControls).keys()


def test_each_engine_defines_every_declared_member_of_the_same_kind(engine):
    wrong = {
        name: (kind, kind_on(engine, name))
        for name, kind in declared(EngineInterface).items()
        if kind_on(engine, name) != kind
    }
    assert wrong == {}, f"{type(engine).__name__}: declared kind vs defined kind"
    assert isinstance(engine, EngineInterface)


def test_each_engines_methods_take_the_declared_parameters_with_types(engine):
    for name, kind in declared(EngineInterface).items():
        if kind != "method":
            continue
        mine = getattr(type(engine), name)
        assert parameters(mine) == parameters(getattr(EngineInterface, name)), f"{type(engine).__name__}.{name}"
        hints = inspect.signature(mine)
        untyped = [p.name for p in list(hints.parameters.values())[1:] if p.annotation is inspect.Parameter.empty]
        assert untyped == [] and hints.return_annotation is not inspect.Signature.empty, f"{name} is not typed"


def test_the_local_engine_is_its_own_local_controls_and_defines_them_all(local_engine):
    assert local_engine.local is local_engine and isinstance(local_engine.local, LocalControls)
    wrong = {
        name: (kind, kind_on(local_engine, name))
        for name, kind in declared(LocalControls).items()
        if kind_on(local_engine, name) != kind
    }
    assert wrong == {}
    for name, kind in declared(LocalControls).items():
        if kind == "method":
            assert parameters(getattr(Engine, name)) == parameters(getattr(LocalControls, name)), name


def test_the_remote_engine_has_no_local_controls(remote_engine):
    assert remote_engine.local is None


def test_the_readiness_wait_and_the_end_listeners_are_written_once():
    for name in ("wait_ready", "status", "add_end_listener"):
        owners = [cls.__name__ for cls in (Engine, RemoteEngine) if name in vars(cls)]
        assert owners == [] and name in vars(EngineBase), name


def test_wait_ready_reports_why_an_engine_is_not_ready(remote_engine, local_engine):
    local_engine.wait_ready(timeout=0.01)  # loaded at construction: ready at once
    with pytest.raises(RuntimeError, match="connecting to the remote server"):
        remote_engine.wait_ready(timeout=0.01)
