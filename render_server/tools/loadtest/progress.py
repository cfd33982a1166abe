"""A live view of the run on the terminal (rich): streams up and failed, fps, Mbps, p95."""

from __future__ import annotations

from typing import Any

from render_server.tools.loadtest.config import LoadTestConfig
from render_server.tools.loadtest.runner import Progress


class LiveDisplay:
    """Call with each `Progress`; `stop()` at the end. Draws nothing when `enabled` is False."""

    def __init__(self, config: LoadTestConfig, enabled: bool = True) -> None:
        self.config = config
        self._live: Any = None
        if enabled:
            from rich.live import Live

            self._live = Live(self._render(None), refresh_per_second=4, transient=False)
            self._live.start()

    def __call__(self, progress: Progress) -> None:
        if self._live is not None:
            self._live.update(self._render(progress))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live.console.print()
            self._live = None

    def _render(self, progress: Progress | None) -> Any:
        from rich.table import Table

        config = self.config
        table = Table(title="render-server loadtest", show_header=True, expand=False)
        for column in (
            "elapsed",
            "phase",
            "up",
            "failed",
            "waiting",
            "fps (all)",
            "Mbps",
            "p95 ms",
        ):
            table.add_column(column, justify="right")
        if progress is None:
            table.add_row("-", "starting", "0", "0", str(config.streams), "-", "-", "-")
            return table
        up = progress.count("up")
        failed = progress.count("failed")
        waiting = progress.count("pending", "connecting", "queued", "negotiating")
        total = config.end_s
        table.add_row(
            f"{max(0.0, progress.elapsed_s):.0f}/{total:.0f} s",
            progress.phase,
            f"{up}/{config.streams}",
            f"[red]{failed}[/red]" if failed else "0",
            str(waiting),
            f"{progress.fps:.0f} (target {config.fps * config.streams:.0f})",
            f"{progress.mbps:.1f}",
            "-" if progress.p95_ms is None else f"{progress.p95_ms:.1f}",
        )
        return table
