"""The one user-facing error class: a message a person can act on, naming the field and limit."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input or an unavailable service; `code` is machine-readable, `field` names the culprit."""

    def __init__(self, message: str, *, code: str = "invalid_request", field: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field


class ContextOverflow(UserError):
    """A prompt and its answer that do not fit the context window, with the counts a door words its own
    message from (OpenAI's and vLLM's wording on /v1): the prompt's tokens, the answer's length as asked
    (None when not asked: the room left), and the window."""

    def __init__(
        self, message: str, *, prompt_tokens: int, max_new_tokens: int | None, context_window: int, field: str
    ):
        super().__init__(message, code="context_overflow", field=field)
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.context_window = context_window
