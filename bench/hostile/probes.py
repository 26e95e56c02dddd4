"""The normal clients whose latency each row measures: gRPC calls with a grpcio channel and, for
huggy, `POST /v1/act` through HAProxy with `http.client`. They run in a process of their own
(`worker_main`), so that the attacks' Python loops in the probe's process never hold them back
(one GIL), and each call runs in a thread of its own at its planned moment, so a server that
stalls does not thin them out.

Protocol on the worker's stdin/stdout, one JSON document a line: first the configuration
(`Target.probe_config`), then commands:

    {"cmd": "during", "count": 20, "interval_s": 0.5, "timeout_s": 10}   start; answers {"started": true}
    {"cmd": "stop"}          no more calls; answers the phase's results once its calls ended
    {"cmd": "after", "count": 20, "interval_s": 0.05, "timeout_s": 5}    answers its results
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import queue
import subprocess
import sys
import threading
import time
from typing import Any

import grpc

from hostile.targets import REPO, SCRIPT


def _grpc_probe(stub: Any, body: bytes, metadata: tuple[tuple[str, str], ...], timeout_s: float
                ) -> tuple[bool, str | None]:
    try:
        stub(body, timeout=timeout_s, metadata=metadata)
    except grpc.RpcError as error:
        return False, error.code().name  # type: ignore[attr-defined]
    return True, None


def _http_probe(address: tuple[str, int], body: bytes, headers: dict[str, str],
                timeout_s: float) -> tuple[bool, str | None]:
    connection = http.client.HTTPConnection(*address, timeout=timeout_s)
    try:
        connection.request("POST", "/v1/act", body=body, headers=headers)
        reply = connection.getresponse()
        reply.read()
        return reply.status == 200, None if reply.status == 200 else f"HTTP {reply.status}"
    except (OSError, http.client.HTTPException) as error:
        return False, type(error).__name__
    finally:
        connection.close()


class _Phase:
    """`count` gRPC (and HTTP) calls `interval_s` apart, each in a thread, until `stop`."""

    def __init__(self, config: dict[str, Any], count: int, interval_s: float,
                 timeout_s: float) -> None:
        self.results: dict[str, list[dict[str, Any]]] = {"grpc": []}
        if "http" in config:
            self.results["http"] = []
        self._config = config
        self._count, self._interval, self._timeout = count, interval_s, timeout_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._calls: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def run_to_end(self) -> dict[str, list[dict[str, Any]]]:
        """Make every call (in this thread's time); the results."""
        self._run()
        return self.results

    def finish(self) -> dict[str, list[dict[str, Any]]]:
        """Stop starting calls; the results once every call started has ended."""
        self._stop.set()
        self._thread.join(self._timeout + 5)
        for call in self._calls:
            call.join(self._timeout + 5)
        return self.results

    def _run(self) -> None:
        config = self._config
        body = base64.b64decode(config["body"])
        metadata = tuple(tuple(pair) for pair in config["metadata"])
        address = "{}:{}".format(*config["grpc"])
        channel = grpc.insecure_channel(address)
        stub = channel.unary_unary(config["method"])
        http_address = tuple(config["http"]) if "http" in config else None
        started = time.monotonic()
        try:
            for index in range(self._count):
                if self._stop.wait(max(started + index * self._interval - time.monotonic(), 0)):
                    break
                self._launch("grpc", started, lambda: _grpc_probe(stub, body, metadata,
                                                                  self._timeout))
                if http_address is not None:
                    self._launch("http", started, lambda: _http_probe(
                        http_address, body, config["headers"], self._timeout))
            for call in self._calls:
                call.join(self._timeout + 5)
        finally:
            channel.close()

    def _launch(self, kind: str, started: float, call: Any) -> None:
        def run() -> None:
            begin = time.monotonic()
            ok, error = call()
            elapsed = time.monotonic() - begin
            with self._lock:
                self.results[kind].append({"t": round(begin - started, 3),
                                           "ms": round(elapsed * 1000, 2), "ok": ok,
                                           "error": error})

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._calls.append(thread)


def worker_main() -> None:
    """The probe worker: read the configuration, then serve commands (module docstring)."""
    config = json.loads(sys.stdin.readline())
    phase: _Phase | None = None
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "during":
            phase = _Phase(config, command["count"], command["interval_s"], command["timeout_s"])
            phase.start()
            print(json.dumps({"started": True}), flush=True)
        elif command["cmd"] == "stop":
            print(json.dumps(phase.finish() if phase else {}), flush=True)
            phase = None
        elif command["cmd"] == "after":
            after = _Phase(config, command["count"], command["interval_s"], command["timeout_s"])
            print(json.dumps(after.run_to_end()), flush=True)
        else:
            return


class ProbeClients:
    """The parent's end of a probe worker for one target."""

    def __init__(self, config: dict[str, object]) -> None:
        self._process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--probe-worker"], cwd=REPO, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._send(config)

    def _read(self) -> None:
        for line in self._process.stdout:  # type: ignore[union-attr]
            self._lines.put(line)

    def _send(self, document: dict[str, object]) -> None:
        self._process.stdin.write(json.dumps(document) + "\n")  # type: ignore[union-attr]
        self._process.stdin.flush()  # type: ignore[union-attr]

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        try:
            return json.loads(self._lines.get(timeout=timeout_s))  # type: ignore[no-any-return]
        except queue.Empty:
            return {"error": f"the probe worker did not answer within {timeout_s:.0f} s"}

    def start_during(self, window_s: float, count: int = 20, timeout_s: float = 10.0) -> None:
        """Start `count` probes spread over `window_s` seconds."""
        self._send({"cmd": "during", "count": count, "interval_s": window_s / count,
                    "timeout_s": timeout_s})
        self._answer(30)

    def stop_during(self, timeout_s: float = 10.0) -> dict[str, Any]:
        self._send({"cmd": "stop"})
        return self._answer(timeout_s + 20)

    def after(self, count: int = 20, interval_s: float = 0.05,
              timeout_s: float = 5.0) -> dict[str, Any]:
        self._send({"cmd": "after", "count": count, "interval_s": interval_s,
                    "timeout_s": timeout_s})
        return self._answer(count * interval_s + timeout_s + 20)

    def close(self) -> None:
        try:
            self._send({"cmd": "quit"})
            self._process.stdin.close()  # type: ignore[union-attr]
            self._process.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait(timeout=10)


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """n, failures, p50 and p99 in ms (nearest rank, over the calls that succeeded)."""
    times = sorted(result["ms"] for result in results if result["ok"])
    failures = [result["error"] for result in results if not result["ok"]]

    def rank(q: float) -> float | None:
        return times[max(math.ceil(q * len(times)) - 1, 0)] if times else None

    return {"n": len(results), "failures": len(failures),
            "errors": sorted(set(failures)), "p50_ms": rank(0.5), "p99_ms": rank(0.99),
            "max_ms": times[-1] if times else None}
