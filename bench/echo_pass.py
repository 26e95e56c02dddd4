"""The floor under a replica of the policy server, for `bench_serve.py` (as a Serve deployment)
and `bench_replica.py` (in process): the echo plus the bundled policy's forward pass."""

from __future__ import annotations

import asyncio

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from deploy.serving.batching import BatchQueue
from deploy.serving.runner import collect_young_objects_less_often, warmup_sizes
from deploy.serving.settings import BatchSettings
from huggy_agent import HuggyAgent


class EchoPass:
    """The echo plus the bundled policy's forward pass over fixed observations, one row per
    request, gathered as our replicas gather them (their batch queue; a request that finds the
    handler idle runs alone, `compute_action` on one row without a batch axis, the agent's
    cheapest path, with the row helper woken as it enters), reading the body but not parsing
    it, and writing no actions, in a process whose collector is tuned as theirs: the least that
    a deployment running this policy costs."""

    def __init__(self) -> None:
        collect_young_objects_less_often()  # as a replica of ours does
        settings = BatchSettings()
        self.agent = HuggyAgent.from_checkpoint(None, device="cpu", engine="auto")
        self.agent.warmup(warmup_sizes(settings.max_batch_size))
        self.rows = np.random.default_rng(0).standard_normal(
            (settings.max_batch_size, *self.agent.spec.inputs[0].shape)).astype(np.float32)
        self.queue: BatchQueue[bytes, bytes] = BatchQueue(self._run, lambda _: 1,
                                                          settings.max_batch_size)
        self.in_flight = 0

    async def _run(self, bodies: list[bytes]) -> list[bytes]:
        self.agent.distribution(self.rows[:len(bodies)])
        return bodies

    async def __call__(self, request: Request) -> Response:
        if not self.in_flight:  # as our replica: a lone pass is likely
            self.agent.expect_row()
        self.in_flight += 1
        try:
            body = await request.body()
            if self.in_flight == 1:
                await asyncio.sleep(0)  # as our replica: requests arriving with it join
                if self.in_flight == 1:
                    self.agent.compute_action(self.rows[0], True)
                    return Response(body, media_type="application/json")
            return Response(await self.queue.submit(body), media_type="application/json")
        finally:
            self.in_flight -= 1
