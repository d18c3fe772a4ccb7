"""``fedlink token issue``: sign a per-client token with the coordinator's secret."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_TTL_S = 30 * 86_400


def add_token_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``token`` (with its ``issue`` subcommand) to the ``fedlink`` command."""
    p = sub.add_parser("token", help="per-client tokens for a coordinator with [coordinator.auth]")
    actions = p.add_subparsers(dest="token_command", required=True)
    issue = actions.add_parser(
        "issue", help="print a token for one client",
        description="Print an HMAC-signed token naming CLIENT, valid for --ttl-s seconds. "
                    "The client passes it as its token (fedlink client --token, "
                    "ClientOptions.token); it grants acting as CLIENT until it expires.")
    issue.add_argument("--client", required=True, help="the client's name (bound to its id)")
    issue.add_argument("--ttl-s", type=float, default=DEFAULT_TTL_S,
                       help=f"seconds the token stays valid (default {DEFAULT_TTL_S}: 30 days)")
    source = issue.add_mutually_exclusive_group(required=True)
    source.add_argument("--secret-file", type=Path,
                        help="file holding the secret ([coordinator.auth] secret_file)")
    source.add_argument("--secret-env", metavar="VAR",
                        help="environment variable holding the secret (secret_env)")
    issue.set_defaults(func=_issue)


def _issue(args: argparse.Namespace) -> int:
    from fedlink.coordinator.auth import issue_token, load_secret

    secret = load_secret(str(args.secret_file or ""), args.secret_env or "")
    print(issue_token(secret, args.client, args.ttl_s), flush=True)
    return 0
