"""Options of the designers' uploads (`serve` and `signaling`): where they are kept, how long,
and how much of them one owner may keep. The size of one upload is `--max-scene-bytes`, which
`serve` has among its worker's options and `signaling` gets here."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from render_server.cli.option_values import env
from render_server.config import ServerConfig, default_scene_dir

SERVER = ServerConfig()


def scene_options(p: argparse.ArgumentParser, with_max_bytes: bool) -> None:
    c = SERVER
    g = p.add_argument_group("uploaded scenes (POST /api/scenes)")
    g.add_argument(
        "--scene-dir", type=Path, default=env("scene_dir", default_scene_dir()), metavar="DIR",
        help="keep designers' uploaded models here; replicas (and workers reading the folder) "
        "share it (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--scene-retention", type=float,
        default=env("scene_retention", c.scene_retention_s), metavar="SECONDS",
        help="delete an uploaded scene this long after its upload (%(default)s s)",
    )  # fmt: skip
    g.add_argument(
        "--scene-quota", type=int, default=env("scene_quota", c.scene_quota_bytes),
        metavar="BYTES", help="bytes of uploaded scenes one owner may keep (%(default)s)",
    )  # fmt: skip
    g.add_argument(
        "--max-scenes-per-owner", type=int,
        default=env("max_scenes_per_owner", c.max_scenes_per_owner), metavar="N",
        help="uploaded scenes one owner may keep (%(default)s)",
    )  # fmt: skip
    if with_max_bytes:  # serve has it among its worker's options
        g.add_argument(
            "--max-scene-bytes", type=int, default=env("max_scene_bytes", c.max_scene_bytes),
            help="refuse uploaded files larger than this (%(default)s)",
        )  # fmt: skip


def scene_fields(args: argparse.Namespace, with_max_bytes: bool) -> dict[str, Any]:
    """The ServerConfig fields of `scene_options`."""
    fields: dict[str, Any] = {
        "scene_dir": args.scene_dir,
        "scene_retention_s": args.scene_retention,
        "scene_quota_bytes": args.scene_quota,
        "max_scenes_per_owner": args.max_scenes_per_owner,
    }
    if with_max_bytes:
        fields["max_scene_bytes"] = args.max_scene_bytes
    return fields
