"""Real Firefox for the browser tests: Debian's firefox-esr, headless, driven through Marionette.

geckodriver is not packaged for Debian, so there is no WebDriver server between the test and the
browser: `firefox-esr --headless --marionette` listens itself on the port a fresh profile's
user.js names, and PyPI's `marionette-driver` speaks that protocol. `launch_firefox()` starts one
and always ends it (quit, killed if it does not exit in time) and removes its profile; `Firefox`
is what a test needs of it: navigate, evaluate a script (its result, promises awaited, comes back
as JSON values), wait, and drag a real mouse (WebDriver actions, which Firefox turns into trusted
pointer and mouse events in the page, as it does for the OS's input); and, for a stream, count the
frames a <video> shows and read its picture.

The profile keeps Firefox's stock preferences but for the few in PREFS, which only keep an
automated browser on a closed network from opening first-run pages or reaching out (each says
why). At startup Marionette itself also applies Firefox's own recommended automation preferences
(remote/shared/RecommendedPreferences.sys.mjs, `remote.prefs.recommended`, on by default), the
ones geckodriver and Puppeteer rely on too: mostly the same quiet-offline set, none about media,
painting or timers; those that touch a page's timing let input through from a page's first
frames (`dom.input_events.security.*`), keep the headless window focused
(`focusmanager.testmode`) and keep its content process from being deprioritised as background
(`dom.ipc.processPriorityManager.enabled`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from render_server.tools.local_server import free_port

__all__ = ["PREFS", "Firefox", "firefox_path", "launch_firefox"]

FIREFOX_CANDIDATES = ("/usr/bin/firefox-esr", "/usr/bin/firefox")
STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 20.0

PREFS: dict[str, bool | int | str] = {
    # First-run and upgrade pages: a fresh profile would otherwise open tabs (and fetch them)
    # beside the page under test, and ask to be the default browser.
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "startup.homepage_welcome_url": "about:blank",
    "startup.homepage_welcome_url.additional": "",
    "browser.aboutwelcome.enabled": False,
    # Telemetry: no privacy-notice tab on first run, and nothing gathered or uploaded.
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.healthreport.uploadEnabled": False,
    "datareporting.usage.uploadEnabled": False,
    # Updates: neither Firefox nor its add-ons, search engines or media plugins (OpenH264,
    # Widevine) download anything while a test runs.
    "app.update.disabledForTesting": True,
    "app.update.auto": False,
    "extensions.update.enabled": False,
    "extensions.systemAddon.update.enabled": False,
    "extensions.getAddons.cache.enabled": False,
    "browser.search.update": False,
    "media.gmp-manager.updateEnabled": False,
    # Background networking at startup, before Marionette's own preferences apply: captive
    # portal and connectivity probes, region lookup, Remote Settings (blocklists, Nimbus
    # experiments), Normandy studies, Safe Browsing lists. Offline they would only fail (and
    # log), but they take the two cores from the page while they try.
    "network.captive-portal-service.enabled": False,
    "network.connectivity-service.enabled": False,
    "browser.region.network.url": "",
    "browser.region.update.enabled": False,
    "services.settings.server": "data:,#remote-settings-dummy/v1",
    "app.normandy.enabled": False,
    "app.normandy.api_url": "",
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "browser.safebrowsing.downloads.enabled": False,
    "browser.safebrowsing.blockedURIs.enabled": False,
    "browser.safebrowsing.update.enabled": False,
}


def firefox_path() -> str:
    """$FIREFOX_PATH, else Debian's firefox-esr (or a firefox) where it installs."""
    chosen = os.environ.get("FIREFOX_PATH")
    if chosen:
        if shutil.which(chosen) is None:
            pytest.fail(f"FIREFOX_PATH={chosen} is not an executable")
        return chosen
    path = next((p for p in FIREFOX_CANDIDATES if shutil.which(p)), None)
    if path is None:
        pytest.fail("no Firefox found: install Debian's firefox-esr (CI does) or set FIREFOX_PATH")
    return path


def _marionette_class() -> Any:
    try:
        with warnings.catch_warnings():
            # its dependencies (mozinfo, mozrunner) import deprecated modules
            warnings.simplefilter("ignore", DeprecationWarning)
            from marionette_driver.marionette import Marionette  # type: ignore[import-untyped]
    except ImportError:
        pytest.fail(
            "the Firefox tests need marionette-driver (Firefox's own Marionette client): "
            "pip install -e '.[test]'"
        )
    return Marionette


