"""The NVENC settings are valid AVOptions of PyAV's NVENC encoders (checked without a GPU)."""

from __future__ import annotations

import pytest

from render_server.encode.nvenc import NVENC_CODECS, nvenc_options
from render_server.encode.options import invalid_options
from render_server.encode.x264 import x264_options


@pytest.mark.parametrize("codec", sorted(NVENC_CODECS))
@pytest.mark.parametrize("intra_refresh", [False, True])
@pytest.mark.parametrize("preset", ["p1", "p4"])
def test_nvenc_options_are_valid(codec: str, intra_refresh: bool, preset: str) -> None:
    encoder_name, _ = NVENC_CODECS[codec]  # type: ignore[index]
    options = nvenc_options(codec, preset, intra_refresh)  # type: ignore[arg-type]
    assert (
        invalid_options(encoder_name, {**options, "maxrate": "4000000", "bufsize": "133333"}) == []
    )


def test_nvenc_options_say_what_low_latency_needs() -> None:
    options = nvenc_options("h264")
    assert options["tune"] == "ull" and options["rc"] == "cbr"
    assert options["zerolatency"] == "1" and options["delay"] == "0"
    assert options["forced-idr"] == "1" and options["rc-lookahead"] == "0"
    assert options["profile"] == "baseline"  # what aiortc's SDP promises


def test_x264_options_are_valid() -> None:
    assert invalid_options("libx264", x264_options()) == []


def test_the_checker_catches_mistakes() -> None:
    problems = invalid_options(
        "h264_nvenc",
        {"tune": "ulll", "zerolatency": "maybe", "preset": "p9", "bogus": "1", "delay": "-1"},
    )
    assert len(problems) == 5
    assert any("unknown option 'bogus'" in p for p in problems)
    assert any("'tune'" in p and "ull" in p for p in problems)  # names the valid choices
