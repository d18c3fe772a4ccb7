"""Launch a fleet of ``fedlink client`` processes against one coordinator and wait for them.

    python clients/fleet/launch.py --config examples/digits_fedavg.toml --server HOST:PORT
    python clients/fleet/launch.py --config examples/digits_fedavg.toml --with-coordinator
    python clients/fleet/launch.py --config examples/digits_fedavg.toml \
        --server-template 127.0.0.1:{port} --port-base 7000     # client k -> port 7000 + k
    python clients/fleet/launch.py --config examples/digits_fedavg.toml --servers-file FILE

Per-client endpoints put each client behind its own injector (``fedlink netem proxy``, one
port per client): ``--server-template`` with ``{port}`` (``--port-base`` + the client's
position in the fleet) and/or ``{index}`` (its data partition), or ``--servers-file`` with one
``HOST:PORT`` per line (blank lines and ``#`` comments skipped), line k for the k-th client.

Client ``i`` runs ``python -m fedlink client --index i --name fleet-i`` on partition ``i`` of
the config's data. With ``--with-coordinator`` the launcher first starts ``fedlink serve`` on
a free port and waits until its ``grpc.health.v1`` check answers SERVING; over TLS when the
config enables ``[coordinator.tls]`` or ``--tls-ca`` is given, trusting ``--tls-ca`` and showing
``--tls-cert``/``--tls-key`` to a coordinator that requires mutual TLS. ``--tls-*`` are passed on
to every client. SIGINT and SIGTERM are forwarded to every child. At the end it prints each
process's exit code and the tail of its output, and exits non-zero if any process failed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

LISTENING = re.compile(r"listening on (\S+):(\d+)")
POLL_S = 0.1
TERM_GRACE_S = 5.0
EXIT_FAILED = 1


@dataclass
class Child:
    """One child process, with a thread that keeps the tail of its output."""

    name: str
    process: subprocess.Popen[str]
    tail: collections.deque[str]
    echo: bool
    watch: re.Pattern[str] | None = None
    found: re.Match[str] | None = None
    stopped: str | None = None
    output_changed: threading.Condition = field(default_factory=threading.Condition)
    reader: threading.Thread | None = None

    @classmethod
    def spawn(cls, name: str, argv: Sequence[str], tail_lines: int, echo: bool,
              watch: re.Pattern[str] | None = None) -> Child:
        """Start ``argv`` in its own session (signals reach it only through the launcher).

        The first output line matching ``watch`` is kept in ``found``.
        """
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, bufsize=1, env=env,
                                   start_new_session=True)
        child = cls(name, process, collections.deque(maxlen=max(tail_lines, 1)), echo, watch)
        child.reader = threading.Thread(target=child._read, name=f"read-{name}", daemon=True)
        child.reader.start()
        return child

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.output_changed:
                self.tail.append(line.rstrip("\n"))
                if self.watch is not None and self.found is None:
                    self.found = self.watch.search(line)
                self.output_changed.notify_all()
            if self.echo:
                print(f"[{self.name}] {line}", end="", flush=True)
        with self.output_changed:
            self.output_changed.notify_all()

    @property
    def running(self) -> bool:
        """Whether the process has not exited yet."""
        return self.process.poll() is None

    def send(self, signum: int) -> None:
        """Send ``signum`` to the process if it is still running."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def finish(self, grace_s: float) -> int:
        """Wait up to ``grace_s`` for the exit, then SIGTERM, then SIGKILL; the exit code."""
        for stop in (None, signal.SIGTERM, signal.SIGKILL):
            if stop is not None:
                print(f"launcher: {self.name} still running; sending {stop.name}", flush=True)
                self.send(stop)
            try:
                self.process.wait(timeout=grace_s if stop is None else TERM_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process.wait()
        if self.reader is not None:
            self.reader.join(timeout=2.0)
        return int(self.process.returncode)

    def wait_found(self, timeout_s: float) -> re.Match[str] | None:
        """The first line matching ``watch``; None if the output ends or time is up first."""
        deadline = time.monotonic() + timeout_s
        with self.output_changed:
            while True:
                left = deadline - time.monotonic()
                if self.found or left <= 0 or not self._reading():
                    return self.found
                self.output_changed.wait(min(left, POLL_S))

    def _reading(self) -> bool:
        return self.reader is not None and self.reader.is_alive()


class Fleet:
    """The launched processes, the signal forwarding, and the final report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.coordinator: Child | None = None
        self.clients: list[Child] = []
        self.caught: int | None = None
        self._coordinator_done_at: float | None = None

    # -- signals ---------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """Forward SIGINT and SIGTERM to every child; remember the first one caught."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.caught is None:
            self.caught = signum
        # os.write, not print: a handler must not re-enter a buffered stream mid-write.
        os.write(sys.stderr.fileno(),
                 f"launcher: {signal.Signals(signum).name}: forwarding to children\n".encode())
        for child in self.children:
            child.send(signum)

    @property
    def children(self) -> list[Child]:
        """The coordinator (if launched) and the clients."""
        return ([self.coordinator] if self.coordinator else []) + self.clients

    # -- starting ----------------------------------------------------------------------------

    def fedlink(self, *argv: str) -> list[str]:
        """``python -m fedlink ARGV``, with the launcher's verbosity."""
        return [self.args.python, "-m", "fedlink", *(["-v"] * self.args.verbose), *argv]

    def start_coordinator(self) -> str:
        """Start ``fedlink serve`` on a free port; its address once it is SERVING."""
        a = self.args
        argv = ["serve", "--config", str(a.config), "--host", a.host, "--port", "0"]
        if a.output_dir is not None:
            argv += ["--output-dir", str(a.output_dir)]
        self.coordinator = Child.spawn("coordinator", self.fedlink(*argv), a.tail, a.echo,
                                       watch=LISTENING)
        match = self.coordinator.wait_found(a.startup_timeout)
        if match is None:
            raise RuntimeError("interrupted" if self.caught else
                               "the coordinator did not start (see its output below)")
        host = "127.0.0.1" if match[1] in ("0.0.0.0", "[::]", "::") else match[1]
        address = f"{host}:{match[2]}"
        tls = a.tls_files  # set whenever the config enables TLS (``parse_args`` sees to it)
        wait_serving(address, a.startup_timeout, tls)
        over = "" if tls is None else " (TLS)"
        print(f"launcher: coordinator SERVING on {address}{over}", flush=True)
        return address

    def start_clients(self, servers: Sequence[str]) -> None:
        """Start one ``fedlink client`` per index, client k against ``servers[k]``."""
        a = self.args
        for index, server in zip(range(a.first_index, a.first_index + a.clients), servers,
                                 strict=True):
            if self.caught is not None:
                return
            name = f"{a.name_prefix}-{index}"
            argv = ["client", "--server", server, "--config", str(a.config),
                    "--index", str(index), "--name", name]
            if a.token:
                argv += ["--token", a.token]
            for flag, path in (("--tls-ca", a.tls_ca), ("--tls-cert", a.tls_cert),
                               ("--tls-key", a.tls_key)):
                if path:
                    argv += [flag, path]
            self.clients.append(Child.spawn(name, self.fedlink(*argv), a.tail, a.echo))
        where = servers[0] if len(set(servers)) == 1 else f"{len(set(servers))} endpoints"
        print(f"launcher: started {len(self.clients)} clients against {where}", flush=True)

    # -- waiting -----------------------------------------------------------------------------

    def supervise(self) -> None:
        """Wait for the clients; stop them on a timeout or once the coordinator is gone."""
        deadline = None if self.args.timeout is None else time.monotonic() + self.args.timeout
        while any(c.running for c in self.clients):
            if self.caught is not None:  # forwarded: ``finish`` gives them --grace, then stops them
                return
            reason = self._stop_reason(deadline)
            if reason is not None:
                print(f"launcher: {reason}; stopping the fleet", flush=True)
                self.stop_all(reason)
                return
            time.sleep(POLL_S)

    def _stop_reason(self, deadline: float | None) -> str | None:
        """Why the fleet should stop now, or None to keep waiting."""
        now = time.monotonic()
        if deadline is not None and now > deadline:
            return "timed out"
        c = self.coordinator
        if c is None or c.running:
            return None
        if c.process.returncode != 0:
            return "the coordinator failed"
        if self._coordinator_done_at is None:
            self._coordinator_done_at = now
        if now - self._coordinator_done_at > self.args.grace:
            return f"the coordinator finished more than {self.args.grace:g} s ago"
        return None

    def stop_all(self, reason: str) -> None:
        """SIGTERM every running child, noting why (they are reaped by ``finish``)."""
        for child in self.children:
            if child.running:
                child.stopped = reason
                child.send(signal.SIGTERM)

    def finish(self) -> dict[str, int]:
        """Reap every child: clients first, then the coordinator; exit codes by name."""
        codes = {c.name: c.finish(self.args.grace) for c in self.clients}
        if self.coordinator is not None:
            codes[self.coordinator.name] = self.coordinator.finish(self.args.coordinator_grace)
        return codes

    def report(self, codes: dict[str, int]) -> None:
        """Print each process's exit code and the tail of its output."""
        for child in self.children:
            code = codes[child.name]
            note = "" if code == 0 else " (FAILED)"
            if child.stopped:
                note += f" (stopped by the launcher: {child.stopped})"
            print(f"--- {child.name}: exit {code}{note}")
            for line in child.tail:
                print(f"    {line}")
        failed = sum(code != 0 for code in codes.values())
        print(f"launcher: {len(codes) - failed}/{len(codes)} processes succeeded", flush=True)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for a TLS health check: the CA to trust (empty: the system's roots) and, for
    a coordinator that requires mutual TLS, a client certificate and its key."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        """``grpc.ChannelCredentials`` from the files (``RuntimeError`` if one is unreadable)."""
        import grpc

        def read(path: str, flag: str) -> bytes | None:
            if not path:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise RuntimeError(f"{flag} {path}: {exc.strerror}") from None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file, "--tls-ca"),
            private_key=read(self.key_file, "--tls-key"),
            certificate_chain=read(self.cert_file, "--tls-cert"))


def wait_serving(address: str, timeout_s: float, tls: TLSFiles | None = None) -> None:
    """Poll ``grpc.health.v1.Health/Check`` at ``address`` until it answers SERVING.

    With ``tls`` the check runs over TLS (the only way to reach a coordinator serving TLS).
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    channel = (grpc.insecure_channel(address) if tls is None
               else grpc.secure_channel(address, tls.credentials()))
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        while True:
            try:
                reply = stub.Check(request, timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                over = ("over plaintext" if tls is None else
                        f"over TLS (CA {tls.ca_file or 'the system roots'}"
                        f"{', client certificate ' + tls.cert_file if tls.cert_file else ''})")
                raise RuntimeError(f"no SERVING health check from {address} in {timeout_s} s "
                                   f"{over}")
            time.sleep(POLL_S)


@dataclass(frozen=True)
class CoordinatorTLS:
    """What a config's ``[coordinator.tls]`` asks of clients."""

    enabled: bool = False  # the coordinator serves TLS (cert_file is set)
    mutual: bool = False  # ...and requires client certificates (client_ca_file is set)


def configured_tls(config: Path) -> CoordinatorTLS:
    """``[coordinator.tls]`` of an experiment TOML file (plaintext when absent)."""
    with config.open("rb") as fh:
        tls = tomllib.load(fh).get("coordinator", {}).get("tls", {})
    return CoordinatorTLS(enabled=bool(tls.get("cert_file")),
                          mutual=bool(tls.get("cert_file") and tls.get("client_ca_file")))


def configured_clients(config: Path) -> int:
    """``[data] clients`` of an experiment TOML file (fedlink's default, 10, when absent)."""
    with config.open("rb") as fh:
        return int(tomllib.load(fh).get("data", {}).get("clients", 10))


def build_parser() -> argparse.ArgumentParser:
    """The launcher's command line."""
    p = argparse.ArgumentParser(description="run N fedlink client processes")
    p.add_argument("--config", type=Path, required=True, help="experiment TOML file")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="coordinator address, HOST:PORT")
    where.add_argument("--with-coordinator", action="store_true",
                       help="also start `fedlink serve` on a free port")
    where.add_argument("--server-template", metavar="TEMPLATE",
                       help="per-client address, e.g. 127.0.0.1:{port} ({port}: --port-base + "
                            "the client's position; {index}: its data partition)")
    where.add_argument("--servers-file", type=Path, metavar="FILE",
                       help="one HOST:PORT per line, line k for the k-th client")
    p.add_argument("--port-base", type=int, default=None,
                   help="--server-template: the first client's {port}")
    p.add_argument("--clients", type=int, default=None,
                   help="client processes to start (default: [data] clients - first index)")
    p.add_argument("--first-index", type=int, default=0,
                   help="data partition of the first client (to split a fleet over machines)")
    p.add_argument("--name-prefix", default="fleet", help="clients are named PREFIX-INDEX")
    p.add_argument("--token", default="", help="join token, if the coordinator needs one")
    p.add_argument("--tls-ca", default="", metavar="PEM",
                   help="connect over TLS, trusting this CA for the coordinator's certificate")
    p.add_argument("--tls-cert", default="", metavar="PEM",
                   help="client certificate for mutual TLS (with --tls-key)")
    p.add_argument("--tls-key", default="", metavar="PEM", help="its private key")
    p.add_argument("--host", default="127.0.0.1", help="--with-coordinator: listen address")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="--with-coordinator: run folder parent (default: [run] output_dir)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop the fleet after this many seconds (default: no limit)")
    p.add_argument("--startup-timeout", type=float, default=60.0,
                   help="seconds to wait for the coordinator to be SERVING")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds a signalled client gets to exit before it is killed")
    p.add_argument("--coordinator-grace", type=float, default=30.0,
                   help="seconds the coordinator gets to finish after the clients")
    p.add_argument("--tail", type=int, default=5, help="output lines reported per process")
    p.add_argument("--echo", action="store_true", help="stream children's output, prefixed")
    p.add_argument("--python", default=sys.executable, help="interpreter for the children")
    p.add_argument("-v", "--verbose", action="count", default=0, help="passed to fedlink")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and complete the arguments (``--clients`` defaults from the config)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.config.is_file():
        parser.error(f"config file not found: {args.config}")
    if args.clients is None:
        args.clients = configured_clients(args.config) - args.first_index
    if args.clients < 1 or args.first_index < 0:
        parser.error("need --clients >= 1 and --first-index >= 0")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together: give both or neither")
    if not args.with_coordinator:
        try:
            endpoints(args)
        except (ValueError, OSError, KeyError, IndexError) as exc:
            parser.error(str(exc))
    for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert),
                       ("--tls-key", args.tls_key)):
        if path and not Path(path).is_file():
            parser.error(f"{flag} file not found: {path}")
    args.tls_files = (TLSFiles(args.tls_ca, args.tls_cert, args.tls_key)
                      if args.tls_ca or args.tls_cert else None)
    if args.with_coordinator:
        tls = configured_tls(args.config)
        # `fedlink client` speaks TLS only when given --tls-ca or a certificate.
        if tls.enabled and args.tls_files is None:
            parser.error("the config enables [coordinator.tls]: pass --tls-ca (the CA that "
                         "signed its certificate) so the health check and the clients use TLS")
        if tls.mutual and not args.tls_cert:
            parser.error("the config requires mutual TLS ([coordinator.tls] client_ca_file): "
                         "pass --tls-cert and --tls-key")
    return args


