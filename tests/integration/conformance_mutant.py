"""The edge client (``clients/edge``) with one protocol behaviour broken on purpose.

``python conformance_mutant.py MUTANT EDGE-CLIENT-ARGS...`` runs the edge client with the
mutation ``MUTANT`` applied to the SDK in this process only: the conformance check must fail
every one of them (``test_conformance_mutants.py``). Each mutation is the smallest change that
breaks one behaviour of ``docs/protocol.md``; ``honest`` changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "edge"))

import edge_client

from fedlink.client import retry, session, transfer
from fedlink.client.transport import Transport
from fedlink.compress import sparse
from fedlink.compress.quantize import StochasticQuantizer, unpack_codes
from fedlink.errors import DataLoss, RemoteError, Unavailable, UpdateRefused
from fedlink.messages import SecureUnmaskReply, UploadChunk
from fedlink.wire import payload

MUTANTS: dict[str, Callable[[], None]] = {}


def mutant(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Register the mutation ``name``."""

    def register(fn: Callable[[], None]) -> Callable[[], None]:
        MUTANTS[name] = fn
        return fn

    return register


def wrap(cls: type, method: str, make: Callable[[Any], Any]) -> None:
    """Replace ``cls.method`` with ``make(original)``."""
    setattr(cls, method, make(getattr(cls, method)))


@mutant("honest")
def _honest() -> None:
    """No change."""


@mutant("restart_download")
def _restart_download() -> None:
    """After a cut download, start again from offset 0 (keep nothing)."""

    def receive(make: Any) -> Any:
        async def _receive(self: Any, request: Any, buffer: bytearray, total: int) -> None:
            buffer.clear()
            await make(self, dataclasses.replace(request, offset=0), buffer, total)
        return _receive

    wrap(transfer.Transfers, "_receive", receive)


@mutant("restart_upload")
def _restart_upload() -> None:
    """After a cut upload, send it all again without asking ``UploadStatus``."""

    async def held(self: Any, client_id: str, upload_id: str, total: int) -> int:
        return 0

    transfer.Transfers._held = held  # type: ignore[method-assign]


@mutant("drop_on_lost_reply")
def _drop_on_lost_reply() -> None:
    """A ``Commit`` whose reply is lost is given up, not repeated with the same id."""

    def make(original: Any) -> Any:
        async def commit(self: Transport, request: Any) -> Any:
            try:
                return await original(self, request)
            except Unavailable as err:
                raise UpdateRefused(f"mutant: giving up after {err.code}") from err
        return commit

    wrap(Transport, "commit", make)


@mutant("reuse_upload_id")
def _reuse_upload_id() -> None:
    """After ``DATA_LOSS``, upload and commit under the same upload id again."""

    def make(original: Any) -> Any:
        async def commit(self: Transport, request: Any) -> Any:
            try:
                return await original(self, request)
            except DataLoss:
                first = UploadChunk(request.client_id, request.upload_id, 0, b"\0")
                with contextlib.suppress(RemoteError):
                    await self.upload(iter([first]))
                return await original(self, request)
        return commit

    wrap(Transport, "commit", make)


@mutant("no_delta")
def _no_delta() -> None:
    """Never say which version it holds: never offered a delta, always the full model."""

    def make(original: Any) -> Any:
        async def get_task(self: Transport, request: Any) -> Any:
            return await original(self, dataclasses.replace(request, held_version=-1))
        return get_task

    wrap(Transport, "get_task", make)


@mutant("plain_in_secure")
def _plain_in_secure() -> None:
    """Ignore ``RunConfig.secure``: deliver every update by a plain ``Commit``."""

    def make(original: Any) -> Any:
        async def join(self: Transport, request: Any) -> Any:
            reply = await original(self, request)
            return dataclasses.replace(reply, config=dataclasses.replace(reply.config,
                                                                         secure=None))
        return join

    wrap(Transport, "join", make)


@mutant("no_unmask")
def _no_unmask() -> None:
    """Never send ``SecureUnmask``: take the group's sum as done once the masked update is in
    (the other members' answers unmask it: the coordinator alone cannot tell)."""

    def make(original: Any) -> Any:
        async def secure(self: Transport, name: str, request: Any, phase_s: float) -> Any:
            if name == "Unmask":
                return SecureUnmaskReply()
            return await original(self, name, request, phase_s)
        return secure

    wrap(Transport, "secure", make)


