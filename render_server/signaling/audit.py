"""The audit log: one line per security-relevant event (logger `render_server.audit`)."""

from __future__ import annotations

import logging
from typing import Any

audit_log = logging.getLogger("render_server.audit")


def audit(event: str, **fields: Any) -> None:
    """Session start/end, refusals, rate limits, forged or lost workers: `event` and its facts."""
    audit_log.info(event, extra=fields)
