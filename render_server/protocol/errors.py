"""Errors that travel back to a client: a stable `code` to branch on, a `message` to read."""

from __future__ import annotations


class CodedError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