def endpoints(args: argparse.Namespace) -> list[str]:
    """The address of each client (``--server``, ``--server-template`` or ``--servers-file``);
    ``ValueError`` says what is wrong."""
    if args.servers_file is not None:
        lines = [line.split("#", 1)[0].strip()
                 for line in args.servers_file.read_text().splitlines()]
        found = [line for line in lines if line]
        if len(found) < args.clients:
            raise ValueError(f"--servers-file {args.servers_file} lists {len(found)} endpoints "
                             f"for {args.clients} clients")
        return found[:args.clients]
    if args.server_template is not None:
        template = args.server_template
        if "{port}" in template and args.port_base is None:
            raise ValueError("--server-template with {port} needs --port-base")
        if "{port}" not in template and "{index}" not in template:
            raise ValueError("--server-template needs {port} or {index}")
        return [template.format(port=(args.port_base or 0) + k, index=args.first_index + k)
                for k in range(args.clients)]
    return [args.server] * args.clients


def run(fleet: Fleet) -> None:
    """Start the coordinator (if asked) and the clients, and wait for the clients."""
    if fleet.args.with_coordinator:
        servers = [fleet.start_coordinator()] * fleet.args.clients
    else:
        servers = endpoints(fleet.args)
    if fleet.caught is None:
        fleet.start_clients(servers)
        fleet.supervise()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: 0 when every process exited 0; non-zero otherwise."""
    fleet = Fleet(parse_args(argv))
    fleet.install_signal_handlers()
    error = None
    try:
        run(fleet)
    except RuntimeError as exc:
        error = str(exc)
        fleet.stop_all(error)
    finally:
        codes = fleet.finish()
    fleet.report(codes)
    if error:
        print(f"launcher: error: {error}", file=sys.stderr)
    if fleet.caught is not None:
        return 128 + fleet.caught
    return EXIT_FAILED if error or any(codes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
