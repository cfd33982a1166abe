"""The command line as a user runs it (a real process)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from render_server.cli.option_values import record_dir_value

from .processes import run

SCENE_OPTIONS = ("--scene-dir", "--scene-retention", "--scene-quota", "--max-scenes-per-owner")


def test_help_documents_every_command_and_option() -> None:
    top = run("--help")
    assert top.returncode == 0
    assert "serve" in top.stdout and "RENDER_SERVER_" in top.stdout
    for command in ("doctor", "bench"):
        assert command in top.stdout
        assert run(command, "--help").returncode == 0
    serve = run("serve", "--help")
    assert serve.returncode == 0
    for option in (
        "--host",
        "--port",
        "--resolution",
        "--max-resolution",
        "--fps",
        "--renderer",
        "--encoder",
        "--nvenc-preset",
        "--intra-refresh",
        "--scene",
        "--slots",
        "--allow-origin",
        "--max-triangles",
        "--max-scene-bytes",
        "--animate",
        *SCENE_OPTIONS,
    ):
        assert option in serve.stdout, option
    signaling = run("signaling", "--help")
    assert signaling.returncode == 0
    for option in (*SCENE_OPTIONS, "--max-scene-bytes"):
        assert option in signaling.stdout, option


def test_bad_scene_files_are_clear_errors_at_start(tmp_path: Path) -> None:
    missing = run("serve", "--scene", str(tmp_path / "nope.glb"))
    assert missing.returncode == 2
    assert "cannot load the scene" in missing.stderr and "nope.glb" in missing.stderr
    assert "Traceback" not in missing.stderr

    garbage = tmp_path / "broken.glb"
    garbage.write_bytes(b"glTF\x02\x00\x00\x00garbage" * 10)
    broken = run("serve", "--scene", str(garbage))
    assert broken.returncode == 2 and "broken.glb" in broken.stderr
    assert "Traceback" not in broken.stderr

    big = tmp_path / "big.obj"
    big.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n" + "# padding\n" * 2000)
    too_big = run("serve", "--scene", str(big), "--max-scene-bytes", "1000")
    assert too_big.returncode == 2 and "1000" in too_big.stderr


def test_bad_options_are_usage_errors() -> None:
    bad = run("serve", "--resolution", "1281x720")
    assert bad.returncode == 2 and "even" in bad.stderr
    bad = run("serve", "--resolution", "1920x1080", "--max-resolution", "1280x720")
    assert bad.returncode == 2 and "max resolution" in bad.stderr
    bad = run("serve", "--renderer", "opengl")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    # a recordings folder under a file: said at start, not by a session that never streams
    bad = run("serve", "--record-congestion", f"{__file__}/recordings")
    assert bad.returncode == 2 and "--record-congestion" in bad.stderr
    assert "Not a directory" in bad.stderr and "Traceback" not in bad.stderr


def test_a_missing_recordings_folder_is_made(tmp_path: Path) -> None:
    folder = tmp_path / "recordings" / "step"
    assert record_dir_value(str(folder)) == str(folder) and folder.is_dir()
    assert record_dir_value(None) is None and record_dir_value("") is None


def run_with_env(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return run(*args, env={**os.environ, **variables})


def test_a_malformed_number_in_the_environment_is_a_usage_error() -> None:
    bad = run_with_env("serve", RENDER_SERVER_PORT="abc")
    assert bad.returncode == 2
    assert "argument --port: invalid int value: 'abc'" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = run_with_env("worker", RENDER_SERVER_FPS="fast")
    assert bad.returncode == 2 and "argument --fps" in bad.stderr
    assert "Traceback" not in bad.stderr
    shown = run_with_env("serve", "--help", RENDER_SERVER_PORT="abc")
    assert shown.returncode == 0 and "Traceback" not in shown.stderr
    # a flag wins over the environment: the variable is never read (this run stops at the
    # resolution, before anything starts)
    flagged = run_with_env(
        "serve", "--port", "8080", "--resolution", "1281x720", RENDER_SERVER_PORT="abc"
    )
    assert flagged.returncode == 2 and "even" in flagged.stderr
    assert "--port" not in flagged.stderr.splitlines()[-1]
