"""`render-server drain`: drain the worker on this host (or in this pod) and wait until it has
handed every session over, for a Kubernetes `preStop` hook.

It asks the worker's status port (`--metrics-port`) on the loopback interface to drain, as a
SIGTERM would, then watches `/healthz` until no session is left or the worker has gone. The
kubelet's SIGTERM that follows the hook then finds a drained worker (or none): a drain under
way is never restarted, and a first SIGTERM during one changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from render_server.cli.options import SubParsers

DEFAULT_PORT = 9100
DEFAULT_TIMEOUT_S = 120.0
POLL_S = 0.5
REQUEST_TIMEOUT_S = 2.0
MAX_BODY = 4096


def add_drain(sub: SubParsers) -> None:
    p = sub.add_parser(
        "drain",
        help="drain the worker on this host and wait for its sessions to move (preStop)",
        description="Ask the worker's status port on 127.0.0.1 to drain (as SIGTERM does) and "
        "wait until it serves no session or has exited. Exit 0 when drained, 1 at --timeout "
        "with sessions left, 2 when no worker answers or it refuses.",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="the worker's --metrics-port (%(default)s)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="give up waiting after this long, seconds (%(default)s)")  # fmt: skip
    p.set_defaults(func=_run)


def _request(url: str, method: str = "GET") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, json.loads(response.read(MAX_BODY) or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read(MAX_BODY) or b"{}")


def _run(args: argparse.Namespace) -> int:
    base = f"http://127.0.0.1:{args.port}"
    try:
        status, doc = _request(base + "/drain", "POST")
    except (OSError, ValueError) as exc:
        print(f"render-server drain: no worker answers on {base}: {exc}", file=sys.stderr)
        return 2
    if status != 202:
        print(f"render-server drain: refused ({status}): {doc.get('message', doc)}",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"draining: {doc.get('sessions', '?')} session(s) to hand over", flush=True)
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            _, doc = _request(base + "/healthz")
        except (OSError, ValueError):  # the worker has left: drained, or at its own deadline
            print("the worker has exited")
            return 0
        if doc.get("sessions") == 0:
            print("drained: no session left")
            return 0
        if time.monotonic() >= deadline:
            print(f"render-server drain: {doc.get('sessions')} session(s) left at --timeout",
                  file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(POLL_S)
