"""`envs.spin_wait`: the polling budget read from the environment, the machine's runnable-task
count, and each rule of `SpinWait` on a clock the test moves (no wall-clock bounds). Both ends of
`envs.http2` with polling on and off are in `test_envs_http2.py`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envs import spin_wait
from envs.http2 import UnaryServer
from envs.spin_wait import (
    DEFAULT_BUDGET_US,
    ENVIRONMENT_VARIABLE,
    SpinWait,
    budget_from_environment,
    environment_for_instances,
    runnable_tasks_reader,
)


class Clock:
    """A clock that moves `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class Ready:
    """A readiness check that comes true on its `after`-th call (never, for None)."""

    def __init__(self, after: int | None) -> None:
        self.after = after
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.after is not None and self.calls >= self.after


TICK = 1 / 1024
"""The test clock's step, a power of two so that sums of it are exact."""


def _spin(budget_s: float = 10 * TICK, runnable: int = 1, clock: Clock | None = None
          ) -> SpinWait:
    return SpinWait(budget_s, runnable=lambda: runnable, cpus=2, allowed_cpus=2,
                    clock=clock or Clock(TICK))


@pytest.mark.parametrize(("value", "seconds"), [
    (None, DEFAULT_BUDGET_US / 1e6), ("", DEFAULT_BUDGET_US / 1e6), ("0", 0.0),
    ("1500", 0.0015), (" 250 ", 0.00025)])
def test_the_budget_is_read_in_microseconds(value: str | None, seconds: float) -> None:
    environ = {} if value is None else {ENVIRONMENT_VARIABLE: value}
    assert budget_from_environment(environ) == seconds


@pytest.mark.parametrize("value", ["-5", "1.5", "2ms", "off", "\u00b2"])
def test_a_budget_that_is_not_whole_microseconds_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match=rf"{ENVIRONMENT_VARIABLE} must be a whole number of "
                       rf"microseconds \(0 for no polling\), got '{value}'"):
        budget_from_environment({ENVIRONMENT_VARIABLE: value})


@pytest.mark.skipif(not Path("/proc/loadavg").is_file(), reason="Linux's /proc/loadavg")
def test_the_runnable_count_is_the_kernels_and_counts_this_process() -> None:
    runnable = runnable_tasks_reader()
    assert runnable is not None
    count = runnable()
    tasks = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    assert 1 <= count <= tasks  # this thread runs as it reads; the others mostly sleep


def test_a_ready_peer_is_taken_at_the_first_poll() -> None:
    spin, ready = _spin(), Ready(after=1)
    with spin.waiting(ready) as caught:
        assert caught
    assert (ready.calls, spin.polled, spin.caught) == (1, 1, 1)


def test_polling_stops_at_the_budget() -> None:
    # each read of the clock moves it a tick: the start, then one read after each failed check;
    # the poll gives up at the first read past 10 ticks, the 11th after the start
    spin, ready = _spin(), Ready(after=None)
    with spin.waiting(ready) as caught:
        assert not caught
    assert ready.calls == 11
    assert (spin.polled, spin.caught) == (1, 0)


def test_a_peer_ready_within_the_budget_is_caught_on_time() -> None:
    spin, ready = _spin(), Ready(after=7)
    with spin.waiting(ready) as caught:
        assert caught
    assert ready.calls == 7


def test_no_polling_while_more_tasks_are_runnable_than_cpus() -> None:
    spin, ready = _spin(runnable=3), Ready(after=None)  # 3 runnable on 2 CPUs
    with spin.waiting(ready) as caught:
        assert not caught
    assert ready.calls == 1  # checked once, then the caller blocks


def test_after_a_wait_longer_than_the_budget_the_next_blocks_then_polling_resumes() -> None:
    clock = Clock(0.0)
    spin = _spin(clock=clock)
    with spin.waiting(Ready(after=1)):
        clock.now += 50 * TICK  # the peer answered later than the budget (a blocking wait)
    skipped = Ready(after=1)
    with spin.waiting(skipped) as caught:
        assert not caught
        clock.now += 2 * TICK  # this one came within it
    assert skipped.calls == 0
    again = Ready(after=1)
    with spin.waiting(again) as caught:
        assert caught
    assert again.calls == 1
    assert (spin.polled, spin.caught) == (2, 2)


@pytest.mark.parametrize(("budget_s", "allowed_cpus", "runnable"), [
    (0.0, 2, lambda: 1), (0.002, 1, lambda: 1), (0.002, 2, None)])
def test_polling_is_off_without_a_budget_a_second_cpu_or_a_load_count(
        budget_s: float, allowed_cpus: int, runnable: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spin_wait, "_RUNNABLE", None)  # as where /proc/loadavg is missing
    spin = SpinWait(budget_s, runnable=runnable, cpus=2,  # type: ignore[arg-type]
                    allowed_cpus=allowed_cpus, clock=Clock(TICK))
    ready = Ready(after=1)
    with spin.waiting(ready) as caught:
        assert not caught
    assert not spin.enabled
    assert ready.calls == 0


@pytest.mark.parametrize(("instances", "allowed_cpus", "given", "expected"), [
    (1, 2, None, None), (2, 4, None, None), (2, 3, None, "0"), (2, 2, None, "0"),
    (8, 16, None, None), (2, 2, "500", "500"), (1, 1, "", "")])
def test_instances_poll_only_with_two_cpus_each_unless_told(
        instances: int, allowed_cpus: int, given: str | None, expected: str | None) -> None:
    environ = {"PATH": "/bin"} if given is None else {"PATH": "/bin", ENVIRONMENT_VARIABLE: given}
    result = environment_for_instances(instances, environ, allowed_cpus)
    assert result.get(ENVIRONMENT_VARIABLE) == expected
    assert result["PATH"] == "/bin"


def test_without_affinity_or_a_load_count_the_ends_are_made_and_block(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As on macOS: no `os.sched_getaffinity`, no `/proc/loadavg`."""
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(spin_wait, "_RUNNABLE", None)
    assert environment_for_instances(4, {}) == (
        {} if (os.cpu_count() or 1) >= 8 else {ENVIRONMENT_VARIABLE: "0"})
    server = UnaryServer("127.0.0.1", 0, "/test.Echo/Exchange")
    try:
        assert not server._spin.enabled
        assert not server.poll(0.01)
    finally:
        server.close(linger=0.0)
