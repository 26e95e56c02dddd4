"""Waiting on a lockstep peer by polling before blocking: `SpinWait`.

In the Unity exchange each side waits while the other works, a few hundred microseconds per
step with the stand-in. A process that blocks lets its CPU go idle, and a virtual machine's
idle CPU is halted: waking it when the peer's message comes takes time, and the caches come
back cold (docs/benchmarks.md, "Polling before blocking, with a CPU to spare"). Polling the
socket for a bounded time keeps the CPU running and takes the message as soon as it is there.

Polling takes a CPU, so it is done only while that CPU is nobody else's (the rules are listed at
`SpinWait`). It is off where `/proc/loadavg` cannot be read (not Linux).

`HUGGY_SPIN_WAIT_US` (an environment variable, read as each server or client is made; the
players a Python side starts inherit it) is the budget in microseconds: `DEFAULT_BUDGET_US` when
unset, 0 for no polling.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping

ENVIRONMENT_VARIABLE = "HUGGY_SPIN_WAIT_US"
DEFAULT_BUDGET_US = 2000
"""Longest poll of one wait: a few times the stand-in's usual wait, so that a Unity player that
renders, or a policy on a large batch, is waited for by blocking."""
_LOADAVG = "/proc/loadavg"


def budget_from_environment(environ: Mapping[str, str] = os.environ) -> float:
    """The polling budget that `HUGGY_SPIN_WAIT_US` sets.

    Args:
        environ: the environment to read.

    Returns:
        The budget in seconds: the variable's whole number of microseconds (0 for none);
            `DEFAULT_BUDGET_US` when it is unset or empty.

    Raises:
        ValueError: the variable holds anything but a whole number (naming the variable, what it
            takes and what it held).
    """
    text = environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_BUDGET_US / 1e6
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{ENVIRONMENT_VARIABLE} must be a whole number of microseconds "
                         f"(0 for no polling), got {text!r}")
    return int(text) / 1e6


def environment_for_instances(instances: int, environ: Mapping[str, str] = os.environ,
                              allowed_cpus: int | None = None) -> dict[str, str]:
    """The environment for the processes of instances run side by side (each a Python side and its
    player).

    Args:
        instances: how many instances.
        environ: the environment to start from.
        allowed_cpus: the CPUs this process may use; None: its affinity.

    Returns:
        A copy of `environ`, with polling off (`HUGGY_SPIN_WAIT_US=0`) where there are fewer than 2
            CPUs per instance and `environ` does not set the budget itself.
    """
    if allowed_cpus is None:
        allowed_cpus = _allowed_cpus()
    if ENVIRONMENT_VARIABLE in environ or 2 * instances <= allowed_cpus:
        return dict(environ)
    return {**environ, ENVIRONMENT_VARIABLE: "0"}


def _allowed_cpus() -> int:
    """How many CPUs this process may run on (all of them where affinity is unknown: macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def runnable_tasks_reader() -> Callable[[], int] | None:
    """A reader of how many tasks the machine has runnable now.

    Returns:
        A function returning the kernel's count in `/proc/loadavg` (this task included); None where
            that file cannot be read or has another layout.
    """
    try:
        descriptor = os.open(_LOADAVG, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None

    def runnable() -> int:
        return int(os.pread(descriptor, 128, 0).split()[3].partition(b"/")[0])
    try:
        runnable()  # a file of another layout is no count
    except (OSError, IndexError, ValueError):
        os.close(descriptor)
        return None
    return runnable


class SpinWait:
    """Polls a readiness check before a blocking wait, only while that CPU is nobody else's:

    - where the process may run on at least 2 CPUs (its affinity when the `SpinWait` is made: a
      worker pinned to one core shares it with its player, and never polls);
    - while no more tasks are runnable than the machine has CPUs (`/proc/loadavg`, read between
      polls), so polling stops as soon as another task needs a CPU;
    - when the last wait ended within the budget: a peer that takes longer (a Unity player that
      renders, a policy on large batches) is waited for by blocking, and a peer that slows down
      costs one budget of polling;
    - with several instances side by side, only where there are 2 CPUs per instance (each pair of
      processes one CPU each; `environment_for_instances`, which the instance workers start with).

    Args:
        budget_s: the longest poll of one wait, in seconds; None: `HUGGY_SPIN_WAIT_US`'s.
        runnable: counts the machine's runnable tasks; None: this machine's (polling is off where
            the count cannot be read).
        cpus: the machine's CPU count; None: this machine's.
        allowed_cpus: the CPUs this process may run on; None: its affinity.
        clock: tells the time in seconds.

    Raises:
        ValueError: `budget_s` is None and `HUGGY_SPIN_WAIT_US` is malformed.
    """

    def __init__(self, budget_s: float | None = None,
                 runnable: Callable[[], int] | None = None, cpus: int | None = None,
                 allowed_cpus: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.budget_s = budget_from_environment() if budget_s is None else budget_s
        self._runnable = runnable if runnable is not None else _RUNNABLE
        self._cpus = cpus if cpus is not None else os.cpu_count() or 1
        self._clock = clock
        if allowed_cpus is None:
            allowed_cpus = _allowed_cpus()
        self.enabled = self.budget_s > 0 and self._runnable is not None and allowed_cpus >= 2
        self._last_wait_s = 0.0
        self.polled = self.caught = 0  # waits that polled; of them, those whose poll succeeded

    @contextlib.contextmanager
    def waiting(self, ready: Callable[[], bool]) -> Iterator[bool]:
        """Around one blocking wait: first poll `ready` while the rules allow, up to the budget.

        The whole wait's length (until the `with` block ends) decides whether the next wait polls.

        Args:
            ready: a check that must not block.

        Yields:
            Whether `ready` came true while polling; the caller then waits (which returns at once when
                it did).
        """
        start = self._clock()
        caught = self.enabled and self._last_wait_s <= self.budget_s and self._poll(ready, start)
        try:
            yield caught
        finally:
            self._last_wait_s = self._clock() - start

    def _poll(self, ready: Callable[[], bool], start: float) -> bool:
        self.polled += 1
        until = start + self.budget_s
        runnable, cpus, clock = self._runnable, self._cpus, self._clock
        assert runnable is not None
        while True:
            if ready():
                self.caught += 1
                return True
            if clock() > until or runnable() > cpus:
                return False


_RUNNABLE = runnable_tasks_reader()
