"""Raw client connections for the attacks: HTTP/2 over a TCP socket with frames built by
`hyperframe` and header blocks by `hpack` (frames RFC 9113 forbids, which hyperframe refuses to
build, are packed by hand in `raw_frame`), and plain sockets for HTTP/1.1.

Every wait is bounded: sockets are non-blocking and each send or read waits in `select` for at
most the time it is given, so a server that stops reading or answering never hangs the probe.
"""

from __future__ import annotations

import contextlib
import select
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import hpack
from h2.errors import ErrorCodes
from hyperframe.frame import (
    DataFrame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_WINDOW = 2**31 - 1
FRAME_HEADER = struct.Struct(">IBI")
"""A frame's 9-byte header: (24-bit length << 8 | type), flags, stream id."""
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
TCP_STATES = {1: "ESTABLISHED", 7: "CLOSE", 8: "CLOSE_WAIT"}
"""Linux `tcpi_state` values an attacker's socket is found in (others are shown as numbers)."""
SMALL_BUFFER = 4096
"""SO_RCVBUF or SO_SNDBUF of a socket that should hold as little as the kernel allows."""


def code_name(code: int) -> str:
    """RFC 9113's name of an error code (`0x..` for one it does not name)."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"0x{code:x}"


def raw_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame packed by hand, for what hyperframe refuses to build (a PING on a stream, a
    zero WINDOW_UPDATE increment, ...)."""
    return FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream) + payload


def grpc_message(payload: bytes, declared: int | None = None) -> bytes:
    """`payload` behind gRPC's 5-byte prefix (uncompressed), which declares `declared` bytes
    (default: the payload's length)."""
    return struct.pack(">BI", 0, len(payload) if declared is None else declared) + payload


def request_fields(path: bytes | str, authority: str,
                   metadata: Iterable[tuple[str, str]] = ()) -> list[tuple[bytes, bytes]]:
    """The header fields of a gRPC call to `path`, then `metadata`."""
    fields = [(b":method", b"POST"), (b":scheme", b"http"),
              (b":path", path if isinstance(path, bytes) else path.encode()),
              (b":authority", authority.encode()), (b"content-type", b"application/grpc"),
              (b"te", b"trailers")]
    return fields + [(name.encode(), value.encode()) for name, value in metadata]


