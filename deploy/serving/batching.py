"""A replica's batch queue: the validated calls of concurrent requests, gathered into batches of
at most `max_batch_size` rows and run one batch at a time, in the order they came.

A call costs one future and a list entry; one drain task (started by the first call that finds
the queue idle, gone when the queue is empty) takes every batch. Calls that arrive while a batch
runs form the next one. A batch is taken once a turn of the event loop brought no new call
(at most `GATHER_TURNS` turns, `BatchQueue._gather`) or its rows reach `max_batch_size`; with
`wait_s` > 0, then once its rows reach `max_batch_size` or `wait_s` has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Call = TypeVar("Call")
Answer = TypeVar("Answer")
GATHER_TURNS = 16
"""Most turns of the event loop a batch waits for more calls (see `BatchQueue._gather`)."""


class BatchQueue(Generic[Call, Answer]):
    """Gathers calls into batches for `run`, which answers a batch with one answer per call, in order
    (an answer may be an Exception, handed to that call alone).

    Args:
        run: answers a batch of calls.
        rows: counts a call's rows.
        max_batch_size: the most rows of a batch (a batch always holds at least one call).
        wait_s: how long a batch that is not full waits for more calls; 0 takes it at once.
    """

    def __init__(self, run: Callable[[list[Call]], Awaitable[list[Answer]]],
                 rows: Callable[[Call], int], max_batch_size: int, wait_s: float = 0.0) -> None:
        self._run = run
        self._rows = rows
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._pending: deque[tuple[Call, int, asyncio.Future[Answer]]] = deque()
        self._pending_rows = 0
        self._drain_task: asyncio.Task[None] | None = None
        self._full = asyncio.Event()

    def submit(self, call: Call) -> asyncio.Future[Answer]:
        """Queue a call.

        Args:
            call: the validated call.

        Returns:
            A future that holds its answer once its batch has run (the exception, if the whole batch
                failed).
        """
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        rows = self._rows(call)
        self._pending.append((call, rows, future))
        self._pending_rows += rows
        if self._pending_rows >= self.max_batch_size:
            self._full.set()
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())
        return future

    def _take(self) -> tuple[list[Call], list[asyncio.Future[Answer]]]:
        """The next batch: the queued calls in order while their rows fit (at least one);
        calls whose requests were cancelled are dropped."""
        calls: list[Call] = []
        futures: list[asyncio.Future[Answer]] = []
        rows = 0
        pending = self._pending
        while pending and (not calls or rows + pending[0][1] <= self.max_batch_size):
            call, call_rows, future = pending.popleft()
            self._pending_rows -= call_rows
            if future.done():
                continue
            calls.append(call)
            futures.append(future)
            rows += call_rows
        return calls, futures

    async def _gather(self) -> None:
        """Let the event loop turn while calls keep arriving (at most `GATHER_TURNS` turns, and
        not past a full batch): requests whose tasks start in successive turns join one batch
        instead of each taking its own forward pass."""
        seen = -1
        for _ in range(GATHER_TURNS):
            if len(self._pending) == seen or self._pending_rows >= self.max_batch_size:
                return
            seen = len(self._pending)
            await asyncio.sleep(0)

    async def _drain(self) -> None:
        try:
            while self._pending:
                await self._gather()
                if self.wait_s and self._pending_rows < self.max_batch_size:
                    self._full.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), self.wait_s)
                calls, futures = self._take()
                if not calls:
                    continue
                try:
                    answers = await self._run(calls)
                except Exception as error:  # noqa: BLE001 - handed to every call of the batch
                    for future in futures:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for future, answer in zip(futures, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)
        finally:
            self._drain_task = None
