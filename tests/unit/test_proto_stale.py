"""The committed generated protobuf code matches what ``make proto`` produces from protos/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fedlink.proto.v1
from fedlink.proto.regen import generate

pytest.importorskip("grpc_tools", reason="grpcio-tools (a dev dependency) regenerates the code")

COMMITTED = Path(fedlink.proto.v1.__file__).parent

_TOOL_VERSION = re.compile(rb"^GRPC_GENERATED_VERSION = '[^']*'$", re.MULTILINE)
"""The grpcio-tools version a generated stub names: a patch release of the tool that made it
(the registry's newest within the pinned range) is not a change of the protocol."""


def _content(path: Path) -> bytes:
    """A generated file's bytes, the generating tool's version left out."""
    return _TOOL_VERSION.sub(b"GRPC_GENERATED_VERSION = ''", path.read_bytes())


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    fresh = [p for p in generate(tmp_path) if p.name != "__init__.py"]
    assert {"coordinator_pb2.py", "coordinator_pb2_grpc.py"} <= {p.name for p in fresh}
    stale = [p.name for p in fresh
             if not (COMMITTED / p.name).exists()
             or _content(COMMITTED / p.name) != _content(p)]
    assert not stale, (
        f"generated protobuf code in fedlink/proto/v1 is stale ({', '.join(stale)}): "
        "the .proto files changed; run `make proto` and commit the result"
    )


def test_no_orphan_generated_files(tmp_path: Path) -> None:
    """A generated module whose .proto was deleted must not linger in the package."""
    fresh = {p.name for p in generate(tmp_path)}
    committed = {p.name for p in COMMITTED.iterdir() if p.suffix in {".py", ".pyi"}}
    orphans = committed - fresh - {"__init__.py"}
    assert not orphans, f"{sorted(orphans)} have no .proto source; delete them and run `make proto`"