def stateless_block(fields: Sequence[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block that leaves the peer's dynamic table as it is: `:method` and `:scheme`
    from the static table, every other field a literal never indexed (so the same bytes can be
    sent again and again, in any order)."""
    encoder = hpack.Encoder()
    return encoder.encode([(name, value, name not in (b":method", b":scheme"))
                           for name, value in fields], huffman=True)


def headers_frame(stream: int, block: bytes, end_stream: bool = False,
                  end_headers: bool = True) -> bytes:
    flags = [name for name, on in (("END_STREAM", end_stream), ("END_HEADERS", end_headers))
             if on]
    return HeadersFrame(stream, data=block, flags=flags).serialize()


def data_frame(stream: int, payload: bytes, end_stream: bool = False) -> bytes:
    return DataFrame(stream, data=payload, flags=["END_STREAM"] if end_stream else []).serialize()


def settings_frame(settings: dict[int, int] | None = None, ack: bool = False) -> bytes:
    return SettingsFrame(0, settings=settings or {}, flags=["ACK"] if ack else []).serialize()


def ping_frame(opaque: bytes = b"hostile!", ack: bool = False) -> bytes:
    return PingFrame(0, opaque_data=opaque, flags=["ACK"] if ack else []).serialize()


def window_update(stream: int, increment: int) -> bytes:
    return WindowUpdateFrame(stream, window_increment=increment).serialize()


def tcp_state(sock: socket.socket) -> str:
    """The kernel's state of `sock` (CLOSE_WAIT: the peer sent its FIN)."""
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
    except OSError as error:
        return f"unknown ({error.strerror})"
    return TCP_STATES.get(state, str(state))


def open_socket(address: tuple[str, int], rcvbuf: int | None = None,
                sndbuf: int | None = None, timeout_s: float = 5.0) -> socket.socket:
    """A connected non-blocking TCP socket with the given buffer sizes (set before connecting,
    so the window the kernel advertises follows them). OSError if it cannot connect in time."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.settimeout(timeout_s)
        sock.connect(address)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        sock.close()
        raise
    return sock


def ready(sock: socket.socket, write: bool, timeout_s: float) -> bool:
    """Whether `sock` is readable (or writable) within `timeout_s` seconds; `poll`, not
    `select`, which cannot watch descriptors above 1023 (the idle-connection rows open
    thousands)."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(max(timeout_s, 0.0) * 1000))


def send_bounded(sock: socket.socket, data: bytes | memoryview, block_s: float
                 ) -> tuple[int, OSError | None]:
    """Write `data` to the non-blocking `sock`; stop once it stays unwritable for `block_s`
    seconds (the peer stopped reading) or the connection breaks. The bytes written and the
    error that stopped it, if any."""
    view = memoryview(data)
    sent = 0
    while sent < len(view):
        try:
            sent += sock.send(view[sent:])
            continue
        except BlockingIOError:
            pass
        except OSError as error:
            return sent, error
        if not ready(sock, True, block_s):
            break
    return sent, None


@dataclass
class StreamSeen:
    """What came back on one stream."""

    status: str | None = None
    """The `:status` of the first header block."""
    grpc_status: str | None = None
    header_block_bytes: int = 0
    ended: bool = False
    rst: str | None = None
    answered_at: float | None = None
    """When the first frame of an answer (HEADERS or RST_STREAM) arrived (monotonic)."""


@dataclass
class Seen:
    """What one connection received."""

    frames: Counter[str] = field(default_factory=Counter)
    bytes: int = 0
    peer_settings: dict[int, int] = field(default_factory=dict)
    ping_acks: int = 0
    goaway: str | None = None
    goaway_debug: str = ""
    goaway_at: float | None = None
    rst_codes: Counter[str] = field(default_factory=Counter)
    streams: dict[int, StreamSeen] = field(default_factory=dict)
    closed: str | None = None
    """How the peer ended the connection: "EOF" or "reset", None while open."""
    closed_at: float | None = None
    send_error: str | None = None
    """Why a write failed (the peer closed or reset the connection meanwhile)."""
    window: int = 65_535
    """The connection's send window as the peer grants it."""
    stream_windows: dict[int, int] = field(default_factory=dict)
    initial_window: int = 65_535
    decode_errors: int = 0


FRAME_NAMES = {0: "DATA", 1: "HEADERS", 2: "PRIORITY", 3: "RST_STREAM", 4: "SETTINGS",
               5: "PUSH_PROMISE", 6: "PING", 7: "GOAWAY", 8: "WINDOW_UPDATE", 9: "CONTINUATION"}


class Connection:
    """A client's HTTP/2 connection to `address` whose every frame the caller chooses.

    With `read`, a thread reads and records what comes back (`seen`), answers the peer's
    SETTINGS and PINGs as a client does and tracks the windows the peer grants; without,
    nothing is read until `inspect_unread`. `preface`: send the client preface and SETTINGS at
    once (the stream window `initial_window`, the connection window opened to the most).
    """

    def __init__(self, address: tuple[str, int], *, read: bool = True, rcvbuf: int | None = None,
                 sndbuf: int | None = None, preface: bool = True,
                 initial_window: int = MAX_WINDOW) -> None:
        self.sock = open_socket(address, rcvbuf, sndbuf)
        self.seen = Seen()
        self.sent = 0
        self.started = time.monotonic()
        self._buffer = bytearray()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 30
        self._decoder.max_allowed_table_size = 1 << 30
        self._block: tuple[int, bytearray] | None = None
        self._send_lock = threading.Lock()
        self._changed = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        if preface:
            self.send(PREFACE + settings_frame({0x4: initial_window, 0x2: 0})
                      + window_update(0, MAX_WINDOW - 65_535))
        if read:
            self._thread = threading.Thread(target=self._read_loop, daemon=True)
            self._thread.start()

    # sending

    def send(self, data: bytes | memoryview, block_s: float = 5.0) -> bool:
        """Write `data` whole (True), or as much as the peer takes before the socket stays
        unwritable for `block_s` seconds (False). A broken connection is recorded (False)."""
        with self._send_lock:
            written, error = send_bounded(self.sock, data, block_s)
            self.sent += written
        if error is not None:
            with self._changed:
                self.seen.send_error = self.seen.send_error or (error.strerror or str(error))
                self._changed.notify_all()
            return False
        return written == len(data)

    # reading

    def _read_loop(self) -> None:
        while not self._stop and self.seen.closed is None:
            try:
                if not ready(self.sock, False, 0.1):
                    continue
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except (OSError, ValueError) as error:  # ValueError: closed under us
                if not self._stop:
                    self._closed("reset" if isinstance(error, ConnectionResetError)
                                 else f"read failed ({error})")
                return
            if not chunk:
                self._closed("EOF")
                return
            self.feed(chunk, decode=True, answer=True)

    def _closed(self, how: str) -> None:
        with self._changed:
            if self.seen.closed is None:
                self.seen.closed = how
                self.seen.closed_at = time.monotonic()
            self._changed.notify_all()

    def feed(self, chunk: bytes, decode: bool, answer: bool) -> None:
        """Record the frames of `chunk` (with what came before it); `decode`: decode header
        blocks; `answer`: ACK the peer's SETTINGS and PINGs."""
        seen = self.seen
        seen.bytes += len(chunk)
        buffer = self._buffer
        buffer += chunk
        offset, end_of_data = 0, len(buffer)
        replies = []
        notify = False
        while end_of_data - offset >= 9:
            size_kind, flags, stream = FRAME_HEADER.unpack_from(buffer, offset)
            end = offset + 9 + (size_kind >> 8)
            if end > end_of_data:
                break
            kind = size_kind & 0xFF
            stream &= MAX_WINDOW
            if kind == PING:  # the flood's frames: the fast path
                if flags & ACK:
                    seen.ping_acks += 1
                elif answer:
                    replies.append(ping_frame(bytes(buffer[offset + 9:end]), ack=True))
                offset = end
                continue
            payload = bytes(buffer[offset + 9:end])
            offset = end
            seen.frames[FRAME_NAMES.get(kind, str(kind))] += 1
            notify = True
            if kind == DATA:
                if flags & END_STREAM:
                    self._stream(stream).ended = True
            elif kind in (HEADERS, CONTINUATION):
                self._on_header_fragment(kind, flags, stream, payload, decode)
            elif kind == RST_STREAM and len(payload) == 4:
                name = code_name(struct.unpack(">I", payload)[0])
                seen.rst_codes[name] += 1
                state = self._stream(stream)
                state.rst = name
                state.answered_at = state.answered_at or time.monotonic()
            elif kind == GOAWAY and len(payload) >= 8:
                seen.goaway = code_name(struct.unpack_from(">I", payload, 4)[0])
                seen.goaway_debug = payload[8:72].decode("utf-8", "replace")
                seen.goaway_at = time.monotonic()
            elif kind == SETTINGS and not flags & ACK:
                for index in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack_from(">HI", payload, index)
                    if key == 0x4:
                        for sid in seen.stream_windows:
                            seen.stream_windows[sid] += value - seen.initial_window
                        seen.initial_window = value
                    seen.peer_settings[key] = value
                if answer:
                    replies.append(settings_frame(ack=True))
            elif kind == WINDOW_UPDATE and len(payload) == 4:
                increment = struct.unpack(">I", payload)[0] & MAX_WINDOW
                if stream == 0:
                    seen.window += increment
                else:
                    seen.stream_windows[stream] = seen.stream_windows.get(
                        stream, seen.initial_window) + increment
        del buffer[:offset]
        if replies:
            self.send(b"".join(replies), block_s=1.0)
        if notify:
            with self._changed:
                self._changed.notify_all()

    def _stream(self, stream: int) -> StreamSeen:
        state = self.seen.streams.get(stream)
        if state is None:
            state = self.seen.streams[stream] = StreamSeen()
        return state

    def _on_header_fragment(self, kind: int, flags: int, stream: int, payload: bytes,
                            decode: bool) -> None:
        if kind == HEADERS:
            if flags & 0x8:  # PADDED
                payload = payload[1:len(payload) - payload[0]]
            if flags & 0x20:  # PRIORITY
                payload = payload[5:]
            self._block = (stream, bytearray(payload))
            if flags & END_STREAM:
                self._stream(stream).ended = True
        elif self._block is not None:
            self._block[1].extend(payload)
        if not flags & END_HEADERS or self._block is None:
            return
        block_stream, block = self._block
        self._block = None
        state = self._stream(block_stream)
        state.header_block_bytes += len(block)
        state.answered_at = state.answered_at or time.monotonic()
        if not decode:
            return
        try:
            fields = self._decoder.decode(bytes(block), raw=True)
        except hpack.HPACKError:
            self.seen.decode_errors += 1
            return
        for name, value in fields:
            if name == b":status" and state.status is None:
                state.status = value.decode("latin-1")
            elif name == b"grpc-status":
                state.grpc_status = value.decode("latin-1")

    # waiting and reporting

    def wait(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Whether `condition()` held within `timeout_s` (checked as frames arrive)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.1))
        return True

    def wait_settings(self, timeout_s: float = 5.0) -> bool:
        """Whether the peer's SETTINGS arrived within `timeout_s` (needs `read`)."""
        return self.wait(lambda: self.seen.frames["SETTINGS"] > 0 or self.ended, timeout_s)

    @property
    def ended(self) -> bool:
        """The peer sent GOAWAY or closed the connection (or a write to it failed)."""
        seen = self.seen
        return seen.goaway is not None or seen.closed is not None or seen.send_error is not None

    def send_window(self, stream: int) -> int:
        """What the peer's windows let us send on `stream` now."""
        return min(self.seen.window, self.seen.stream_windows.get(stream,
                                                                  self.seen.initial_window))

    def spend_window(self, stream: int, size: int) -> None:
        self.seen.window -= size
        self.seen.stream_windows[stream] = self.seen.stream_windows.get(
            stream, self.seen.initial_window) - size

    def inspect_unread(self, budget_s: float, max_bytes: int) -> dict[str, object]:
        """For a connection that was not read: its TCP state, then what the peer had sent, read
        for at most `budget_s` seconds or `max_bytes` bytes (frame headers only: GOAWAY,
        RST_STREAM and EOF are what is looked for)."""
        found: dict[str, object] = {"tcp_state": tcp_state(self.sock)}
        deadline = time.monotonic() + budget_s
        drained = 0
        while time.monotonic() < deadline and drained < max_bytes and self.seen.closed is None:
            try:
                if not ready(self.sock, False, min(0.2, deadline - time.monotonic())):
                    if self.seen.goaway is not None:
                        break
                    continue
                chunk = self.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError as error:
                self._closed("reset" if isinstance(error, ConnectionResetError)
                             else f"read failed ({error})")
                break
            if not chunk:
                self._closed("EOF")
                break
            drained += len(chunk)
            self.feed(chunk, decode=False, answer=False)
        found["drained_bytes"] = drained
        found["drain_complete"] = self.seen.closed is not None or (
            drained < max_bytes and time.monotonic() < deadline)
        return found

    def describe(self) -> dict[str, object]:
        """What happened to this connection, for the JSON document."""
        seen = self.seen
        return {"sent_bytes": self.sent, "received_bytes": seen.bytes,
                "frames_received": dict(seen.frames), "ping_acks": seen.ping_acks,
                "goaway": seen.goaway, "goaway_debug": seen.goaway_debug,
                "goaway_after_s": _after(seen.goaway_at, self.started),
                "rst_codes": dict(seen.rst_codes), "closed": seen.closed,
                "closed_after_s": _after(seen.closed_at, self.started),
                "send_error": seen.send_error, "header_decode_errors": seen.decode_errors,
                "peer_settings": {str(k): v for k, v in seen.peer_settings.items()}}

    def close(self) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join(timeout=2)
        with contextlib.suppress(OSError):
            self.sock.close()


def _after(moment: float | None, start: float) -> float | None:
    return None if moment is None else round(moment - start, 3)


def ending_summary(connections: Sequence[Connection]) -> str:
    """How the connections ended, in a few words: GOAWAY codes, RST_STREAM codes, closed by
    the peer, or still open."""
    goaways = Counter(c.seen.goaway for c in connections if c.seen.goaway)
    rsts: Counter[str] = Counter()
    for connection in connections:
        rsts.update(connection.seen.rst_codes)
    closed = Counter(c.seen.closed for c in connections if c.seen.closed)
    failed = Counter(c.seen.send_error for c in connections
                     if c.seen.send_error and not c.seen.closed and not c.seen.goaway)
    still_open = sum(1 for c in connections if not c.ended)
    several = len(connections) > 1
    parts = [f"GOAWAY {code}" + (f" x{count}" if several else "")
             for code, count in goaways.items()]
    parts += [f"RST_STREAM {code} x{count}" for code, count in rsts.items()]
    parts += [("closed by peer" if how in ("EOF", "reset") else how)
              + (f" ({how})" if how in ("EOF", "reset") else "") + (f" x{count}" if several else "")
              for how, count in closed.items()]
    parts += [f"write failed ({error})" + (f" x{count}" if several else "")
              for error, count in failed.items()]
    if still_open:
        parts.append("open at bound" + (f" x{still_open}" if several else ""))
    return "; ".join(parts) or "nothing"


# HTTP/1.1


@dataclass
class HttpAnswer:
    """One raw HTTP/1.1 exchange: the status (None when none came), the headers, the body's
    start, the seconds from sending to the whole answer, the error (reset, timeout, ...)."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    elapsed_s: float | None = None
    error: str | None = None


def parse_http_answer(raw: bytes) -> tuple[HttpAnswer, bool] | None:
    """The answer in `raw` and whether its body is whole (by Content-Length); None while its
    head is incomplete."""
    head, separator, body = raw.partition(b"\r\n\r\n")
    if not separator:
        return None
    lines = head.decode("latin-1").split("\r\n")
    answer = HttpAnswer()
    try:
        answer.status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        answer.error = f"bad status line {lines[0][:60]!r}"
        return answer, True
    for line in lines[1:]:
        name, _, value = line.partition(":")
        answer.headers[name.strip().lower()] = value.strip()
    answer.body = body[:2048]
    length = answer.headers.get("content-length")
    whole = length is not None and length.isdigit() and len(body) >= int(length)
    return answer, whole


def http_burst(address: tuple[str, int], request: bytes, count: int, timeout_s: float
               ) -> list[HttpAnswer]:
    """`count` connections to `address` at once, each sending `request` (which should say
    `Connection: close`) and reading its answer, all in one thread with a selector; each
    answer's time runs from its connection's start. Bounded by `timeout_s` in all."""
    selector = selectors.DefaultSelector()
    answers = [HttpAnswer() for _ in range(count)]
    buffers = [bytearray() for _ in range(count)]
    started = [0.0] * count
    pending = 0
    for index in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        started[index] = time.monotonic()
        error = sock.connect_ex(address)
        if error not in (0, 115):  # EINPROGRESS
            answers[index].error = f"connect: errno {error}"
            sock.close()
            continue
        selector.register(sock, selectors.EVENT_WRITE, index)
        pending += 1
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for key, events in selector.select(timeout=min(0.5, deadline - time.monotonic())):
            sock, index = key.fileobj, key.data
            assert isinstance(sock, socket.socket)
            done = False
            if events & selectors.EVENT_WRITE:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    answers[index].error = f"connect: errno {error}"
                    done = True
                else:
                    try:
                        sock.sendall(request)  # small: fits the empty send buffer
                        selector.modify(sock, selectors.EVENT_READ, index)
                    except OSError as failure:
                        answers[index].error = f"send: {failure.strerror or failure}"
                        done = True
            else:
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError as failure:
                    answers[index].error = ("reset" if isinstance(failure, ConnectionResetError)
                                            else f"recv: {failure}")
                    chunk, done = b"", True
                if chunk:
                    buffers[index] += chunk
                parsed = parse_http_answer(bytes(buffers[index]))
                if parsed is not None and (parsed[1] or not chunk):
                    error_text = answers[index].error
                    answers[index] = parsed[0]
                    answers[index].error = answers[index].error or (
                        error_text if not parsed[1] else None)
                    answers[index].elapsed_s = time.monotonic() - started[index]
                    done = True
                elif not chunk and not done:
                    answers[index].error = "EOF before an answer"
                    done = True
                elif not chunk:
                    done = True
            if done:
                selector.unregister(sock)
                sock.close()
                pending -= 1
    for key in list(selector.get_map().values()):
        answers[key.data].error = answers[key.data].error or f"no answer within {timeout_s:.0f} s"
        key.fileobj.close()  # type: ignore[union-attr]
    selector.close()
    return answers
