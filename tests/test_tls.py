"""HTTPS without a proxy: `render-server serve --tls-cert F --tls-key F` serves the page, the API
and the WebSockets over TLS; real Chromium opens the https:// page and streams (the page and
the SDK take wss:// on their own: the port speaks nothing else); a key that does not match, a
missing file or a lone flag stops the start with one line naming the cause."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .browser import CHROMIUM_ARGS, ROOT, chromium_path, free_port


def self_signed(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def serve(*args: str) -> list[str]:
    return [sys.executable, "-m", "render_server", "serve", *args]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(directory)
    port = free_port()
    log = directory / "serve.log"
    command = serve("--port", str(port), "--resolution", "640x360", "--fps", "30",
                    "--tls-cert", str(cert), "--tls-key", str(key))  # fmt: skip
    trust = ssl.create_default_context(cafile=str(cert))
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2, context=trust):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        assert f"streaming at {url}/" in log.read_text()
        yield url, cert
    finally:
        process.terminate()
        process.wait(15)


def test_the_page_and_api_answer_over_https_only(tls_server: tuple[str, Path]) -> None:
    url, cert = tls_server
    trust = ssl.create_default_context(cafile=str(cert))
    with urllib.request.urlopen(url + "/", timeout=5, context=trust) as response:
        assert response.status == 200 and b"<html" in response.read().lower()
    with pytest.raises(urllib.error.URLError):  # not trusted without the certificate
        urllib.request.urlopen(url + "/healthz", timeout=5)
    plain = url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain + "/healthz", timeout=5)


@pytest.mark.browser
def test_chromium_streams_from_the_https_page(tls_server: tuple[str, Path]) -> None:
    from playwright.sync_api import sync_playwright

    url, _ = tls_server
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        context = browser.new_context(ignore_https_errors=True)  # the test's own certificate
        page: Any = context.new_page()
        sockets: list[str] = []
        page.on("websocket", lambda ws: sockets.append(ws.url))
        page.goto(url + "/")
        page.wait_for_selector("body[data-state='streaming']", state="attached", timeout=30_000)
        page.wait_for_timeout(2000)
        stats = page.evaluate("window.renderStream.stats()")
        context.close()
        browser.close()
    print(f"sockets: {sockets}, stats: {stats}")
    assert sockets and all(s.startswith("wss://127.0.0.1:") for s in sockets), sockets
    assert stats["framesDecoded"] >= 20 and (stats["width"], stats["height"]) == (640, 360)


def refused_start(*args: str) -> str:
    done = subprocess.run(
        serve("--port", str(free_port()), *args), capture_output=True, text=True, timeout=120,
        cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("RENDER_SERVER_")},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stderr


def test_bad_certificates_stop_the_start_with_their_cause(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path, "one")
    _, other_key = self_signed(tmp_path, "two")
    said = refused_start("--tls-cert", str(cert), "--tls-key", str(other_key))
    assert f"cannot use --tls-cert {cert}" in said and "KEY_VALUES_MISMATCH" in said, said
    said = refused_start("--tls-cert", str(tmp_path / "missing.crt"), "--tls-key", str(other_key))
    assert "No such file" in said, said
    said = refused_start("--tls-cert", str(cert))
    assert "--tls-cert and --tls-key go together" in said, said
