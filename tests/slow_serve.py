"""`render-server` with slowed pipeline stages, for tests that run the server as a process.

    python -m tests.slow_serve --render-delay-ms 25 serve --port 8080 ...

installs `tests.slow_stages` into the worker's factory, then runs the real command line with the
remaining arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from unittest.mock import patch

from render_server.cli.main import main as render_server_main
from render_server.worker.local import LocalWorker

from .slow_stages import slowed


def launcher(render_delay_ms: float = 0.0, encode_delay_ms: float = 0.0) -> list[str]:
    """The command line's start: what runs instead of `python -m render_server`."""
    return [
        sys.executable, "-m", "tests.slow_serve", "--render-delay-ms", str(render_delay_ms),
        "--encode-delay-ms", str(encode_delay_ms),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.slow_serve", description=__doc__)
    parser.add_argument("--render-delay-ms", type=float, default=0.0)
    parser.add_argument("--encode-delay-ms", type=float, default=0.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="render-server's arguments")
    args = parser.parse_args(argv)
    slow = slowed(LocalWorker.build_stages, args.render_delay_ms / 1e3, args.encode_delay_ms / 1e3)
    with patch.object(LocalWorker, "build_stages", slow):
        return render_server_main(args.command)


if __name__ == "__main__":
    sys.exit(main())
