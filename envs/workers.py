"""Instance workers: each Unity instance of a multi-instance `UnityVectorEnv` is driven by its
own `UnityInstance` in its own process, so the gRPC, protobuf and slot work of K instances runs
in parallel instead of in one Python process.

- **Processes.** Each worker is a fresh interpreter started with `subprocess` (neither fork,
  which would copy a caller that may hold torch and threads, nor multiprocessing's spawn, which
  re-imports the caller's main module). It runs this module on a bare `envs` package
  (`envs.bootstrap`): numpy, grpc and mlagents-envs, never Gymnasium or torch. It starts its
  own Unity process.
- **Commands** travel on a socket pair per worker: one byte per step or close, nine for a reset.
  The start-up messages and errors are small pickled tuples.
- **Arrays** live in one shared memory segment (an anonymous memfd, else an unlinked temporary
  file, handed to each worker as a file descriptor): `StepBuffers` for every slot, instance i's
  agents in rows `slices[i]`. The caller writes every action row, tells each worker to step,
  and reads the results once all have answered; nothing per agent is pickled.
- **Faults.** A worker whose Unity process fails reports the error, closes its instance and
  exits; a worker that dies is seen as the end of its socket; one that does not answer within
  `timeout_wait` + `ANSWER_MARGIN_S` is killed. In each case every other worker is closed (each
  closes its Unity process), and `InstanceError` names the instance. A worker whose caller
  disappears closes its instance and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any, NoReturn

from mlagents_envs.exception import UnityException

from envs.bootstrap import WORKER_SETUP, bare_command
from envs.instance import (
    EnvironmentStartError,
    InstanceConfig,
    InstanceInfo,
    StepBuffers,
    UnityInstance,
)
from envs.spin_wait import environment_for_instances

ANSWER_MARGIN_S = 30.0
"""Seconds beyond `timeout_wait` (a worker's own limit per Unity exchange) that the caller waits
for a worker's answer, and for a closing worker to exit, before killing it."""
# Wire commands (caller -> worker, worker's answer):
#     InstanceConfig, pickled              -> ("ready", InstanceInfo) | ("error", kind, message)
#     ("attach", rows, layout, start)      -> ("ready",)
#     b"s" step | b"r" + int64 seed (-1: none) reset | b"c" close
#                                          -> b"k" | b"e" + pickled (kind, message)
_STEP, _RESET, _CLOSE, _OK, _ERROR = b"s", b"r", b"c", b"k", b"e"
_START_ERRORS: dict[str, type[Exception]] = {
    "EnvironmentStartError": EnvironmentStartError, "ValueError": ValueError,
    "RuntimeError": RuntimeError,
}


class InstanceError(UnityException):
    """One instance of a multi-instance `UnityVectorEnv` failed (its Unity process or its worker
    died, or stopped answering). `instance` is its index; every process of the environment has
    been closed by the time this is raised.

    Args:
        message: what failed.
        instance: the instance's index, or None.
    """

    def __init__(self, message: str, instance: int | None = None) -> None:
        super().__init__(message)
        self.instance = instance


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen
    conn: Connection
    poller: Any  # select.poll() on `conn`: cheaper than Connection.poll, no fd-number limit
    info: InstanceInfo | None = None

    def describe(self) -> str:
        if self.info is None:
            return f"instance {self.index}"
        return (f"instance {self.index} (worker_id {self.info.worker_id}, port {self.info.port}, "
                f"Unity pid {self.info.process_id})")


class InstanceWorkers:
    """K instance workers behind one `StepBuffers` of every slot (instance i's agents in rows
    `slices[i]`, instance 0's first). Start-up is parallel: every worker starts its Unity process
    at once. Any failure closes every worker and raises (the faults are in the module docstring).

    Args:
        configs: how to start each instance.

    Raises:
        EnvironmentStartError: a Unity executable could not be started, or never connected.
        ValueError: an instance's behavior or sizes differ from instance 0's, or a start-up check
            of `UnityInstance` failed.
        RuntimeError: every port an instance tried was busy, or its start failed otherwise.
        InstanceError: a worker died or stopped answering during start-up.
    """

    def __init__(self, configs: Sequence[InstanceConfig]) -> None:
        self._timeout = max(config.timeout_wait for config in configs) + ANSWER_MARGIN_S
        self._pose_size = configs[0].pose_size
        self._workers: list[_Worker] = []
        self._memory_fd = _shared_memory_fd()
        self._environment = environment_for_instances(len(configs))
        self.closed = False
        try:
            for index in range(len(configs)):
                self._workers.append(self._spawn(index))
            for worker, config in zip(self._workers, configs, strict=True):
                worker.conn.send(config)
            for worker in self._workers:
                worker.info = self._started(worker)
            self._attach()
        except BaseException:
            self.close()
            raise

    @property
    def infos(self) -> list[InstanceInfo]:
        """What each instance reported at start-up, in instance order."""
        return [worker.info for worker in self._workers if worker.info is not None]

    @property
    def worker_process_ids(self) -> list[int]:
        """Process id of each worker, in instance order."""
        return [worker.process.pid for worker in self._workers]

    # -- start-up -------------------------------------------------------------------------------

    def _spawn(self, index: int) -> _Worker:
        ours, theirs = Pipe()
        command = bare_command(WORKER_SETUP, "from envs.workers import main; sys.exit(main())")
        try:
            process = subprocess.Popen(
                [*command, "--instance", str(index), "--channel", str(theirs.fileno()),
                 "--memory", str(self._memory_fd)],
                pass_fds=(theirs.fileno(), self._memory_fd), stdin=subprocess.DEVNULL,
                env=self._environment)
        finally:
            theirs.close()
        poller = select.poll()
        poller.register(ours.fileno(), select.POLLIN)
        return _Worker(index, process, ours, poller)

    def _started(self, worker: _Worker) -> InstanceInfo:
        """Wait for a worker's start-up answer (its Unity process connects meanwhile)."""
        message = self._receive(worker, pickled=True)
        if message[0] == "ready":
            return message[1]
        _, kind, text = message
        self._fail(worker, kind, text, start=True)

    def _attach(self) -> None:
        """Size the shared segment for every slot, map it, and hand each worker its rows."""
        infos = self.infos
        first = infos[0]
        for worker in self._workers[1:]:
            info = worker.info
            assert info is not None
            if (info.layout, info.behavior_name) != (first.layout, first.behavior_name):
                raise ValueError(
                    f"every instance must have the same behavior and sizes: instance 0 has "
                    f"{first.behavior_name!r} with {first.layout.describe()}, "
                    f"{worker.describe()} has {info.behavior_name!r} with "
                    f"{info.layout.describe()}")
        rows = sum(info.num_agents for info in infos)
        size = StepBuffers.nbytes(rows, first.layout, self._pose_size)
        os.ftruncate(self._memory_fd, size)
        memory = mmap.mmap(self._memory_fd, size)  # kept alive by the arrays over it
        self.buffers = StepBuffers.over(rows, first.layout, memory, self._pose_size)
        self.slices: list[slice] = []
        start = 0
        for worker, info in zip(self._workers, infos, strict=True):
            worker.conn.send(("attach", rows, first.layout, start))
            self.slices.append(slice(start, start + info.num_agents))
            start += info.num_agents
        for worker in self._workers:
            self._receive(worker, pickled=True)

    # -- running --------------------------------------------------------------------------------

    def reset(self, seeds: Sequence[int | None]) -> None:
        """Reset every instance.

        Args:
            seeds: one per instance: instance i is reseeded with `seeds[i]` unless it is None.

        Raises:
            InstanceError: an instance's Unity process or worker failed (every worker is closed).
            RuntimeError: the workers are closed, or an instance failed otherwise.
        """
        for worker, seed in zip(self._workers, seeds, strict=True):
            self._send(worker, _RESET + struct.pack("<q", -1 if seed is None else int(seed)))
        self._collect()

    def step(self) -> None:
        """Step every instance with the actions in `buffers.actions`; results land in `buffers`.

        Raises:
            InstanceError: an instance's Unity process or worker failed (every worker is closed).
            RuntimeError: the workers are closed, or an instance failed otherwise.
        """
        for worker in self._workers:
            self._send(worker, _STEP)
        self._collect()

    def _send(self, worker: _Worker, command: bytes) -> None:
        if self.closed:
            raise RuntimeError("the instance workers are closed")
        try:
            worker.conn.send_bytes(command)
        except OSError:
            self._died(worker)

    def _collect(self) -> None:
        for worker in self._workers:
            answer = self._receive(worker, pickled=False)
            if answer != _OK:
                kind, text = pickle.loads(answer[1:])
                self._fail(worker, kind, text)

    def _receive(self, worker: _Worker, pickled: bool) -> Any:
        try:
            if not worker.poller.poll(1000 * self._timeout):
                self._fail(worker, "TimeoutError", f"no answer within {self._timeout:.0f} s")
            return worker.conn.recv() if pickled else worker.conn.recv_bytes()
        except (EOFError, OSError):
            self._died(worker)

    def _died(self, worker: _Worker) -> NoReturn:
        try:
            code = worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        how = ("is not answering" if code is None else
               f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
        self._fail(worker, "WorkerDied", f"its worker process (pid {worker.process.pid}) {how}")

    def _fail(self, worker: _Worker, kind: str, text: str, start: bool = False) -> NoReturn:
        """Close every worker, then raise the failure of `worker`, naming its instance."""
        if kind == "TimeoutError":
            worker.process.kill()  # not worth waiting for again in close()
        self.close()
        if start and kind in _START_ERRORS:
            raise _START_ERRORS[kind](f"{worker.describe()}: {text}")
        message = f"{worker.describe()} failed: {kind}: {text}"
        if kind in ("WorkerDied", "TimeoutError") or _is_unity_error(kind):
            raise InstanceError(message, worker.index)
        raise RuntimeError(message)

    def close(self) -> None:
        """Close every worker (each closes its Unity process) and the shared segment; kill a
        worker that has not exited after `timeout_wait` + `ANSWER_MARGIN_S`, and the Unity
        process of a worker that did not close it. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for worker in self._workers:
            with contextlib.suppress(OSError):  # already gone
                worker.conn.send_bytes(_CLOSE)
        deadline = time.monotonic() + self._timeout
        for worker in self._workers:
            try:
                code = worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                code = worker.process.wait()
            if code != 0 and worker.info is not None and worker.info.process_id is not None:
                _kill_orphan(worker.info.process_id, worker.info.port)
            worker.conn.close()
        os.close(self._memory_fd)  # the mapping goes when the last array over it does


def _is_unity_error(kind: str) -> bool:
    from mlagents_envs import exception

    found = getattr(exception, kind, None)
    return isinstance(found, type) and issubclass(found, UnityException)


def _shared_memory_fd() -> int:
    """A file descriptor of anonymous shared memory: a memfd (Linux), else an unlinked file."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("huggy-vector-env")
    handle, path = tempfile.mkstemp(prefix="huggy-vector-env-")
    os.unlink(path)
    return handle


def _kill_orphan(pid: int, port: int) -> None:
    """Kill the Unity process of a worker that died, if it still runs. Where there is a /proc,
    only a process started with `--mlagents-port PORT` is killed, never a recycled pid."""
    try:
        proc = Path("/proc")
        if proc.is_dir():
            marker = f"--mlagents-port\0{port}\0".encode()
            if marker not in (proc / str(pid) / "cmdline").read_bytes():
                return
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


# -- the worker process ------------------------------------------------------------------------


def serve(conn: Connection, memory_fd: int) -> int:
    """The worker's side: start the instance, attach to the shared rows, then run commands until told
    to close, until an error (reported to the caller first), or until the caller is gone.

    Args:
        conn: the worker's end of its socket pair.
        memory_fd: the shared memory segment's file descriptor.

    Returns:
        The worker's exit code: 0 when told to close, 1 after an error or when the caller is gone.
    """
    try:
        message = conn.recv_bytes()
        if message == _CLOSE:
            return 0
        config = pickle.loads(message)
        if config.cpu_core is not None:
            _pin_to_core(config.cpu_core)
        instance = UnityInstance(config)
    except (EOFError, OSError):
        return 1
    except Exception as error:  # noqa: BLE001 - reported to the caller, who raises it
        conn.send(("error", type(error).__name__, str(error)))
        return 1
    try:
        conn.send(("ready", instance.info()))
        message = conn.recv_bytes()
        if message == _CLOSE:
            return 0
        _, rows, layout, start = pickle.loads(message)
        memory = mmap.mmap(memory_fd, StepBuffers.nbytes(rows, layout, config.pose_size))
        buffers = StepBuffers.over(rows, layout, memory, config.pose_size).rows(
            start, start + instance.num_agents)
        conn.send(("ready",))
        while True:
            command = conn.recv_bytes()
            if command == _STEP:
                instance.step(buffers)
            elif command[:1] == _RESET:
                (seed,) = struct.unpack("<q", command[1:])
                instance.reset(None if seed < 0 else seed, buffers)
            else:
                return 0
            conn.send_bytes(_OK)
    except (EOFError, OSError):
        return 1  # the caller is gone
    except Exception as error:  # noqa: BLE001 - reported to the caller, who raises it
        with contextlib.suppress(OSError):
            conn.send_bytes(_ERROR + pickle.dumps((type(error).__name__, str(error))))
        return 1
    finally:
        instance.close()


def _pin_to_core(core: int) -> None:
    """Pin every thread of this process to `core`; the Unity process it starts inherits it."""
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {core})


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m envs.workers --instance I --channel FD --memory FD` (started by `InstanceWorkers`).

    Args:
        argv: the command line without the program name; None reads `sys.argv`.

    Returns:
        The exit code of `serve`.
    """
    parser = argparse.ArgumentParser(prog="python -m envs.workers")
    parser.add_argument("--instance", type=int, required=True)
    parser.add_argument("--channel", type=int, required=True)
    parser.add_argument("--memory", type=int, required=True)
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches the whole process group: the caller handles it and closes
    # the workers, which must not die mid-step meanwhile.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return serve(Connection(args.channel), args.memory)


if __name__ == "__main__":
    sys.exit(main())
