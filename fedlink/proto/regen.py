"""Regenerate the committed protobuf/gRPC code from ``protos/`` (``make proto``).

The generated modules live in ``fedlink/proto/v1``. ``protos/fedlink/v1`` is mapped onto the
virtual import path ``fedlink/proto/v1`` so that the generated ``*_pb2_grpc.py`` imports its
``*_pb2`` sibling by its real package path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO_ROOT / "protos" / "fedlink" / "v1"
VIRTUAL_DIR = "fedlink/proto/v1"


def generate(out_root: Path) -> list[Path]:
    """Run protoc on every ``.proto`` of v1, writing under ``out_root``; returns the files."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(PROTO_DIR.glob("*.proto"))
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{VIRTUAL_DIR}={PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[f"{VIRTUAL_DIR}/{p.name}" for p in protos],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed; see its message above")
    out_dir = out_root / VIRTUAL_DIR
    (out_dir / "__init__.py").touch()
    return sorted(p for p in out_dir.iterdir() if p.suffix in {".py", ".pyi"})


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: regenerate in place (or into ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
