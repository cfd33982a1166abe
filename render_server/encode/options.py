"""Checks an AVOption dictionary against what a PyAV codec really accepts.

libavcodec silently ignores unknown options and some bad values; checking names, choices and
ranges against the codec's own option table turns a typo into an error at start, and lets CI
check the NVENC settings on a machine with no NVIDIA GPU.
"""

from __future__ import annotations

from typing import Any

import av

_BOOL_WORDS = {"0", "1", "true", "false", "auto"}


def _check_value(option: Any, value: str) -> str | None:
    kind = option.type.name
    choices = {c.name for c in option.choices or ()}
    if value in choices:
        return None
    if kind == "BOOL":
        return None if value.lower() in _BOOL_WORDS else f"expects a boolean, got {value!r}"
    if kind in ("INT", "INT64", "UINT", "UINT64", "DOUBLE", "FLOAT"):
        try:
            number = float(value)
        except ValueError:
            known = f" (one of {', '.join(sorted(choices))})" if choices else ""
            return f"expects a number{known}, got {value!r}"
        if not option.min <= number <= option.max:
            return f"{value} is outside {option.min:g}..{option.max:g}"
        return None
    if kind == "FLAGS":
        names = {c.name for c in option.choices or ()}
        parts = [p.lstrip("+-") for p in value.replace("-", "+-").split("+") if p.lstrip("+-")]
        unknown = [p for p in parts if p not in names]
        return f"unknown flags {unknown}" if unknown else None
    return None  # strings, dictionaries: the codec parses them itself


def invalid_options(codec_name: str, options: dict[str, str]) -> list[str]:
    """Human-readable problems with `options` for encoder `codec_name` (empty: all valid)."""
    ctx = av.CodecContext.create(codec_name, "w")
    # a codec's private option wins over a generic one of the same name (e.g. `profile`)
    table = {o.name: o for o in (*ctx.supported_options.generic, *ctx.supported_options.private)}
    problems = []
    for name, value in options.items():
        option = table.get(name)
        if option is None:
            problems.append(f"{codec_name}: unknown option {name!r}")
            continue
        problem = _check_value(option, str(value))
        if problem:
            problems.append(f"{codec_name}: option {name!r} {problem}")
    return problems
