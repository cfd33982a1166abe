"""A spot (preemptible) VM's interruption notice, polled from its metadata endpoint.

`--preemption-url` names the endpoint; two shapes are understood:

- AWS, `http://169.254.169.254/latest/meta-data/spot/instance-action`: 404 normally; 200 with
  `{"action": "terminate", "time": "2026-12-01T15:04:05Z"}` on a notice (stop and hibernate
  too). On 169.254.169.254 an IMDSv2 token is asked for first (PUT /latest/api/token); where
  none is given the request goes without one (IMDSv1).
- GCP, `http://metadata.google.internal/computeMetadata/v1/instance/preempted`: text `FALSE`,
  `TRUE` on a notice; the header `Metadata-Flavor: Google` goes with every request.

On a notice the worker drains, its deadline the drain timeout or the time left until the VM
stops less SAFETY_S, whichever is shorter (GCP gives GCP_NOTICE_S and no time). The endpoint's
errors and timeouts are DEBUG lines: they never stop the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from urllib.parse import urlsplit

import aiohttp

log = logging.getLogger(__name__)

SAFETY_S: Final = 10.0  # the drain ends this long before the VM is taken
GCP_NOTICE_S: Final = 30.0  # a preempted GCP VM is stopped about this long after the notice
AWS_METADATA_HOST: Final = "169.254.169.254"
TOKEN_TTL_S: Final = 21600
TOKEN_RETRY_S: Final = 300.0  # after IMDSv2 refused a token, ask again this much later
REQUEST_TIMEOUT_S: Final = 2.0
MAX_BODY: Final = 4096
ACTIONS: Final = ("terminate", "stop", "hibernate")


@dataclass(frozen=True)
class Notice:
    action: str
    deadline_s: float  # the drain's, from now
    at: str | None = None  # when the VM is taken, as the endpoint said


class PreemptionWatcher:
    def __init__(
        self,
        url: str,
        poll_s: float,
        on_notice: Callable[[Notice], object],
        drain_timeout_s: float,
        *,
        imds_token: bool | None = None,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.url = url
        self.poll_s = poll_s
        self.on_notice = on_notice
        self.drain_timeout_s = drain_timeout_s
        parts = urlsplit(url)
        # None: where the URL is AWS's metadata service
        self.imds_token = parts.hostname == AWS_METADATA_HOST if imds_token is None else imds_token
        self.token_url = f"{parts.scheme}://{parts.netloc}/latest/api/token"
        self.request_timeout_s = request_timeout_s
        self.notice: Notice | None = None
        self.polls = 0
        self._token: str | None = None
        self._token_until = 0.0  # monotonic: the token's end, or when to ask for one again

    async def run(self) -> None:
        """Poll until a notice (then `on_notice`, once) or until cancelled."""
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                try:
                    notice = await self.check(http)
                except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
                    log.debug("worker.preemption_poll_failed", extra={"error": repr(exc)[:200]})
                    notice = None
                self.polls += 1
                if notice is not None:
                    self.notice = notice
                    log.warning(
                        "worker.preemption_notice",
                        extra={
                            "action": notice.action,
                            "at": notice.at,
                            "deadline_s": round(notice.deadline_s, 1),
                        },
                    )
                    self.on_notice(notice)
                    return
                await asyncio.sleep(self.poll_s)

    async def check(self, http: aiohttp.ClientSession) -> Notice | None:
        """One poll: the notice, or None."""
        headers = {"Metadata-Flavor": "Google"}
        token = await self._imds_token(http) if self.imds_token else None
        if token is not None:
            headers["X-aws-ec2-metadata-token"] = token
        async with http.get(self.url, headers=headers, allow_redirects=False) as response:
            if response.status == 401 and token is not None:
                self._token, self._token_until = None, 0.0  # expired: a new one next time
            if response.status != 200:
                return None
            body = (await response.content.read(MAX_BODY)).decode("utf-8", "replace")
        return self.parse(body)

    def parse(self, body: str, now: float | None = None) -> Notice | None:
        """A notice in the endpoint's answer (a 200's body), or None."""
        text = body.strip()
        if text.upper() == "FALSE" or not text:
            return None
        if text.upper() == "TRUE":  # GCP
            return Notice("preempted", self._deadline(GCP_NOTICE_S))
        try:
            doc = json.loads(text)
        except ValueError:
            log.debug("worker.preemption_unreadable", extra={"body": text[:200]})
            return None
        action = doc.get("action") if isinstance(doc, dict) else None
        if not isinstance(action, str) or action.lower() not in ACTIONS:
            return None
        at = doc.get("time")
        left = None
        if isinstance(at, str):
            try:
                when = datetime.fromisoformat(at.replace("Z", "+00:00"))
                left = when.timestamp() - (time.time() if now is None else now)
            except ValueError:
                log.debug("worker.preemption_bad_time", extra={"time": at[:64]})
        return Notice(action.lower(), self._deadline(left), at if isinstance(at, str) else None)

    def _deadline(self, left_s: float | None) -> float:
        if left_s is None:
            return self.drain_timeout_s
        return max(0.0, min(self.drain_timeout_s, left_s - SAFETY_S))

    async def _imds_token(self, http: aiohttp.ClientSession) -> str | None:
        now = time.monotonic()
        if now < self._token_until:
            return self._token
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)}
        try:
            async with http.put(self.token_url, headers=headers) as response:
                text = (await response.content.read(MAX_BODY)).decode("ascii", "replace")
                ok = response.status == 200 and text.strip()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.debug("worker.imds_token_failed", extra={"error": repr(exc)[:200]})
            ok = False
        if ok:
            self._token, self._token_until = text.strip(), now + TOKEN_TTL_S - 60
        else:  # IMDSv1 only, or none at all: without a token, and ask again later
            self._token, self._token_until = None, now + TOKEN_RETRY_S
        return self._token


__all__ = ["Notice", "PreemptionWatcher"]