@mutant("drop_on_lost_masked_reply")
def _drop_on_lost_masked_reply() -> None:
    """A ``SecureMasked`` whose reply is lost is given up, not sent again."""

    def make(original: Any) -> Any:
        async def secure(self: Transport, name: str, request: Any, phase_s: float) -> Any:
            try:
                return await original(self, name, request, phase_s)
            except Unavailable as err:
                if name != "Masked":
                    raise
                raise UpdateRefused(f"mutant: giving up after {err.code}") from err
        return secure

    wrap(Transport, "secure", make)


@mutant("no_key_shares")
def _no_key_shares() -> None:
    """Answer the unmask with the survivors' seed shares only, none of a dropped member's key
    (the other members' shares rebuild it: the coordinator alone cannot tell)."""
    from fedlink.client import secure  # needs the secagg extra: only this mutant imports it

    def make(original: Any) -> Any:
        def unmask(self: Any) -> Any:
            return dataclasses.replace(original(self), key_shares=())
        return unmask

    wrap(secure.SecureDelivery, "unmask", make)


@mutant("wrong_mask_sign")
def _wrong_mask_sign() -> None:
    """Add each pairwise mask with the opposite sign (+ where the lower id subtracts): its
    masks no longer cancel, and the group unmasks to a sum no honest members could make."""
    from fedlink.secagg import protocol  # needs the secagg extra: only this mutant imports it

    protocol._sign = lambda i, j: 1 if i > j else -1  # type: ignore[attr-defined]


@mutant("numpy_graph")
def _numpy_graph() -> None:
    """Order the SecAgg+ cycle by numpy's permutation of the ids, the rule before the protocol
    stated one: it looks for other neighbours than the group's graph names (in the
    secure-options scenario's first group, every member's)."""
    from fedlink.secagg import graph  # needs the secagg extra: only this mutant imports it

    def numpy_order(clients: Any, seed: int) -> list[int]:
        ids = sorted(clients)
        return [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]

    graph.cycle_order = numpy_order  # type: ignore[assignment]


@mutant("reveal_both")
def _reveal_both() -> None:
    """Answer the unmask with both secrets of every neighbour, the seed's share and the mask
    key's (the coordinator could then unmask a dropped member's update)."""
    from fedlink.client import secure  # needs the secagg extra: only this mutant imports it
    from fedlink.messages import ShamirShare
    from fedlink.secagg.crypto import element_bytes

    def make(original: Any) -> Any:
        def unmask(self: Any) -> Any:
            request = original(self)
            point = self.client.client + 1
            held = sorted(self.client._held.items())
            return dataclasses.replace(
                request,
                seed_shares=tuple(ShamirShare(o, point, element_bytes(s[0])) for o, s in held),
                key_shares=tuple(ShamirShare(o, point, element_bytes(s[1])) for o, s in held))
        return unmask

    wrap(secure.SecureDelivery, "unmask", make)


@mutant("no_inline")
def _no_inline() -> None:
    """Ignore ``inline_bytes``: every update is uploaded, never inline."""

    def make(original: Any) -> Any:
        async def join(self: Transport, request: Any) -> Any:
            reply = await original(self, request)
            config = dataclasses.replace(reply.config, inline_bytes=0)
            return dataclasses.replace(reply, config=config)
        return join

    wrap(Transport, "join", make)


@mutant("no_heartbeat")
def _no_heartbeat() -> None:
    """Send no ``Heartbeat``."""

    async def heartbeat(self: Any, task: Any) -> None:
        return None

    session.ClientSession._heartbeat = heartbeat  # type: ignore[method-assign]


@mutant("no_leave")
def _no_leave() -> None:
    """Stop at the run's end without ``Leave``."""

    async def leave(self: Any, reason: str) -> None:
        return None

    session.ClientSession._leave = leave  # type: ignore[method-assign]


@mutant("no_verify")
def _no_verify() -> None:
    """Decode a downloaded model without checking its checksums."""

    def unpack(header: Any, data: bytes, size: int, verify: bool = True) -> np.ndarray:
        return payload.unpack(header, data, size, verify=False)

    transfer.unpack = unpack  # type: ignore[assignment]


