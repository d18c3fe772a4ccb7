"""The committed generated protobuf code matches what ``make proto`` produces from protos/."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedlink.proto.v1
from fedlink.proto.regen import generate

pytest.importorskip("grpc_tools", reason="grpcio-tools (a dev dependency) regenerates the code")

COMMITTED = Path(fedlink.proto.v1.__file__).parent


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    fresh = [p for p in generate(tmp_path) if p.name != "__init__.py"]
    assert {"coordinator_pb2.py", "coordinator_pb2_grpc.py"} <= {p.name for p in fresh}
    stale = [p.name for p in fresh
             if not (COMMITTED / p.name).exists()
             or (COMMITTED / p.name).read_bytes() != p.read_bytes()]
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
