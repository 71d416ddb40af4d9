"""The one user-facing error class: a message a person can act on, naming the field and limit."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input or an unavailable service; `code` is machine-readable, `field` names the culprit."""

    def __init__(self, message: str, *, code: str = "invalid_request", field: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field
