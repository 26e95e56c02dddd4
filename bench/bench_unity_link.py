"""The Unity link's HTTP/2 ends compared: this checkout's own server and client
(`envs.http2`, with every cap), the same ends of an older copy of `envs/` (`--baseline DIR`),
and a server and a client of the same exchange built on python-hyper's `h2` (a sans-IO HTTP/2
state machine; the sockets, select loop and polling as in `envs.http2`). Python's `grpc`
client (gRPC's C core, what a Unity player's `Grpc.Core` wraps) calls each server too.

Each exchange is one Huggy step's size (18 agents: observations up, actions down), lockstep,
no protobuf and no work on either side; the server runs in its own process, in its main thread,
as `envs.lockstep` serves. Every (server, client) pair runs `--runs` times, the pairs
interleaved round by round; each run prints microseconds per exchange and the client's and the
server's CPU per exchange (the server's from /proc). Both ends wait as `envs.spin_wait` says
(`HUGGY_SPIN_WAIT_US`: set it to 0 to compare blocking waits, where CPU is the ends' own work).

    .venv/bin/python bench/bench_unity_link.py [--exchanges 3000] [--runs 3]
        [--baseline DIR]   # DIR holds an older copy of envs/, e.g. made with cp -r envs DIR/
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from proc_cpu import cpu_seconds

REPO = Path(__file__).resolve().parents[1]
AGENTS = 18
UP_BYTES = AGENTS * 59 * 4 + 2_000  # observations, and the rest of the agents' infos
DOWN_BYTES = AGENTS * 21 * 4 + 200  # continuous actions
METHOD = "/communicator_objects.UnityToExternalProto/Exchange"
WARM_UP = 200
SERVERS = ("own", "baseline", "h2")
CLIENTS = ("own", "baseline", "h2", "grpc")


def _import_envs(baseline: str | None) -> None:
    """Put the checkout (or the baseline copy of `envs/`, ahead of it) on the path."""
    sys.path.insert(0, str(REPO))
    if baseline:
        sys.path.insert(0, baseline)


class H2Server:
    """`envs.http2.UnaryServer`'s exchange on `h2`: one path, served in the calling thread,
    the same settings advertised (windows at their widest, 1 MiB frames, 4 streams)."""

    def __init__(self, host: str, port: int, path: str) -> None:
        import h2.config
        import h2.connection
        import h2.events
        import h2.settings

        from envs.spin_wait import SpinWait

        self._h2 = h2
        self._config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self._events = h2.events
        self._settings = h2.settings
        self._path = path.encode("ascii")
        self._listener = socket.create_server((host, port))
        self._connections: dict[int, tuple[socket.socket, Any]] = {}
        self._bodies: dict[tuple[int, int], bytearray] = {}
        self._calls: deque[tuple[int, int, bytes]] = deque()
        self._pending: dict[tuple[int, int], bytes] = {}
        self._taken: tuple[int, int] | None = None
        self._spin = SpinWait()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return host, port

    def _descriptors(self) -> list[int]:
        return [self._listener.fileno(), *self._connections]

    def receive(self) -> bytes:
        if not self._calls:
            with self._spin.waiting(lambda: bool(select.select(self._descriptors(), [], [], 0)[0])):
                while not self._calls:
                    for descriptor in select.select(self._descriptors(), [], [], None)[0]:
                        if descriptor == self._listener.fileno():
                            self._accept()
                        else:
                            self._read(descriptor)
        descriptor, stream, request = self._calls.popleft()
        self._taken = (descriptor, stream)
        return request

    def _accept(self) -> None:
        sock, _ = self._listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = self._h2.connection.H2Connection(self._config)
        codes = self._settings.SettingCodes
        connection.local_settings = self._settings.Settings(client=False, initial_values={
            codes.MAX_CONCURRENT_STREAMS: 4, codes.INITIAL_WINDOW_SIZE: 2**31 - 1,
            codes.MAX_FRAME_SIZE: 1 << 20, codes.MAX_HEADER_LIST_SIZE: 16 << 10})
        connection.max_inbound_frame_size = 1 << 20
        connection.initiate_connection()
        connection.increment_flow_control_window(2**31 - 1 - 65_535)
        sock.sendall(connection.data_to_send())
        self._connections[sock.fileno()] = (sock, connection)

    def _read(self, descriptor: int) -> None:
        sock, connection = self._connections[descriptor]
        data = sock.recv(1 << 18)
        if not data:
            del self._connections[descriptor]
            sock.close()
            return
        events = self._events
        for event in connection.receive_data(data):
            key = (descriptor, getattr(event, "stream_id", 0))
            if isinstance(event, events.RequestReceived):
                path = next(value for name, value in event.headers if name == b":path")
                if path != self._path:
                    connection.send_headers(event.stream_id, [
                        (b":status", b"200"), (b"content-type", b"application/grpc"),
                        (b"grpc-status", b"12")], end_stream=True)
                else:
                    self._bodies[key] = bytearray()
            elif isinstance(event, events.DataReceived):
                if key in self._bodies:
                    self._bodies[key] += event.data
                connection.acknowledge_received_data(event.flow_controlled_length,
                                                     event.stream_id)
            elif isinstance(event, events.StreamEnded) and key in self._bodies:
                self._calls.append((descriptor, event.stream_id, bytes(self._bodies.pop(key)[5:])))
            elif isinstance(event, events.StreamReset):
                self._bodies.pop(key, None)
                self._pending.pop(key, None)
            elif isinstance(event, (events.WindowUpdated, events.RemoteSettingsChanged)):
                for pending in list(self._pending):
                    if pending[0] == descriptor:
                        self._send(connection, pending[1], self._pending.pop(pending))
        sock.sendall(connection.data_to_send())

    def answer(self, response: bytes) -> None:
        assert self._taken is not None
        descriptor, stream = self._taken
        self._taken = None
        sock, connection = self._connections[descriptor]
        connection.send_headers(stream, [(b":status", b"200"),
                                         (b"content-type", b"application/grpc")])
        self._send(connection, stream, len(response).to_bytes(5, "big") + response)
        sock.sendall(connection.data_to_send())

    def _send(self, connection: Any, stream: int, body: bytes) -> None:
        """Send what the windows allow of `body`, then the trailers; the rest waits."""
        while body:
            size = min(connection.local_flow_control_window(stream),
                       connection.max_outbound_frame_size, len(body))
            if size <= 0:
                self._pending[(self._descriptor_of(connection), stream)] = body
                return
            connection.send_data(stream, body[:size])
            body = body[size:]
        connection.send_headers(stream, [(b"grpc-status", b"0")], end_stream=True)

    def _descriptor_of(self, connection: Any) -> int:
        return next(d for d, (_, c) in self._connections.items() if c is connection)


class H2Client:
    """`envs.http2.UnaryClient`'s exchange on `h2`."""

    def __init__(self, host: str, port: int, path: str) -> None:
        import h2.config
        import h2.connection
        import h2.events

        from envs.spin_wait import SpinWait

        self._events = h2.events
        self._socket = socket.create_connection((host, port))
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connection = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None))
        self._connection.initiate_connection()
        self._connection.increment_flow_control_window(2**31 - 1 - 65_535)
        self._socket.sendall(self._connection.data_to_send())
        self._headers = [(b":method", b"POST"), (b":scheme", b"http"),
                         (b":path", path.encode()), (b":authority", f"{host}:{port}".encode()),
                         (b"content-type", b"application/grpc"), (b"te", b"trailers")]
        self._spin = SpinWait()

    def call(self, request: bytes) -> bytes:
        connection = self._connection
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, self._headers)
        connection.send_data(stream, len(request).to_bytes(5, "big") + request, end_stream=True)
        self._socket.sendall(connection.data_to_send())
        answer = bytearray()
        events = self._events
        with self._spin.waiting(lambda: bool(select.select([self._socket], [], [], 0)[0])):
            while True:
                data = self._socket.recv(1 << 18)
                if not data:
                    raise ConnectionError("the server closed the connection")
                ended = False
                for event in connection.receive_data(data):
                    if isinstance(event, events.DataReceived) and event.stream_id == stream:
                        answer += event.data
                        connection.acknowledge_received_data(event.flow_controlled_length,
                                                             stream)
                    elif isinstance(event, events.StreamEnded) and event.stream_id == stream:
                        ended = True
                    elif isinstance(event, events.StreamReset) and event.stream_id == stream:
                        raise ConnectionError("the server reset the call")
                outgoing = connection.data_to_send()
                if outgoing:
                    self._socket.sendall(outgoing)
                if ended:
                    return bytes(answer[5:])

    def close(self) -> None:
        self._socket.close()


