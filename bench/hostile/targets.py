"""The servers under attack and what is read of their processes.

    huggy      `huggy serve --accelerator cpu --num-cpus 1 --port P --grpc-port G` on free ports
               (bundled policy), optionally with `--api-key-file`; the process measured is the
               Serve replica (a Ray worker whose title holds `ServeReplica` and whose open files
               name this instance's RAY_TMPDIR)
    grpcio     a stock `grpc.server(ThreadPoolExecutor(...))` in a subprocess: a generic unary
               handler for /huggy.v1.Policy/Act answering a constant, max receive 1 MiB
    envs       the Unity link's server, `envs.http2.UnaryServer`, in a subprocess: a
               receive/answer loop in its own thread

Only the CLI, the network and /proc are used: nothing of the server's code is imported here (the
subprocesses import what they serve).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

ACT_METHOD = "/huggy.v1.Policy/Act"
EXCHANGE_METHOD = "/communicator_objects.UnityToExternalProto/Exchange"
ACT_BODY = json.dumps({"obs": [0.125] * 59}).encode()
GRPCIO_ANSWER = json.dumps({"actions": [[0.0] * 21]}).encode()
ENVS_REQUEST = b"\x0a\x04unity"
ENVS_ANSWER = b"\x0a\x06python"
MAX_BODY_BYTES = 1 << 20
"""huggy serve's default --max-body-bytes, and the grpcio reference's max receive size."""
STABLE_S = 10.0
"""How long a target that did not answer at first must answer with the same process."""
NOT_ANSWERING = "not answering before the row"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "hostile_load.py"


# /proc


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid` in KiB (empty if it is gone)."""
    values = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line[:5]] = int(line.split()[1])
    except OSError:
        return {}
    return values


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds `pid` has used (None if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot): a pid reused by another process differs."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except OSError:
        return None


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def reset_peak(pid: int) -> bool:
    """Reset `pid`'s VmHWM to its current RSS (`/proc/PID/clear_refs`, 5); False where the
    kernel or the permissions do not allow it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def mentions(pid: int, marker: str) -> bool:
    """Whether a process's command line or one of its open files names `marker`."""
    proc = Path(f"/proc/{pid}")
    try:
        if marker.encode() in (proc / "cmdline").read_bytes():
            return True
        for descriptor in (proc / "fd").iterdir():
            with contextlib.suppress(OSError):
                if marker in os.readlink(descriptor):
                    return True
    except OSError:
        return False
    return False


def processes_mentioning(marker: str) -> list[tuple[int, str]]:
    """The live processes (not zombies) of this user that name `marker`: (pid, command)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if proc.stat().st_uid != os.getuid():
                continue
            if proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            command = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ")[:120]
        except OSError:
            continue
        if mentions(int(proc.name), marker):
            found.append((int(proc.name), command.decode(errors="replace").strip()))
    return found


@dataclass
class MemoryTrace:
    """The measured process's resident memory (MiB) and descriptors over one row."""

    before: float | None = None
    peak_sampled: float | None = None
    peak_hwm: float | None = None
    """The kernel's high-water mark since the row began (exact; None if it could not be reset)."""
    after: float | None = None
    samples: int = 0
    fds_before: int | None = None
    fds_peak: int | None = None
    fds_after: int | None = None

    @property
    def peak(self) -> float | None:
        values = [v for v in (self.peak_sampled, self.peak_hwm) if v is not None]
        return max(values) if values else None


