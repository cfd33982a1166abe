"""Helpers for the browser tests: Debian's Chromium through Playwright, the server as a process."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from render_server.tools.local_server import free_port, local_server
from render_server.tools.measure.browser import CHROMIUM_ARGS as MEASURE_CHROMIUM_ARGS
from render_server.tools.measure.browser import find_chromium
from render_server.tools.measure.client import MeasureError

__all__ = [
    "CHROMIUM_ARGS", "chromium_browser", "chromium_page", "chromium_path", "chromium_process",
    "free_port", "serve_process",
]  # fmt: skip

# the flags and the search are the ones `render-server latency --client chromium` uses
CHROMIUM_ARGS = list(MEASURE_CHROMIUM_ARGS)


def chromium_path() -> str:
    try:
        return find_chromium()
    except MeasureError:
        pytest.fail("no Chromium found: install Debian's chromium (CI does) or set CHROMIUM_PATH")


ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def chromium_browser() -> Iterator[Any]:
    """A fresh headless Chromium (Playwright's Browser); closed on leaving."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def chromium_page(width: int = 960, height: int = 540) -> Iterator[Any]:
    """A page of a fresh headless Chromium, its console printed; closed on leaving."""
    with chromium_browser() as browser:
        context = browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.on("console", lambda m: print(f"[chromium {m.type}] {m.text}"))
        try:
            yield page
        finally:
            context.close()


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


@contextlib.contextmanager
def chromium_process(
    log_dir: Path, width: int = 640, height: int = 360, browser_type: Any = None
) -> Iterator[Any]:
    """A page of a headless Chromium started as a process of its own (its own process group),
    driven over CDP: a test can freeze the whole browser (`os.killpg(page.pgid, SIGSTOP)`), its
    network included, as a laptop that sleeps or a tab the OS stopped would be.
    `browser_type`: the Playwright `chromium` of a test that drives one already (Playwright's
    sync API runs one instance per thread)."""
    import os
    import re
    import signal
    import subprocess
    import time

    from playwright.sync_api import sync_playwright

    profile = log_dir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    log = (log_dir / "chromium.log").open("w+")
    proc = subprocess.Popen(
        [chromium_path(), "--headless=new", *CHROMIUM_ARGS, f"--user-data-dir={profile}",
         "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        endpoint = None
        while endpoint is None:
            log.seek(0)
            found = re.search(r"DevTools listening on (ws://\S+)", log.read())
            if found:
                endpoint = found.group(1)
            elif proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Chromium did not start: {(log_dir / 'chromium.log').read_text()}")
            else:
                time.sleep(0.1)
        with contextlib.ExitStack() as stack:
            if browser_type is None:
                browser_type = stack.enter_context(sync_playwright()).chromium
            browser = browser_type.connect_over_cdp(endpoint)
            context = browser.contexts[0]
            page = context.pages[0] if context.pages else context.new_page()
            page.set_viewport_size({"width": width, "height": height})
            page.on("console", lambda m: print(f"[chromium2 {m.type}] {m.text}"))
            page.pgid = proc.pid  # type: ignore[attr-defined]
            try:
                yield page
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                with contextlib.suppress(Exception):
                    browser.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def static_site(directory: Path, files: dict[str, str]) -> Iterator[str]:
    """`files` (name → text) written to `directory` and served over HTTP on loopback (a page
    there may import modules, which a blank page may not); yields the site's root URL."""
    for name, text in files.items():
        (directory / name).write_text(text)
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
