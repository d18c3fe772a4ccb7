"""A virtual simulation's process loads none of the gRPC server's stack: no grpc, no protobuf,
no JWT library (and the cryptography package behind it). A small ``fedlink simulate`` run pays
its imports whole, and a virtual run has no socket, no message to encode and no token to
check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SERVER_STACK = ("grpc", "google", "jwt", "cryptography")

CONFIG = """
[run]
name = "light"
seed = 0
mode = "virtual"

[coordinator]
rounds = 2

[coordinator.flush]
goal = 4
deadline_s = 0

[virtual]
population = 8
"""


def test_a_virtual_simulate_process_loads_no_grpc_protobuf_or_jwt(tmp_path: Path) -> None:
    config = tmp_path / "light.toml"
    config.write_text(CONFIG)
    code = ("import json, sys\n"
            "from fedlink.cli import main\n"
            f"code = main(['simulate', {str(config)!r}, '--no-progress', '--no-report',\n"
            f"             '--output-dir', {str(tmp_path / 'runs')!r}])\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & set(%r))\n"
            "print(json.dumps({'code': code, 'loaded': loaded}))\n" % (SERVER_STACK,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer == {"code": 0, "loaded": []}
    assert (tmp_path / "runs" / "light" / "summary.json").is_file()  # the run did happen