def _user_js(prefs: dict[str, bool | int | str]) -> str:
    def literal(value: bool | int | str) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return "".join(f'user_pref("{name}", {literal(value)});\n' for name, value in prefs.items())


class Firefox:
    """A Marionette session on a headless Firefox, in the content (web page) context."""

    name = "firefox"

    def __init__(self, marionette: Any, log_path: Path) -> None:
        self.marionette = marionette
        self.log_path = log_path
        self.capabilities: dict[str, Any] = dict(marionette.session_capabilities)

    @property
    def version(self) -> str:
        return str(self.capabilities.get("browserVersion", "?"))

    def navigate(self, url: str) -> None:
        """Load `url` and wait for its load event (the session's default page-load strategy)."""
        self.marionette.navigate(url)

    def execute(self, script: str, *args: Any, timeout_s: float | None = None) -> Any:
        """Run `script` (a function body: `return` gives its result) in the page itself, its
        globals shared with the page's scripts, not in a sandbox; a promise it returns is
        awaited. The result comes back as JSON values (elements as marionette WebElements)."""
        return self.marionette.execute_script(
            script,
            script_args=args,
            sandbox=None,
            new_sandbox=False,
            script_timeout=None if timeout_s is None else timeout_s * 1000,
        )

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (a promise awaited), as Playwright's
        `page.evaluate("...")` gives it."""
        return self.execute(f"return ({expression});")

    def execute_async(self, body: str, *args: Any, timeout_s: float | None = None) -> Any:
        """`execute` for a script that awaits: `body` runs as an async function's body (a plain
        one is a syntax error at its first `await`), with the same `arguments`."""
        return self.execute(
            f"return (async function () {{\n{body}\n}}).apply(this, arguments);",
            *args,
            timeout_s=timeout_s,
        )

    def presented_frames(self, video: str, ms: float) -> int:
        """How many frames the <video> that the JavaScript expression `video` gives showed in
        the next `ms`, counted by requestVideoFrameCallback. Firefox's
        getVideoPlaybackQuality() is no use for this: for a MediaStream (WebRTC) source its
        totalVideoFrames stays 0 however many frames play."""
        return int(
            self.execute_async(
                f"""const video = {video};
                let frames = 0;
                let counting = true;
                const count = () => {{
                  frames += 1;
                  if (counting) video.requestVideoFrameCallback(count);
                }};
                video.requestVideoFrameCallback(count);
                await new Promise((resolve) => setTimeout(resolve, {float(ms)}));
                counting = false;
                return frames;""",
                timeout_s=ms / 1000 + 30,
            )
        )

    def grab_video(self, video: str, width: int = 160, height: int = 90) -> list[int]:
        """The current frame of the <video> that the JavaScript expression `video` gives, drawn
        to a `width` x `height` canvas: its RGBA bytes, row by row (the video may be in a
        same-origin frame: the canvas is the top page's, and stays readable)."""
        return list(
            self.execute(
                f"""const video = {video};
                const canvas = document.createElement('canvas');
                canvas.width = {int(width)};
                canvas.height = {int(height)};
                const context = canvas.getContext('2d', {{ willReadFrequently: true }});
                context.drawImage(video, 0, 0, canvas.width, canvas.height);
                return Array.from(context.getImageData(0, 0, canvas.width, canvas.height).data);"""
            )
        )

    def wait(self, ms: float) -> None:
        """Let the page run for `ms` without input (as Playwright's `wait_for_timeout`)."""
        time.sleep(ms / 1000)

    def set_viewport(self, width: int, height: int) -> None:
        """Size the window so that the page's viewport is `width` x `height` CSS pixels."""
        self.marionette.set_window_rect(width=width, height=height)
        inner_width, inner_height = self.execute("return [innerWidth, innerHeight];")
        self.marionette.set_window_rect(
            width=2 * width - inner_width, height=2 * height - inner_height
        )

    def drag(self, start: tuple[float, float], path: Sequence[tuple[float, float]]) -> None:
        """Left-button drag: to `start` with the button up, press, one move to each point of
        `path` in turn, release (as Playwright's mouse.move, down, move(steps=...), up). One
        WebDriver action sequence: each `pointer_move` is one tick, one trusted pointermove
        with the button state the earlier ticks left."""
        actions = self.marionette.actions.sequence("pointer", "mouse", {"pointerType": "mouse"})
        actions.pointer_move(round(start[0]), round(start[1])).pointer_down()
        for x, y in path:
            actions.pointer_move(round(x), round(y))
        actions.pointer_up().perform()

    def drag_over_time(
        self, start: tuple[float, float], path: Sequence[tuple[float, float]], leg_ms: int
    ) -> None:
        """Left-button drag as a hand makes it: to `start` with the button up, press, then to
        each point of `path` in turn over `leg_ms` each, release. One WebDriver action
        sequence; a `pointer_move` with a duration is a continuous motion, not a jump:
        Marionette moves the pointer along the line every 17 ms ("common vsync", its
        `moveOverTime`), each step a trusted pointermove, so the page sees ~60 moves a second
        for as long as the drag lasts (fewer where the content process is too busy to take
        them that fast). `perform` returns when the button is up."""
        actions = self.marionette.actions.sequence("pointer", "mouse", {"pointerType": "mouse"})
        actions.pointer_move(round(start[0]), round(start[1])).pointer_down()
        for x, y in path:
            actions.pointer_move(round(x), round(y), duration=max(0, int(leg_ms)))
        actions.pointer_up().perform()


@contextlib.contextmanager
def launch_firefox(
    *,
    viewport: tuple[int, int] | None = None,
    prefs: dict[str, bool | int | str] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
) -> Iterator[Firefox]:
    """A headless firefox-esr on a fresh temporary profile with PREFS (and `prefs`), in a
    Marionette session; quit on exit (killed if it has not exited within `shutdown_timeout`),
    the profile removed. Fails the test, with Firefox's output, if it cannot be started."""
    binary = firefox_path()
    marionette_class = _marionette_class()
    workdir = Path(tempfile.mkdtemp(prefix="firefox-test-"))
    profile = workdir / "profile"
    profile.mkdir()
    log_path = workdir / "firefox.log"
    port = free_port()
    # marionette.port: a free port, not the default 2828, so that runs side by side (or a
    # stray Firefox) do not meet
    (profile / "user.js").write_text(_user_js({**PREFS, **(prefs or {}), "marionette.port": port}))
    env = dict(os.environ, MOZ_CRASHREPORTER_DISABLE="1")  # no crash-reporter dialog to wait on
    process: subprocess.Popen[bytes] | None = None
    client: Any = None
    try:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [binary, "--headless", "--marionette", "--no-remote", "--profile", str(profile)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        client = marionette_class(host="127.0.0.1", port=port, startup_timeout=startup_timeout)
        try:
            _wait_for_port(process, port, startup_timeout)
            client.start_session(timeout=startup_timeout)
        except Exception as error:
            pytest.fail(
                f"Firefox ({binary}) gave no Marionette session on port {port}: {error!r}; "
                f"exit status {process.poll()}; its output:\n{_tail(log_path)}"
            )
        firefox = Firefox(client, log_path)
        if viewport is not None:
            firefox.set_viewport(*viewport)
        yield firefox
    finally:
        _quit(client, process, shutdown_timeout)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_for_port(process: subprocess.Popen[bytes], port: int, timeout: float) -> None:
    """Until Marionette listens on `port`; raises at once if Firefox has exited (the client's
    own wait would poll on for the whole timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError("Firefox exited before Marionette listened")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listened on port {port} in {timeout:.0f} s") from None
            time.sleep(0.1)


def _quit(client: Any, process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    asked = False
    if client is not None and client.session is not None:
        with contextlib.suppress(Exception):
            # Marionette.quit() only quits a Firefox that marionette_driver started itself;
            # this is the same in-application quit request (Marionette:Quit)
            client._request_in_app_shutdown()
            asked = True
        with contextlib.suppress(Exception):
            client.delete_session(send_request=False)
    if process is None:
        return
    if not asked and process.poll() is None:
        process.terminate()  # no session to ask: SIGTERM, which Firefox exits on
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        # its own process group (start_new_session): the content processes go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"
