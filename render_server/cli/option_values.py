"""Values of command-line options: from the environment (RENDER_SERVER_<NAME>) or a config
default as text, and the parsers of values that are more than a type (secrets, codecs, signaling
URLs, `--processes`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from render_server.config import ConfigError, WorkerConfig, env_value
from render_server.encode.codecs import parse_codecs


def env(name: str, fallback: object) -> str:
    """RENDER_SERVER_<NAME>, or `fallback` (a config default) as text."""
    return env_value(name) or str(fallback)


def flag(name: str) -> bool:
    return env(name, "") in ("1", "true", "yes")


def env_unless_zero(name: str, number: Callable[[str], float]) -> str | None:
    """RENDER_SERVER_<NAME> as text, or None (the config's default) where it reads as zero;
    text that is no number is left to the option's `type=` to refuse."""
    text = env_value(name)
    try:
        return None if text is not None and number(text) == 0 else text
    except ValueError:
        return text


def env_list(name: str) -> list[str]:
    return [item for item in env(name, "").split(",") if item]


def signaling_urls(flags: list[str] | None) -> tuple[str, ...]:
    """`--signaling` (repeatable, comma-separated), else RENDER_SERVER_SIGNALING (a comma
    list), else the default."""
    given = flags if flags is not None else [env("signaling", WorkerConfig().signaling_url)]
    urls = tuple(url.strip() for item in given for url in item.split(",") if url.strip())
    return urls or (WorkerConfig().signaling_url,)


def read_secret(value: str | None, path: Path | None, flag: str) -> str | None:
    """A secret given inline or in a file, never both: a file keeps it out of `ps`, where any
    user of the machine can read a process's arguments."""
    if path is None:
        return value
    if value:
        raise ConfigError(f"give {flag} or {flag}-file, not both")
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {flag}-file {path}: {exc}") from None
    if not text:
        raise ConfigError(f"{flag}-file {path} is empty")
    return text


def codecs_value(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    try:
        return parse_codecs(text)
    except ValueError as exc:
        raise ConfigError(f"--codecs: {exc}") from None


def processes_value(text: str, slots: int) -> int:
    """`--processes`: a number, or `auto` (the cores here, at most one per slot)."""
    if text.strip().lower() == "auto":
        return max(1, min(len(os.sched_getaffinity(0)), slots))
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--processes {text!r} is neither a number nor auto") from None


def record_dir_value(path: str | None) -> str | None:
    """`--record-congestion`: a folder the sessions can write their recordings to, made when
    missing. Checked at start: a session that found it missing would fail to open, and the
    page wait for a picture that never comes."""
    if not path:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--record-congestion {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--record-congestion {path}: not a folder this process can write to")
    return path
