"""A worker process's life around its agent: signals, the status port and the spot watcher.

The first SIGTERM or SIGINT starts the drain (worker/drain.py); a second one leaves at once.
The process returns from `serve_worker` once the agent has left, every task of its own
cancelled and awaited.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from render_server.config import WorkerConfig
from render_server.signals import on_stop_signals
from render_server.worker.agent import WorkerAgent
from render_server.worker.preemption import Notice, PreemptionWatcher
from render_server.worker.status_server import StatusServer

log = logging.getLogger(__name__)


async def serve_worker(agent: WorkerAgent, config: WorkerConfig) -> None:
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[Any]] = set()
    signals = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            agent.start_drain(sig.name.lower())
        else:
            log.warning("worker.stop_now", extra={"signal": sig.name})
            tasks.add(loop.create_task(agent.stop("interrupted")))

    installed = on_stop_signals(on_signal)

    status = None
    if config.metrics_port:
        status = StatusServer(
            agent.status,
            agent.worker.metrics,
            config.metrics_host,
            config.metrics_port,
            drain=agent.start_drain,
        )
        await status.start()
    if config.preemption_url:

        def preempted(notice: Notice) -> None:
            agent.start_drain("preempted", notice.deadline_s)

        watcher = PreemptionWatcher(
            config.preemption_url, config.preemption_poll_s, preempted, config.drain_timeout_s
        )
        tasks.add(loop.create_task(watcher.run()))
    try:
        await agent.run()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if status is not None:
            await status.stop()


__all__ = ["serve_worker"]
