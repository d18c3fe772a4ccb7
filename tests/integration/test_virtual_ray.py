"""``[run] backend = "ray"``: clients trained by Ray actors give the run the loop alone gives.

An actor trains the same client from the same model with the same plan as the loop's process,
and the loop takes results in model-time order, so a run on two Ray actors must accept the
same updates in the same order and end at the same model as one without workers. Ray starts
once for the file (a local Ray on 127.0.0.1, as the backend starts it); a run that finds Ray
running uses it and leaves it running.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import accepted_updates, virtual_backend_config

# not imported here: Ray reads its loopback-only switch when first imported (start_ray sets it)
if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed (the 'ray' extra: pip install 'fedlink[ray]')",
                allow_module_level=True)
pytest.importorskip("torch")
# the bound of a wait, not a timing: beside a busy suite and two busy loops, each actor took
# 6 minutes to import torch and build its population (18 s for the whole file on a quiet box)
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]

ACTORS = 2


GCS_WAIT = "RAY_gcs_server_port_wait_time_s"
"""How long Ray waits for its GCS server to publish its port (30 s by default: on a loaded
machine the GCS took longer, and Ray gave up with "Timed out waiting for file
.../gcs_server_port_...")."""
SLOW_START = ("timed out", "timeout")


def _start_local_ray() -> bool:
    """``start_ray`` as the backend calls it, given time to start on a loaded machine: the GCS
    wait lengthened (unless the caller set it), and one more try after a start that timed
    out. A Ray that cannot start twice in a row skips the file, saying why; any other error
    (fedlink's own, such as a Ray not on loopback) fails."""
    from fedlink.sim.virtual.backends.ray_actors import start_ray

    os.environ.setdefault(GCS_WAIT, "180")
    failures: list[str] = []
    for _ in range(2):
        try:
            return start_ray("", ACTORS)
        except Exception as exc:
            if not any(word in str(exc).lower() for word in SLOW_START):
                raise
            failures.append(f"{type(exc).__name__}: {exc}")
            import ray

            ray.shutdown()  # what a half-started Ray left, before the next try
    pytest.skip(f"Ray could not start twice in a row: {failures}")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray for the file, started the way the backend starts its own."""
    started = _start_local_ray()
    yield
    if started:
        import ray

        ray.shutdown()



def test_two_ray_actors_give_the_same_run_as_the_loop_alone(tmp_path: Path,
                                                            local_ray: None) -> None:
    from fedlink.sim import run_simulation

    alone = run_simulation(virtual_backend_config(0, "alone"), tmp_path, progress=False)
    actors = run_simulation(virtual_backend_config(ACTORS, "actors", "ray"), tmp_path,
                            progress=False)
    assert len(accepted_updates(alone.run_dir)) >= 3 * 4
    assert alone.summary["training_backend"] == "inline"
    assert actors.summary["training_backend"] == "ray"
    assert actors.summary["training_processes"] == ACTORS  # both actors trained clients
    assert accepted_updates(actors.run_dir) == accepted_updates(alone.run_dir)
    np.testing.assert_allclose(np.load(actors.run_dir / "model.npy"),
                               np.load(alone.run_dir / "model.npy"), atol=1e-6)
    assert actors.summary["final_accuracy"] == pytest.approx(alone.summary["final_accuracy"])
    import ray

    assert ray.is_initialized()  # the run found Ray running: it left it so


def test_the_local_ray_listens_and_talks_on_loopback_only(local_ray: None) -> None:
    import ray

    psutil = pytest.importorskip("psutil")
    assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"
    ray_processes = psutil.Process().children(recursive=True)
    assert ray_processes  # the Ray this file started: GCS, raylet, workers
    sockets = [c for p in ray_processes for c in _inet_connections(p)]
    listening = {c.laddr.ip for c in sockets if c.status == psutil.CONN_LISTEN}
    peers = {c.raddr.ip for c in sockets if c.raddr}
    assert listening and all(map(_loopback, listening)), listening
    assert all(map(_loopback, peers)), peers


def _loopback(ip: str) -> bool:
    """127.0.0.0/8 or ::1, also written IPv4-mapped (``::ffff:127.0.0.1``)."""
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)
    return bool((mapped or address).is_loopback)


def _inet_connections(process: Any) -> list[Any]:
    import psutil

    try:
        return list(process.net_connections(kind="inet"))
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # a worker that has just exited
        return []