def serve(kind: str, baseline: str | None) -> None:
    """Answer `METHOD` on a free port of 127.0.0.1 until killed, after printing "ready PORT"."""
    _import_envs(baseline if kind == "baseline" else None)
    reply = b"a" * DOWN_BYTES
    server: Any
    if kind == "h2":
        server = H2Server("127.0.0.1", 0, METHOD)
    else:
        from envs.http2 import UnaryServer

        try:
            server = UnaryServer("127.0.0.1", 0, METHOD)
        except TypeError:  # an older server: no path
            server = UnaryServer("127.0.0.1", 0)  # type: ignore[call-arg]
    print("ready", server.address[1], flush=True)
    while True:
        server.receive()
        server.answer(reply)


def measure(port: int, exchanges: int, client: str, baseline: str | None) -> tuple[float, float]:
    """(wall, client CPU) microseconds per exchange over `exchanges` calls after `WARM_UP`."""
    _import_envs(baseline if client == "baseline" else None)
    body = b"o" * UP_BYTES
    if client == "grpc":
        import grpc

        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call, close = channel.unary_unary(METHOD), channel.close
    elif client == "h2":
        h2_client = H2Client("127.0.0.1", port, METHOD)
        call, close = h2_client.call, h2_client.close
    else:
        from envs.http2 import UnaryClient

        unary = UnaryClient("127.0.0.1", port, METHOD, connect_timeout=10)
        call, close = unary.call, unary.close
    try:
        for _ in range(WARM_UP):
            assert len(call(body)) == DOWN_BYTES
        cpu, start = time.process_time(), time.perf_counter()
        for _ in range(exchanges):
            call(body)
        return ((time.perf_counter() - start) / exchanges * 1e6,
                (time.process_time() - cpu) / exchanges * 1e6)
    finally:
        close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=3000, help="timed calls per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per (server, client) pair")
    parser.add_argument("--baseline", help="a folder holding an older copy of envs/")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.baseline)
        return
    if args.measure:
        print(*(f"{us:.1f}" for us in measure(args.measure, args.exchanges, args.client,
                                              args.baseline)))
        return
    servers = [s for s in args.servers.split(",") if s != "baseline" or args.baseline]
    clients = [c for c in args.clients.split(",") if c != "baseline" or args.baseline]
    extra = ["--baseline", args.baseline] if args.baseline else []
    processes = {}
    for kind in servers:
        process = subprocess.Popen([sys.executable, __file__, "--serve", kind, *extra],
                                   stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        ready, port = process.stdout.readline().split()
        assert ready == "ready"
        processes[kind] = (process, port)
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    try:
        for _ in range(args.runs):
            for kind in servers:
                process, port = processes[kind]
                for client in clients:
                    before = cpu_seconds(process.pid)
                    wall, client_cpu = (float(us) for us in subprocess.run(
                        [sys.executable, __file__, "--measure", port, "--client", client,
                         "--exchanges", str(args.exchanges), *extra],
                        capture_output=True, text=True, check=True).stdout.split())
                    server_cpu = ((cpu_seconds(process.pid) - before)
                                  / (args.exchanges + WARM_UP) * 1e6)
                    results.setdefault((kind, client), []).append((wall, client_cpu,
                                                                   server_cpu))
    finally:
        for process, _ in processes.values():
            process.kill()
            process.wait()
    print(f"HUGGY_SPIN_WAIT_US={os.environ.get('HUGGY_SPIN_WAIT_US', '(default)')}, "
          f"{args.exchanges} exchanges per run, {UP_BYTES} bytes up, {DOWN_BYTES} down")
    print("(each: the runs' median, then their lowest: other work on the machine only ever "
          "adds to a run)")
    for (kind, client), runs in results.items():
        walls, client_cpus, server_cpus = (sorted(column) for column in zip(*runs, strict=True))
        print(f"server {kind:8s} client {client:8s} us per exchange {_summary(walls)}; "
              f"CPU us, client {_summary(client_cpus)}, server {_summary(server_cpus)}")


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):5.0f} ({values[0]:4.0f})"


if __name__ == "__main__":
    main()
