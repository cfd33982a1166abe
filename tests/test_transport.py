"""The transport's check that aiortc is the release its patches were checked against."""

from __future__ import annotations

import logging

import pytest

from render_server import transport
from render_server.transport import AIORTC_CHECKED, check_aiortc_version


@pytest.fixture(autouse=True)
def fresh_warnings() -> None:
    transport._warn_unchecked.cache_clear()  # each test sees the first warning of its own


def test_the_installed_aiortc_is_the_checked_release() -> None:
    assert check_aiortc_version(), "pyproject.toml pins the release the patches were checked on"


def test_patch_releases_of_the_checked_one_pass_quietly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="render_server.transport"):
        assert check_aiortc_version(AIORTC_CHECKED)
        assert check_aiortc_version(f"{AIORTC_CHECKED}.7")
    assert caplog.records == []


def test_another_release_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="render_server.transport"):
        assert not check_aiortc_version("1.17.0")
        assert not check_aiortc_version("1.17.0")  # every session asks; the log says it once
        assert not check_aiortc_version(f"{AIORTC_CHECKED}0")  # 1.160 is not 1.16
    records = [r for r in caplog.records if r.name == "render_server.transport"]
    assert [r.getMessage() for r in records] == ["transport.aiortc_unchecked"] * 2
    assert records[0].__dict__["installed"] == "1.17.0"
    assert records[0].__dict__["checked"] == AIORTC_CHECKED
