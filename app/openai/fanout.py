"""One API call's engine requests (a prompt per choice, every prompt of a batch), submitted together
so the engine batches them like any others, and their events merged as (choice index, event) in the
order they happen. Closing the merged stream (the client went away) cancels every one of them; a
request that cannot be submitted (a full queue, a prompt over the context) cancels those before it."""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Callable, Iterator

from model_runner.protocol.errors import ContextOverflow, UserError
from model_runner.protocol.events import Event
from model_runner.protocol.request import GenerateParams

LABEL = "api"


def context_error(exc: ContextOverflow, prompt_field: str, length_field: str) -> UserError:
    """vLLM's and OpenAI's wording for a request over the context, from the engine's counts: both
    numbers (an answer not given a length asks for none), and the window."""
    prompt, new, window = exc.prompt_tokens, exc.max_new_tokens or 0, exc.context_window
    where = "in the messages" if prompt_field == "messages" else "in your prompt"
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested {prompt + new} tokens "
        f"({prompt} {where}, {new} in the completion). Please reduce the length of the "
        f"{'messages' if prompt_field == 'messages' else 'prompt'} or completion."
    )
    return UserError(message, code="context_overflow", field=prompt_field if prompt >= window else length_field)


def submit_all(engine, params_list: list[GenerateParams], rid: str, fields: tuple[str, str]) -> list:
    """Submit each request (ids `rid`, or `rid`-i for several); on a refusal, cancel those already queued."""
    handles = []
    try:
        for i, params in enumerate(params_list):
            handles.append(engine.submit(params, rid if len(params_list) == 1 else f"{rid}-{i}", label=LABEL))
    except UserError as exc:
        for handle in handles:
            handle.cancel(cause="client")
        if isinstance(exc, ContextOverflow):
            raise context_error(exc, *fields) from None
        raise
    return handles


def merged(handles: list, run_events: Callable[[object], Iterator[Event]]) -> Iterator[tuple[int, Event]]:
    """(index, event) for every request's events to its terminal one. One request is read directly; several
    are read by one thread each into a queue, so none waits on another's pace."""
    if len(handles) == 1:
        for event in run_events(handles[0]):
            yield 0, event
        return
    inbox: queue.Queue = queue.Queue()
    readers = [
        threading.Thread(target=_read, args=(i, run_events(h), inbox), daemon=True) for i, h in enumerate(handles)
    ]
    for reader in readers:
        reader.start()
    ended = 0
    try:
        while ended < len(handles):
            index, event = inbox.get()
            if event is None:
                ended += 1
                continue
            yield index, event
    finally:
        for handle in handles:
            if not handle.done:
                handle.cancel(cause="disconnect")


def _read(index: int, events: Iterator[Event], inbox: queue.Queue) -> None:
    try:
        for event in events:
            inbox.put((index, event))
    finally:
        inbox.put((index, None))


def with_seed(params: GenerateParams, offset: int) -> GenerateParams:
    """Choice `offset` of a seeded request: seed + offset, so choices differ and each is reproducible."""
    if params.sampling.seed is None or offset == 0:
        return params
    seed = (params.sampling.seed + offset) % (2**31)
    return dataclasses.replace(params, sampling=dataclasses.replace(params.sampling, seed=seed))
