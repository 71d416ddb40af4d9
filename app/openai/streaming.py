"""The server-sent events of one streamed answer, for any number of choices: an object per token
that releases text (or carries logprobs), one with each choice's finish reason, the usage of all
choices at the end when asked (and, with vLLM's `continuous_usage_stats`, each choice's running usage
in every chunk), an engine error or cancel as an error object, then `data: [DONE]`."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from app.errors import openai_body
from app.openai.shapes import sse, terminal_error, usage_of
from model_runner.protocol.events import Accepted, Event, Finished, Token

TokenObject = Callable[[int, Token], dict[str, Any] | None]  # None: nothing to send for this token
FinishObject = Callable[[int, Finished], dict[str, Any]]


def sse_choices(
    events: Iterator[tuple[int, Event]],
    prompt_of: list[int],
    token_object: TokenObject,
    finish_object: FinishObject,
    usage_object: dict[str, Any] | None,
    continuous: bool = False,
    counts: Callable[[Finished], int] = lambda finished: finished.tokens,
) -> Iterator[str]:
    """`events`: (choice index, event) merged; `prompt_of[i]`: the prompt choice i answers, so each
    prompt's tokens count once in the usage; `usage_object`: the final chunk, None when not asked;
    `counts`: the completion tokens a finished choice reports."""
    prompt_tokens: dict[int, int] = {}
    generated = [0] * len(prompt_of)
    for index, event in events:
        if isinstance(event, Accepted):
            prompt_tokens[prompt_of[index]] = event.prompt_tokens
            continue
        if isinstance(event, Token):
            generated[index] = event.index + 1
            data = token_object(index, event)
        elif isinstance(event, Finished):
            generated[index] = counts(event)
            data = finish_object(index, event)
        elif event.terminal:
            yield sse(openai_body(terminal_error(event)))
            continue
        else:
            continue
        if data is None:
            continue
        if continuous:
            data["usage"] = usage_of(prompt_tokens.get(prompt_of[index], 0), generated[index])
        yield sse(data)
    if usage_object is not None:
        yield sse({**usage_object, "usage": usage_of(sum(prompt_tokens.values()), sum(generated))})
    yield sse("[DONE]")
