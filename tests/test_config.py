from pathlib import Path

import pytest

from render_server.cli.main import build_parser
from render_server.cli.options import server_config
from render_server.config import (
    ConfigError,
    Resolution,
    ServerConfig,
    StreamConfig,
    default_bitrate,
    default_scene_dir,
)


def test_resolution_parsing() -> None:
    assert Resolution.parse("1280x720") == Resolution(1280, 720)
    assert Resolution.parse(" 1920 X 1080 ") == Resolution(1920, 1080)
    for bad in ("1280", "axb", "1281x720", "10x10", "100000x100", "-2x4"):
        with pytest.raises(ConfigError):
            Resolution.parse(bad)


def test_default_bitrate_grows_with_size_and_rate() -> None:
    r720, r1080, r4k = Resolution(1280, 720), Resolution(1920, 1080), Resolution(3840, 2160)
    assert 2_000_000 < default_bitrate(r720, 30) < 4_000_000
    assert default_bitrate(r720, 30) < default_bitrate(r1080, 30) < default_bitrate(r4k, 30)
    assert default_bitrate(r1080, 30) < default_bitrate(r1080, 60)
    assert default_bitrate(Resolution(64, 64), 1) == 1_000_000


def test_invalid_values_are_errors() -> None:
    with pytest.raises(ConfigError):
        StreamConfig(fps=0)
    with pytest.raises(ConfigError):
        StreamConfig(renderer="opengl")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ServerConfig(slots=0)
    with pytest.raises(ConfigError):
        ServerConfig(allowed_origins=("example.com",))
    with pytest.raises(ConfigError):
        ServerConfig(ice_servers=("http://x",))


def test_cli_and_environment_go_through_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENDER_SERVER_PORT", "9001")
    monkeypatch.setenv("RENDER_SERVER_RESOLUTION", "640x360")
    args = build_parser().parse_args(
        ["serve", "--fps", "60", "--allow-origin", "https://app.example/"]
    )
    config = server_config(args)
    assert config.port == 9001  # from the environment
    assert config.stream.resolution == Resolution(640, 360)
    assert config.stream.fps == 60  # from the flag
    assert config.allowed_origins == ("https://app.example",)
    args = build_parser().parse_args(["serve", "--port", "9002"])
    assert server_config(args).port == 9002  # the flag wins over the environment


def test_the_scene_options_reach_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RENDER_SERVER_SCENE_DIR", str(tmp_path / "from-env"))
    args = build_parser().parse_args(
        ["signaling", "--scene-retention", "3600", "--scene-quota", "5000000",
         "--max-scenes-per-owner", "3", "--max-scene-bytes", "1000000"]
    )  # fmt: skip
    config = server_config(args, embedded_worker=False)
    assert config.scene_dir == tmp_path / "from-env"
    assert (config.scene_retention_s, config.scene_quota_bytes) == (3600, 5_000_000)
    assert (config.max_scenes_per_owner, config.max_scene_bytes) == (3, 1_000_000)
    args = build_parser().parse_args(["serve", "--scene-dir", "/srv/scenes", "--max-scene-bytes",
                                      "2000"])  # fmt: skip
    config = server_config(args)
    assert config.scene_dir == Path("/srv/scenes") and config.max_scene_bytes == 2000
    monkeypatch.delenv("RENDER_SERVER_SCENE_DIR")
    defaults = server_config(build_parser().parse_args(["serve"]))
    assert defaults.scene_dir == default_scene_dir()
    assert (defaults.scene_retention_s, defaults.scene_quota_bytes) == (7 * 86400, 1024**3)
    assert defaults.max_scenes_per_owner == 20


def test_the_default_scene_folder_is_the_users_state() -> None:
    state = default_scene_dir({"XDG_STATE_HOME": "/var/lib/me"})
    assert state == Path("/var/lib/me/render-server/scenes")
    home = default_scene_dir({"XDG_STATE_HOME": "relative/ignored"})
    assert home == Path.home() / ".local/state/render-server/scenes"


@pytest.mark.parametrize(
    "bad",
    [
        {"scene_retention_s": 0},
        {"scene_quota_bytes": 0},
        {"max_scenes_per_owner": 0},
        {"max_scene_bytes": 0},
    ],
)
def test_bad_scene_limits_are_errors(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        ServerConfig(**bad)  # type: ignore[arg-type]
