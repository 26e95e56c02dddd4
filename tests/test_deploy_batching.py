"""The replica's batch queue (`deploy.serving.batching.BatchQueue`), on its own: which calls
share a batch, the row limit, answers and failures per call, the optional wait. No Ray."""

from __future__ import annotations

import asyncio

import pytest

from deploy.serving.batching import BatchQueue

DEADLINE_S = 30.0
"""Every wait on the queue in these tests ends by then (a hang fails instead of blocking)."""


class Recorder:
    """A batch function that records each batch (the calls' names) and answers each call with
    its name doubled; a call named "fail" gets a ValueError of its own, and with `gates` each
    batch waits for its own event first."""

    def __init__(self, gated: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.gates: list[asyncio.Event] = []
        self.gated = gated
        self.started = asyncio.Event()

    async def run(self, calls: list[tuple[str, int]]) -> list[str | Exception]:
        self.batches.append([name for name, _ in calls])
        if self.gated:
            gate = asyncio.Event()
            self.gates.append(gate)
            self.started.set()
            await gate.wait()
        return [ValueError(f"{name} failed") if name == "fail" else name * 2
                for name, _ in calls]


def rows_of(call: tuple[str, int]) -> int:
    return call[1]


def run(scenario: object) -> object:
    return asyncio.run(asyncio.wait_for(scenario, DEADLINE_S))  # type: ignore[arg-type]


def test_calls_of_one_turn_share_a_batch_and_get_their_own_answers() -> None:
    async def scenario() -> tuple[list[list[str]], list[str | Exception]]:
        recorder = Recorder()
        queue = BatchQueue(recorder.run, rows_of, max_batch_size=16)
        futures = [queue.submit((name, 1)) for name in ("a", "b", "fail", "c")]
        answers = await asyncio.gather(*futures)
        return recorder.batches, answers

    batches, answers = run(scenario())
    assert batches == [["a", "b", "fail", "c"]]
    assert answers[:2] == ["aa", "bb"] and answers[3] == "cc"
    assert isinstance(answers[2], ValueError) and str(answers[2]) == "fail failed"


def test_batches_are_cut_where_the_next_call_no_longer_fits() -> None:
    async def scenario() -> list[list[str]]:
        recorder = Recorder()
        queue = BatchQueue(recorder.run, rows_of, max_batch_size=8)
        await asyncio.gather(*(queue.submit((name, rows)) for name, rows in
                               [("a", 3), ("b", 3), ("c", 3), ("d", 5), ("e", 8)]))
        return recorder.batches

    # in order, never reordered to fill a batch: 3+3 (3 more would make 9), 3+5, 8
    assert run(scenario()) == [["a", "b"], ["c", "d"], ["e"]]


def test_calls_that_arrive_while_a_batch_runs_form_the_next_one() -> None:
    async def scenario() -> tuple[list[list[str]], list[str]]:
        recorder = Recorder(gated=True)
        queue = BatchQueue(recorder.run, rows_of, max_batch_size=16)
        first = queue.submit(("a", 1))
        await recorder.started.wait()
        later = [queue.submit((name, 1)) for name in ("b", "c")]
        await asyncio.sleep(0)
        assert recorder.batches == [["a"]]  # b and c wait while the first batch runs
        recorder.gates[0].set()
        while len(recorder.gates) < 2:
            await asyncio.sleep(0)
        recorder.gates[1].set()
        answers = await asyncio.gather(first, *later)
        return recorder.batches, answers

    batches, answers = run(scenario())
    assert batches == [["a"], ["b", "c"]]
    assert answers == ["aa", "bb", "cc"]


def test_a_failing_batch_function_fails_every_call_of_its_batch_only() -> None:
    async def scenario() -> tuple[list[BaseException | str], str]:
        calls = 0

        async def flaky(batch: list[tuple[str, int]]) -> list[str]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("the forward pass failed")
            return [name for name, _ in batch]

        queue = BatchQueue(flaky, rows_of, max_batch_size=2)
        failed = await asyncio.gather(queue.submit(("a", 1)), queue.submit(("b", 1)),
                                      return_exceptions=True)
        return failed, await queue.submit(("c", 1))

    failed, later = run(scenario())
    assert [str(error) for error in failed] == ["the forward pass failed"] * 2
    assert all(isinstance(error, RuntimeError) for error in failed)
    assert later == "c"  # the queue serves on


def test_cancelled_calls_are_left_out_of_their_batch() -> None:
    async def scenario() -> tuple[list[list[str]], str]:
        recorder = Recorder()
        queue = BatchQueue(recorder.run, rows_of, max_batch_size=16)
        gone = queue.submit(("gone", 1))
        kept = queue.submit(("kept", 1))
        gone.cancel()
        return recorder.batches, await kept

    batches, answer = run(scenario())
    assert batches == [["kept"]] and answer == "keptkept"


def test_with_a_wait_a_batch_takes_calls_of_later_turns_until_it_is_full() -> None:
    """With `wait_s` far longer than the test's deadline, the batch can only have run because
    it was full; calls of later turns joined it."""

    async def scenario() -> list[list[str]]:
        recorder = Recorder()
        queue = BatchQueue(recorder.run, rows_of, max_batch_size=4, wait_s=10 * DEADLINE_S)
        futures = []
        for name in "abcd":
            futures.append(queue.submit((name, 1)))
            for _ in range(3):
                await asyncio.sleep(0)
        await asyncio.gather(*futures)
        return recorder.batches

    assert run(scenario()) == [["a", "b", "c", "d"]]


@pytest.mark.parametrize("max_batch_size", [1, 3])
def test_a_call_larger_than_the_limit_still_runs_alone(max_batch_size: int) -> None:
    async def scenario() -> list[list[str]]:
        recorder = Recorder()
        queue = BatchQueue(recorder.run, rows_of, max_batch_size=max_batch_size)
        await asyncio.gather(queue.submit(("big", 5)), queue.submit(("small", 1)))
        return recorder.batches

    assert run(scenario()) == [["big"], ["small"]]
