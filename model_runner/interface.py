"""The engine's interface, declared: what the web app may call on whichever engine runs behind it
(the built-in `Engine` or the `RemoteEngine` in front of an OpenAI-compatible server), plus the
capability only the local engine has (admission holds, the KV pool, feed text, the loaded model).
The app asks `engine.local` for that capability instead of probing attributes: None means remote.
What both engines do alike is written once, in model_runner/shared/base.py; tests/unit/test_interface.py
checks that each engine defines every member declared here, with the same parameters."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:  # types only: the ground floor imports nothing above it at run time
    from model_runner.loading.loader import LoadedModel, ModelFacts
    from model_runner.local.kv_cache import PagedKVPool
    from model_runner.protocol.request import GenerateParams
    from model_runner.remote.facts import RemoteFacts
    from model_runner.shared.feed import EngineFeed
    from model_runner.shared.policy import Policy
    from model_runner.shared.sequence import Sequence
    from model_runner.shared.stream import RequestHandle

# Told of each request's end: fn(its sequence, its terminal event as a dict).
EndListener = Callable[["Sequence", dict[str, Any]], None]


@runtime_checkable
class LocalControls(Protocol):
    """What only an engine that runs the model in this process can do."""

    loaded: LoadedModel | None
    pool: PagedKVPool | None

    @property
    def tokens_generated(self) -> int:
        """Every token chosen since start (the class view's tokens/s)."""
        ...

    @property
    def paused(self) -> bool: ...

    def set_paused(self, paused: bool) -> None: ...

    def admissions_held(self) -> AbstractContextManager[None]: ...

    def withdraw_feed_text(self) -> None: ...

    def decoder(self) -> dict[str, Any] | None:
        """Which decoder runs the steps, what `--decoder` asked and why (None until the model is loaded)."""
        ...

    def compiled(self, wait: bool = False) -> dict[str, Any] | None:
        """Whether the decode stretches run compiled ahead of time, what `--compile` asked and why (None until
        the model is loaded); with `wait`, once a compile under way has switched in or failed."""
        ...

    def batch_invariance(self) -> dict[str, Any]:
        """Whether batch-invariant mode (the policy's `batch_invariant`) is on and what it rests on here."""
        ...


@runtime_checkable
class EngineInterface(Protocol):
    """One role, two classes: every member here exists on both engines with the same meaning."""

    feed: EngineFeed

    def start(self) -> EngineInterface: ...

    def wait_ready(self, timeout: float = 600.0) -> None: ...

    def shutdown(self) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def health(self) -> tuple[bool, str]: ...

    @property
    def facts(self) -> ModelFacts | RemoteFacts | None:
        """The model's facts once loaded (or the remote server answered); None before."""
        ...

    @property
    def local(self) -> LocalControls | None:
        """The local engine's own controls, or None for an engine whose model runs elsewhere."""
        ...

    def describe_ready(self) -> None: ...

    def describe_prompt(self, params: GenerateParams) -> dict[str, Any]: ...

    def submit(
        self, params: GenerateParams, request_id: str | None = None, label: str = "", feed_text: bool | None = None
    ) -> RequestHandle: ...

    def cancel_all(self, cause: str) -> int: ...

    @property
    def active(self) -> int: ...

    @property
    def policy(self) -> Policy | None:
        """The scheduling policy now; None where the remote server schedules (set_policy refuses)."""
        ...

    def set_policy(self, changes: dict[str, Any] | None = None, /, **more: Any) -> Policy: ...

    def add_end_listener(self, fn: EndListener) -> None: ...

    def snapshot(self) -> dict[str, Any]: ...
