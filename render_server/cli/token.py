"""`render-server token`: mint an access token (JWT) for a worker, controller, viewer or admin."""

from __future__ import annotations

import argparse
import sys

from render_server.cli.option_values import read_secret
from render_server.cli.options import SubParsers, auth_options
from render_server.signaling.auth import ROLES, Authenticator, load_keys

DEFAULT_TTL_S = 3600.0


def add_token(sub: SubParsers) -> None:
    p = sub.add_parser(
        "token",
        help="mint an access token (JWT) for a worker, controller, viewer or admin",
        description="Print a signed token. Browsers pass it to the SDK (`token`), which sends it "
        "as the WebSocket subprotocol bearer.<token>; programs send Authorization: Bearer.",
    )
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--subject", help="who the token stands for (default: a random id)")
    p.add_argument("--ttl", type=float, default=DEFAULT_TTL_S, help="seconds (%(default)s)")
    p.add_argument("--kid", help="which key of --key-file signs it")
    auth_options(p, with_mode=False)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        secret = read_secret(args.secret, args.secret_file, "--secret")
        auth = Authenticator(load_keys(secret, args.key_file))
        print(auth.mint(args.role, args.subject, args.ttl, args.kid))
    except (ValueError, KeyError) as exc:
        print(f"render-server: {exc}", file=sys.stderr)
        return 2
    return 0
