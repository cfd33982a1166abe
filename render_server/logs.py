"""Structured logs: one event per line, `event=... key=value`, or JSON lines."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")
    }


def _text_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\n'):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """`2026-11-29T15:00:00.123Z INFO logger event k=v ...`"""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"{stamp}.{int(record.msecs):03d}Z",
            record.levelname,
            record.name,
            record.getMessage(),
        ]
        parts += [f"{k}={_text_value(v)}" for k, v in _fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiortc/aioice log every packet at DEBUG and some routine events at INFO
    for noisy in ("aiortc", "aioice", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class SessionLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that puts `session=<id>` (and any other fixed fields) on every line."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra: Mapping[str, Any] = self.extra or {}
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return msg, kwargs


def session_logger(name: str, session_id: str, **fields: Any) -> SessionLogger:
    return SessionLogger(logging.getLogger(name), {"session": session_id, **fields})
