"""Secrets given in files stay out of `ps`: a worker's token, a server's signing key."""

from __future__ import annotations

from pathlib import Path

from .processes import (
    SECRET,
    environment,
    run,
    start_signaling,
    start_worker,
    stopping,
    token,
    wait_for_workers,
)


def test_a_worker_registers_with_a_token_file_that_ps_does_not_show(tmp_path: Path) -> None:
    secret_token = token("worker", "from-a-file")
    token_file = tmp_path / "worker.token"
    token_file.write_text(secret_token + "\n")
    token_file.chmod(0o600)
    replica = start_signaling("replica", None, tmp_path)
    # no signing key in its environment: only the file can authenticate it
    worker = start_worker(
        "filed", replica, tmp_path, 1, "--token-file", str(token_file), with_secret=False
    )
    with stopping(worker, replica):
        wait_for_workers(replica, 1, [worker])
        arguments = Path(f"/proc/{worker.process.pid}/cmdline").read_bytes().decode()
        assert secret_token not in arguments and str(token_file) in arguments


def test_a_token_and_a_token_file_together_are_a_usage_error(tmp_path: Path) -> None:
    token_file = tmp_path / "worker.token"
    token_file.write_text("x")
    both = run("worker", "--token", "y", "--token-file", str(token_file))
    assert both.returncode == 2 and "not both" in both.stderr
    missing = run("worker", "--token-file", str(tmp_path / "no"))
    assert missing.returncode == 2 and "cannot read --token-file" in missing.stderr


def test_the_signing_key_can_come_from_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "secret"
    key_file.write_text(SECRET + "\n")
    minted = run(
        "token", "--role", "viewer", "--subject", "s", "--secret-file", str(key_file),
        env=environment(with_secret=False),
    )  # fmt: skip
    assert minted.returncode == 0, minted.stderr
    from render_server.signaling.auth import Authenticator

    identity = Authenticator({"default": SECRET.encode()}).verify(
        minted.stdout.strip(), ("viewer",)
    )
    assert identity.subject == "s"


def test_the_turn_secret_can_come_from_a_file(tmp_path: Path) -> None:
    import pytest

    from render_server.cli.main import build_parser
    from render_server.cli.options import server_config
    from render_server.config import ConfigError

    secret_file = tmp_path / "turn-secret"
    secret_file.write_text("coturn-shared-secret\n")
    args = ["signaling", "--turn-url", "turn:turn.example.com:3478"]
    parsed = build_parser().parse_args([*args, "--turn-secret-file", str(secret_file)])
    assert server_config(parsed, embedded_worker=False).turn_secret == "coturn-shared-secret"
    both = build_parser().parse_args(
        [*args, "--turn-secret", "x", "--turn-secret-file", str(secret_file)]
    )
    with pytest.raises(ConfigError, match="not both"):
        server_config(both, embedded_worker=False)
