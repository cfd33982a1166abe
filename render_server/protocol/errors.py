"""Errors that travel back to a client: a stable `code` to branch on, a `message` to read."""

from __future__ import annotations


class CodedError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ErrorCode:
    """The `code` of an `error` message on either socket; clients branch on these."""

    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED_VERSION = "unsupported_version"
    TOO_LARGE = "too_large"
    BAD_ORDER = "bad_order"
    RATE_LIMITED = "rate_limited"
    NO_CAPACITY = "no_capacity"  # no registered worker can ever meet the requirements
    # (or, from a worker, it has no free slot)
    TOO_MANY_SESSIONS = "too_many_sessions"  # the token's subject or the address is at its cap
    OFFER_TIMEOUT = "offer_timeout"  # the browser sent no offer in time: the slot is freed
    BAD_OFFER = "bad_offer"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    UNKNOWN_SESSION = "unknown_session"
    UNKNOWN_WORKER = "unknown_worker"
    WORKER_FAILED = "worker_failed"
    UNAVAILABLE = "unavailable"  # shared state (Redis) is out of reach for now: try again soon
    INTERNAL = "internal"


class ProtocolError(CodedError):
    """A message that will not be acted on; on a socket, sent back as an `error` message."""
