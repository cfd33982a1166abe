"""Secrets given in files stay out of `ps`: a worker's token, a server's signing key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .processes import SECRET, Process, start_signaling, stopping, token, wait_for_workers


def _worker_without_secret(name: str, replica: Process, log_dir: Path, *extra: str) -> Process:
    """A worker process whose environment holds no signing key: only what it is given can
    authenticate it (it cannot mint a token of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RENDER_SERVER_")}
    log = log_dir / f"{name}.log"
    args = [
        "worker", "--signaling", f"ws://127.0.0.1:{replica.port}/worker", "--worker-id", name,
        "--slots", "1", "--resolution", "64x64", "--fps", "5", "--renderer", "cpu",
        "--encoder", "x264", *extra,
    ]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "render_server", *args], stdout=out,
            stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    return Process(name, process, log)


def test_a_worker_registers_with_a_token_file_that_ps_does_not_show(tmp_path: Path) -> None:
    secret_token = token("worker", "from-a-file")
    token_file = tmp_path / "worker.token"
    token_file.write_text(secret_token + "\n")
    token_file.chmod(0o600)
    replica = start_signaling("replica", None, tmp_path)
    worker = _worker_without_secret("filed", replica, tmp_path, "--token-file", str(token_file))
    with stopping(worker, replica):
        wait_for_workers(replica, 1, [worker])
        arguments = Path(f"/proc/{worker.process.pid}/cmdline").read_bytes().decode()
        assert secret_token not in arguments and str(token_file) in arguments


def test_a_token_and_a_token_file_together_are_a_usage_error(tmp_path: Path) -> None:
    token_file = tmp_path / "worker.token"
    token_file.write_text("x")
    both = subprocess.run(
        [sys.executable, "-m", "render_server", "worker", "--token", "y", "--token-file",
         str(token_file)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "render_server", "worker", "--token-file", str(tmp_path / "no")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 2 and "cannot read --token-file" in missing.stderr


def test_the_signing_key_can_come_from_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "secret"
    key_file.write_text(SECRET + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RENDER_SERVER_")}
    minted = subprocess.run(
        [sys.executable, "-m", "render_server", "token", "--role", "viewer", "--subject", "s",
         "--secret-file", str(key_file)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert minted.returncode == 0, minted.stderr
    from render_server.signaling.auth import Authenticator

    identity = Authenticator({"default": SECRET.encode()}).verify(
        minted.stdout.strip(), ("viewer",)
    )
    assert identity.subject == "s"
