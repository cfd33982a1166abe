"""Helpers for the browser tests: Debian's Chromium through Playwright, the server as a process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from render_server.tools.local_server import free_port, local_server
from render_server.tools.measure.browser import CHROMIUM_ARGS as MEASURE_CHROMIUM_ARGS
from render_server.tools.measure.browser import find_chromium
from render_server.tools.measure.client import MeasureError

__all__ = ["CHROMIUM_ARGS", "chromium_page", "chromium_path", "free_port", "serve_process"]

# the flags and the search are the ones `render-server latency --client chromium` uses
CHROMIUM_ARGS = list(MEASURE_CHROMIUM_ARGS)


def chromium_path() -> str:
    try:
        return find_chromium()
    except MeasureError:
        pytest.fail("no Chromium found: install Debian's chromium (CI does) or set CHROMIUM_PATH")


ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def chromium_page(width: int = 960, height: int = 540) -> Iterator[Any]:
    """A page of a fresh headless Chromium, its console printed; closed on leaving."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.on("console", lambda m: print(f"[chromium {m.type}] {m.text}"))
        try:
            yield page
        finally:
            context.close()
            browser.close()


@contextlib.contextmanager
def serve_process(
    *args: str,
    log_path: Path,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    launcher: Sequence[str] | None = None,
) -> Iterator[str]:
    """`render-server serve` on a free port, as a user runs it; yields its base URL.

    `launcher` stands for `python -m render_server`: a tests-side entry point such as
    `tests.slow_serve.launcher(...)`, which changes the server before it runs (started from the
    repository's root, where `python -m tests....` finds the tests package).
    """
    with local_server(
        *args, log_path=log_path, timeout=timeout, env=env, launcher=launcher, cwd=ROOT
    ) as server:
        yield server.url