@mutant("no_evaluate")
def _no_evaluate() -> None:
    """A trainer that cannot evaluate: the ``evaluate`` capability is never advertised."""
    del edge_client.LogisticRegressionTrainer.evaluate


@mutant("decline_evaluations")
def _decline_evaluations() -> None:
    """Score every model NaN, so that every evaluation task is declined, never reported."""

    def evaluate(self: Any, params: np.ndarray) -> dict[str, float]:
        return {"accuracy": float("nan")}

    edge_client.LogisticRegressionTrainer.evaluate = evaluate  # type: ignore[method-assign]


@mutant("no_metrics")
def _no_metrics() -> None:
    """Commit with no metrics."""

    def make(original: Any) -> Any:
        async def commit(self: Transport, request: Any) -> Any:
            return await original(self, dataclasses.replace(request, metrics={}))
        return commit

    wrap(Transport, "commit", make)


@mutant("ignore_retry_hint")
def _ignore_retry_hint() -> None:
    """Back off as for any transient error, ignoring the ``RetryInfo``."""
    retry._honouring_hint = lambda backoff: backoff  # type: ignore[assignment]


@mutant("no_rejoin")
def _no_rejoin() -> None:
    """Give up when the coordinator no longer knows the client (``UNAUTHENTICATED``)."""

    async def next_task(self: Any) -> Any:
        return await self._call(self._get_task, "GetTask")

    session.ClientSession._next_task = next_task  # type: ignore[method-assign]


@mutant("naive_qsgd")
def _naive_qsgd() -> None:
    """``values_checksum`` of a ``qsgd`` update decoded as ``(code - s) * c / s`` in float64
    (the rounding the spec rules out)."""

    def decode(self: Any, data: bytes, params: Any, size: int) -> np.ndarray:
        bits = int(params["bits"])
        s = (1 << (bits - 1)) - 1
        scale = float(np.frombuffer(data[:4], dtype="<f4")[0])
        codes = unpack_codes(data[4:], bits, size).astype(np.float64)
        return ((codes - s) * scale / s).astype(np.float32)

    StochasticQuantizer.decode = decode  # type: ignore[method-assign]


@mutant("numpy_randk")
def _numpy_randk() -> None:
    """``randk`` indices by numpy's 1.0 choice, sent as ``index_rule = "splitmix64"`` (the
    client's own decoding, and so its ``values_checksum``, follows its wrong indices)."""

    def numpy_choice(seed: int, n: int, k: int) -> np.ndarray:
        return np.sort(np.random.Generator(np.random.PCG64(seed)).choice(n, k, replace=False))

    sparse.splitmix_indices = numpy_choice


@mutant("no_values_checksum")
def _no_values_checksum() -> None:
    """Leave ``values_checksum`` empty on every update (the coordinator then cannot see
    whether a lossy update decodes to what the client meant)."""

    def make(original: Any) -> Any:
        async def commit(self: Transport, request: Any) -> Any:
            header = dataclasses.replace(request.update, values_checksum="")
            return await original(self, dataclasses.replace(request, update=header))
        return commit

    wrap(Transport, "commit", make)


@mutant("stop_on_refusal")
def _stop_on_refusal() -> None:
    """Exit (status 4) when an update is refused ``DATA_LOSS`` instead of going on."""

    def make(original: Any) -> Any:
        async def commit(self: Transport, request: Any) -> Any:
            try:
                return await original(self, request)
            except DataLoss:
                sys.exit(4)
        return commit

    wrap(Transport, "commit", make)


@mutant("distrust_delta")
def _distrust_delta() -> None:
    """Never accept a model rebuilt from a delta: always download the full model after it."""
    transfer.rebuilt_matches = lambda model, header: False  # type: ignore[assignment]


@mutant("never_join")
def _never_join() -> None:
    """Exit at once with status 3, never calling the coordinator."""
    sys.exit(3)


@mutant("exit_3")
def _exit_3() -> None:
    """Take part in the whole run, then exit with status 3 (``main`` does)."""


def main() -> int:
    """Apply the mutation named first, then run the edge client with the other arguments."""
    name, *args = sys.argv[1:]
    MUTANTS[name]()
    status = edge_client.main(args)
    return 3 if name == "exit_3" else status


if __name__ == "__main__":
    sys.exit(main())
