"""``fedlink token issue``: mint a per-client JWT for a coordinator with ``[coordinator.auth]``."""

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
        description="Print a JWT naming CLIENT (claim sub), valid for --ttl-s seconds (exp), "
                    "signed HS256 with the coordinator's secret, or ES256/RS256 with a private "
                    "key whose public half the coordinator holds. The client passes it as its "
                    "token (fedlink client --token, ClientOptions.token); it grants acting as "
                    "CLIENT until it expires.")
    issue.add_argument("--client", required=True, help="the client's name (bound to its id)")
    issue.add_argument("--ttl-s", type=float, default=DEFAULT_TTL_S,
                       help=f"seconds the token stays valid (default {DEFAULT_TTL_S}: 30 days)")
    issue.add_argument("--run", default="",
                       help="the one run (coordinator run_name) the token is good for "
                            "(claim run; default: any run)")
    source = issue.add_mutually_exclusive_group(required=True)
    source.add_argument("--secret-file", type=Path,
                        help="HS256: file holding the secret ([coordinator.auth] secret_file)")
    source.add_argument("--secret-env", metavar="VAR",
                        help="HS256: environment variable holding the secret (secret_env)")
    source.add_argument("--private-key", type=Path, metavar="PEM",
                        help="ES256/RS256: the PEM private key to sign with (the coordinator "
                             "holds its public key: public_key_file or jwks_file)")
    issue.add_argument("--algorithm", choices=("ES256", "RS256"), default="ES256",
                       help="with --private-key: the key's algorithm (default ES256)")
    issue.add_argument("--key-id", default="",
                       help="with --private-key: the kid header naming the key in a JWKS file")
    issue.set_defaults(func=_issue)


def _issue(args: argparse.Namespace) -> int:
    from fedlink.coordinator.tokens import issue_token, load_secret
    from fedlink.errors import ConfigError

    if args.private_key is None:
        if args.key_id:
            raise ConfigError("--key-id names a key of a JWKS file: use it with --private-key")
        token = issue_token(load_secret(str(args.secret_file or ""), args.secret_env or ""),
                            args.client, args.ttl_s, run=args.run)
    else:
        try:
            key = args.private_key.read_bytes()
        except OSError as exc:
            raise ConfigError(f"--private-key {args.private_key}: {exc.strerror}") from None
        token = issue_token(key, args.client, args.ttl_s, run=args.run,
                            algorithm=args.algorithm, key_id=args.key_id)
    print(token, flush=True)
    return 0