class Sampler:
    """Samples `pid`'s VmRSS every `interval_s` in a thread (descriptors every 5th sample)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.trace = MemoryTrace()
        self._interval = interval_s
        self._stop = threading.Event()
        self._hwm_reset = reset_peak(pid)
        status = proc_status(pid)
        self.trace.before = status.get("VmRSS", 0) / 1024 if status else None
        self.trace.fds_before = fd_count(pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        count = 0
        while not self._stop.wait(self._interval):
            status = proc_status(self.pid)
            if not status:
                continue
            rss = status["VmRSS"] / 1024
            self.trace.samples += 1
            self.trace.peak_sampled = max(self.trace.peak_sampled or 0.0, rss)
            count += 1
            if count % 5 == 0:
                fds = fd_count(self.pid)
                if fds is not None:
                    self.trace.fds_peak = max(self.trace.fds_peak or 0, fds)

    def finish(self) -> MemoryTrace:
        """Stop sampling; the trace, with `after` read now."""
        self._stop.set()
        self._thread.join(timeout=2)
        status = proc_status(self.pid)
        if status:
            self.trace.after = status["VmRSS"] / 1024
            if self._hwm_reset:
                self.trace.peak_hwm = status["VmHWM"] / 1024
        self.trace.fds_after = fd_count(self.pid)
        return self.trace


# the targets


def free_ports(count: int) -> list[int]:
    """`count` different free TCP ports on 127.0.0.1 (all held until all are chosen)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def grpc_call(address: tuple[str, int], method: str, body: bytes,
              metadata: tuple[tuple[str, str], ...] = (), timeout_s: float = 2.0) -> str:
    """One call with a fresh grpcio channel: the status code's name."""
    with grpc.insecure_channel(f"{address[0]}:{address[1]}") as channel:
        try:
            channel.unary_unary(method)(body, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as error:
            return error.code().name  # type: ignore[attr-defined]
    return "OK"


@dataclass
class Target:
    """A server under attack: where it answers, the call it answers, and its process."""

    name: str
    grpc_address: tuple[str, int] = ("127.0.0.1", 0)
    method: str = ACT_METHOD
    body: bytes = ACT_BODY
    key: str | None = None
    http_address: tuple[str, int] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """A valid caller's metadata (the API key, where there is one)."""
        return (("authorization", f"Bearer {self.key}"),) if self.key else ()

    def pid(self) -> int | None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> dict[str, object]:
        raise NotImplementedError

    def answering(self) -> bool:
        """Whether a normal gRPC call (and for huggy an HTTP one) answers OK now."""
        return grpc_call(self.grpc_address, self.method, self.body, self.metadata) == "OK"

    def ensure_ready(self, timeout_s: float) -> str | None:
        """Wait (at most `timeout_s`) until the target answers: at once, or else until one and
        the same process has answered for `STABLE_S` (Serve may still replace a replica that
        answered once after a stall). None if it answered at once, else a note: how long it
        took, or `NOT_ANSWERING`."""
        start = time.monotonic()
        if self.pid() is not None and self.answering():
            return None
        candidate, since = None, start
        while time.monotonic() - start < timeout_s:
            pid = self.pid()
            if pid is not None and self.answering():
                if pid != candidate:
                    candidate, since = pid, time.monotonic()
                elif time.monotonic() - since >= STABLE_S:
                    return f"answered again after {time.monotonic() - start:.0f} s of waiting"
            else:
                candidate = None
            time.sleep(1.0)
        return NOT_ANSWERING

    def probe_config(self) -> dict[str, object]:
        """What the probe clients need (see `probes.worker_main`)."""
        config: dict[str, object] = {
            "grpc": list(self.grpc_address), "method": self.method,
            "body": base64.b64encode(self.body).decode(), "metadata": list(self.metadata)}
        if self.http_address is not None:
            config["http"] = list(self.http_address)
            config["headers"] = {"Content-Type": "application/json",
                                 **({"Authorization": f"Bearer {self.key}"} if self.key else {})}
        return config


class SubprocessTarget(Target):
    """The grpcio or envs server, run by `serve_main` in a subprocess; started afresh before
    every row (on the same port where it is free), so that no row's memory is measured on a
    process that an earlier row grew: memory an allocator kept from then would absorb part of
    the new growth unseen."""

    def __init__(self, kind: str) -> None:
        method, body = (ACT_METHOD, ACT_BODY) if kind == "grpcio" else (EXCHANGE_METHOD,
                                                                         ENVS_REQUEST)
        super().__init__(kind, method=method, body=body)
        self.kind = kind
        self.process: subprocess.Popen[str] | None = None
        self.restarts = 0
        self._log = Path(tempfile.mkstemp(prefix=f"hostile-{kind}-", suffix=".log")[1])

    def start(self) -> None:
        """Start the server on the port it had (any free one the first time, or where that
        one is taken)."""
        for port in dict.fromkeys((self.grpc_address[1], 0)):
            with self._log.open("a") as log:
                self.process = subprocess.Popen(
                    [sys.executable, str(SCRIPT), "--serve", self.kind, "--port", str(port)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                    cwd=REPO, start_new_session=True)
            line = _read_line(self.process, 60)
            if line.startswith("ready "):
                self.grpc_address = ("127.0.0.1", int(line.split()[1]))
                return
            self.stop()
        raise RuntimeError(f"the {self.kind} server did not start; see {self._log}")

    def pid(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None
        return self.process.pid

    def ensure_ready(self, timeout_s: float) -> str | None:
        silent = self.pid() is None or not self.answering()
        self.stop()
        self.start()
        self.restarts += 1
        note = super().ensure_ready(timeout_s)
        return note or ("the previous row had left it not answering" if silent else None)

    def stop(self) -> dict[str, object]:
        if self.process is None:
            return {}
        process, self.process = self.process, None
        with contextlib.suppress(OSError):
            process.stdin.close()  # type: ignore[union-attr]
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait(timeout=10)
        return {"exit_code": code, "stderr": str(self._log)}


    def forget_empty_log(self) -> None:
        """Remove the servers' stderr log where nothing was written to it."""
        with contextlib.suppress(OSError):
            if self._log.stat().st_size == 0:
                self._log.unlink()


def _read_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The next line of `process`'s stdout, or "" after `timeout_s` or at its end."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0].strip() if lines else ""


class HuggyTarget(Target):
    """`huggy serve` started by this probe, on free ports, with RAY_TMPDIR of its own (so that
    every process of its cluster names that folder and can be found, and stopped, by it)."""

    def __init__(self, with_key: bool) -> None:
        super().__init__("huggy+key" if with_key else "huggy",
                         key=base64.b32encode(os.urandom(20)).decode() if with_key else None)
        self.process: subprocess.Popen[bytes] | None = None
        self.temp = Path(tempfile.mkdtemp(prefix="hl", dir="/tmp"))
        self.http_port, self.grpc_port = 0, 0
        self.logs_dir: Path | None = None
        """Where `stop` keeps `huggy serve`'s output and Serve's logs (None: nowhere)."""

    @property
    def haproxy_dir(self) -> Path:
        return Path(f"/tmp/huggy-haproxy-{self.http_port}")

    @property
    def log(self) -> Path:
        return self.temp / "serve.log"

    def start(self, timeout_s: float = 300.0) -> None:
        self.http_port, self.grpc_port = free_ports(2)
        self.http_address = ("127.0.0.1", self.http_port)
        self.grpc_address = ("127.0.0.1", self.grpc_port)
        command = [str(Path(sys.executable).with_name("huggy")), "serve", "--accelerator", "cpu",
                   "--num-cpus", "1", "--port", str(self.http_port),
                   "--grpc-port", str(self.grpc_port)]
        if self.key:
            key_file = self.temp / "api-key"
            key_file.write_text(self.key + "\n")
            key_file.chmod(0o600)
            command += ["--api-key-file", str(key_file)]
        env = {**os.environ, "RAY_TMPDIR": str(self.temp), "RAY_USAGE_STATS_ENABLED": "0"}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"huggy serve did not come up (see {self.log}):\n{tail}")
            time.sleep(1.0)
        if self.ensure_ready(max(deadline - time.monotonic(), 30.0)) == NOT_ANSWERING:
            tail = self.log.read_text(errors="replace")[-2000:]
            seen = (f"replica processes {self.replica_pids()}, a gRPC call now: "
                    f"{grpc_call(self.grpc_address, self.method, self.body, self.metadata)}")
            self.stop()
            raise RuntimeError(f"huggy serve's replica did not answer gRPC ({seen}):\n{tail}")

    def _healthy(self) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://127.0.0.1:{self.http_port}/v1/healthz", timeout=5) as reply:
                return bool(reply.status == 200)
        except (OSError, urllib.error.HTTPError):
            return False

    def answering(self) -> bool:
        return super().answering() and self._healthy()

    def replica_pids(self) -> list[int]:
        """The live Serve replicas of this instance: Ray workers titled `...ServeReplica...`
        whose open files name this instance's RAY_TMPDIR."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if b"ServeReplica" not in proc.joinpath("cmdline").read_bytes():
                    continue
            except OSError:
                continue
            if mentions(int(proc.name), str(self.temp)):
                found.append(int(proc.name))
        return sorted(found)

    def pid(self) -> int | None:
        pids = self.replica_pids()
        return pids[0] if len(pids) == 1 else None

    def haproxy_pids(self) -> list[int]:
        return [pid for pid, _ in processes_mentioning(f"{self.haproxy_dir}/")
                if b"haproxy" in Path(f"/proc/{pid}/cmdline").read_bytes()]

    def listening_haproxy(self) -> int | None:
        """The HAProxy that listens now (each of Serve's reloads starts a new one, and the one
        it replaces exits once its connections are done): the pid its admin socket reports."""
        for line in self.admin_command("show info").splitlines():
            if line.startswith("Pid:"):
                return int(line.split()[1])
        return None

    def admin_sockets(self) -> list[Path]:
        """HAProxy's admin sockets: the `stats socket` lines of the configuration its process
        was started with (`-f`), else any `admin.sock` under its folder."""
        found = []
        for pid in self.haproxy_pids():
            try:
                words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                config = Path(words[words.index("-f") + 1]).read_text()
            except (OSError, ValueError, IndexError):
                continue
            found += [Path(m) for m in re.findall(r"^\s*stats socket (\S+)", config, re.MULTILINE)]
        with contextlib.suppress(OSError):
            found += sorted(self.haproxy_dir.rglob("admin.sock"))
        return list(dict.fromkeys(found))

    def admin_command(self, command: str, timeout_s: float = 2.0) -> str:
        """HAProxy's answer to one admin-socket command ("" when no socket answers)."""
        for path in self.admin_sockets():
            try:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.settimeout(timeout_s)
                    sock.connect(str(path))
                    sock.sendall(command.encode() + b"\n")
                    reply = b""
                    while chunk := sock.recv(65536):
                        reply += chunk
                return reply.decode(errors="replace")
            except OSError:
                continue
        return ""

    def rotation(self) -> list[tuple[str, str, int, int]]:
        """The HTTP backends' replica servers as HAProxy sees them: (backend, server,
        operational state (2: running), administrative state (0: none))."""
        servers = []
        for line in self.admin_command("show servers state").splitlines():
            fields = line.split()
            if len(fields) > 6 and fields[0].isdigit() and "SERVE_REPLICA" in fields[3] \
                    and fields[1].startswith("http"):
                servers.append((fields[1], fields[3], int(fields[5]), int(fields[6])))
        return servers

    def server_stats(self) -> dict[str, dict[str, str]]:
        """HAProxy's statistics (`show stat`) of the HTTP backends' replica servers: by
        server name, every field by its CSV header's name (`status`, `chkdown`: transitions
        from UP to DOWN so far, `downtime` ...)."""
        lines = self.admin_command("show stat").splitlines()
        if not lines or not lines[0].startswith("# "):
            return {}
        names = lines[0][2:].split(",")
        stats = {}
        for line in lines[1:]:
            row = dict(zip(names, line.split(","), strict=False))
            if row.get("pxname", "").startswith("http") and "SERVE_REPLICA" in row.get(
                    "svname", ""):
                stats[row["svname"]] = row
        return stats

    def stop(self) -> dict[str, object]:
        """SIGTERM to `huggy serve` and a wait for it to exit; then whatever of its cluster is
        left (processes naming its RAY_TMPDIR or HAProxy folder) is waited for and, after
        30 s, killed by pid. What was left and what had to be killed, for the report."""
        report: dict[str, object] = {}
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            try:
                report["exit_code"] = process.wait(timeout=180)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                report["exit_code"] = process.wait(timeout=30)
                report["killed_after_sigterm"] = True
            report["stop_s"] = round(time.monotonic() - started, 1)
        if self.logs_dir is not None:
            report["logs"] = str(self._keep_logs(self.logs_dir / self.name))
        markers = [str(self.temp)] + ([f"{self.haproxy_dir}/"] if self.http_port else [])
        deadline = time.monotonic() + 30
        left = _leftovers(markers)
        while left and time.monotonic() < deadline:
            time.sleep(1)
            left = _leftovers(markers)
        report["left_after_exit"] = [f"{pid} {command}" for pid, command in left]
        for pid, _ in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)
        if self.http_port:
            shutil.rmtree(self.haproxy_dir, ignore_errors=True)
        return report


    def _keep_logs(self, folder: Path) -> Path:
        """Copy `huggy serve`'s output and Serve's logs (controller, replicas, proxy) of this
        instance into `folder`, which is returned."""
        folder.mkdir(parents=True, exist_ok=True)
        for path in [self.log, *sorted(self.temp.glob("ray/session_*/logs/serve/*"))]:
            with contextlib.suppress(OSError):
                if path.is_file() and path.stat().st_size < 64 << 20:
                    shutil.copy(path, folder / path.name)
        return folder


def _leftovers(markers: list[str]) -> list[tuple[int, str]]:
    found: dict[int, str] = {}
    for marker in markers:
        found.update(processes_mentioning(marker))
    return sorted(found.items())


@contextlib.contextmanager
def rotation_monitor(target: Target, interval_s: float = 0.1) -> Iterator[list[dict[str, object]]]:
    """While inside, poll HAProxy's `show servers state` every `interval_s`; yields the list of
    changes seen ({"t": seconds, "servers": [(server, op state, admin state)]}), the first entry
    the state at the start."""
    changes: list[dict[str, object]] = []
    stop = threading.Event()
    started = time.monotonic()

    def poll() -> None:
        last = None
        while not stop.is_set():
            state = ([(name, op, admin) for _, name, op, admin in target.rotation()]
                     if isinstance(target, HuggyTarget) else [])
            if state != last:
                changes.append({"t": round(time.monotonic() - started, 2), "servers": state})
                last = state
            stop.wait(interval_s)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield changes
    finally:
        stop.set()
        thread.join(timeout=5)


# the subprocess servers


def _more_descriptors() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve_main(kind: str, port: int) -> None:
    """Run the grpcio or envs server on `port` of 127.0.0.1 (0: a free one), print
    "ready PORT", serve until stdin closes, then exit; print nothing if it cannot listen."""
    _more_descriptors()
    if kind == "grpcio":
        from concurrent.futures import ThreadPoolExecutor

        server = grpc.server(ThreadPoolExecutor(max_workers=16),
                             options=[("grpc.max_receive_message_length", MAX_BODY_BYTES)])
        handler = grpc.unary_unary_rpc_method_handler(lambda request, context: GRPCIO_ANSWER)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("huggy.v1.Policy", {"Act": handler}),))
        port = server.add_insecure_port(f"127.0.0.1:{port}")
        if not port:
            return
        server.start()
        print("ready", port, flush=True)
        sys.stdin.read()
        server.stop(0)
        return
    from envs.http2 import UnaryServer

    try:
        unity = UnaryServer("127.0.0.1", port, EXCHANGE_METHOD)
    except OSError:
        return

    def answer_calls() -> None:
        try:
            while True:
                unity.receive()
                unity.answer(ENVS_ANSWER)
        except BaseException:  # noqa: BLE001 - the loop's death is what a row observes
            traceback.print_exc()
            sys.stderr.flush()

    threading.Thread(target=answer_calls, daemon=True).start()
    print("ready", unity.address[1], flush=True)
    sys.stdin.read()
    os._exit(0)  # the loop may be blocked in a send: nothing to wait for
