"""What a replica answers with: its policies, held and warmed up, and one batch queue that
gathers the rows of concurrent requests into one forward pass. No protocol here: act bodies in,
answer bodies out (`PolicyRunner.act`), and the documents of the read-only routes.

A request names a policy (`<run>@<step>`, `<parent>/<file>`, as `huggy_agent.discovery` labels
them) by its route or header, else gets the split's (its `"session"` keeps a user on one) or the
default. The replica holds at most `models_per_replica` policies (`deploy.serving.held`), loading
one on a miss in a worker thread while the held ones answer.

Batching never changes a request's answer: each request's actions come from its own rows of the
pass, with its own seed, the heads of all of them in one call (`HuggyAgent.actions_of_parts`).
Batches are counted in rows (observations), not requests. A request that finds the replica
otherwise idle (no other request in it, still none after one turn of the event loop, and no
batch wait) runs as a batch of one straight away (`compute_action`), without the round trip
through the queue; the queue exists for the requests that arrive together. A request that
enters an idle replica after such a lone pass wakes the native engine's row helper
(`HuggyAgent.expect_row`), a second core that shares the next lone pass.

Each agent runs with `engine="auto"`, warmed up when the settings arrive
(`PolicyRunner.configure`).
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from deploy.serving.batching import BatchQueue
from deploy.serving.catalogue import PolicyEntry, PolicySet
from deploy.serving.held import HeldPolicies, ServedPolicy
from deploy.serving.metrics import ReplicaMetrics
from deploy.serving.openapi import openapi_document
from deploy.serving.parsing import ActRequest, act_from_document, plain_one_row, read_act_document
from deploy.serving.responses import ApiError, act_response, answer_arrays
from deploy.serving.settings import BatchSettings
from huggy_agent import HuggyAgent, PolicyOutputs
from huggy_agent_client.http_api import check_session_key
from huggy_agent_client.spec import ActorSpec

YOUNG_GC_THRESHOLD = 20_000
"""A replica process's threshold for collecting its youngest objects (Python's default: 700
more container objects allocated than freed). The requests of a batch hold thousands of objects
at once that all die young; at 700 the collector ran at almost every batch and traversed
objects about to be freed anyway (docs/benchmarks.md, "Young objects collected less often")."""


def collect_young_objects_less_often() -> None:
    """Set this process's young-generation threshold to `YOUNG_GC_THRESHOLD`, keeping the older
    generations' thresholds. A replica calls it once as it starts."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, middle, oldest)


def warmup_sizes(max_batch_size: int) -> list[int]:
    """The batch sizes a graph engine captures for batches of up to `max_batch_size` rows.

    Args:
        max_batch_size: the most rows of one forward pass.

    Returns:
        1, 2, 4, ... up to the first power of two at least `max_batch_size`.
    """
    return [1 << k for k in range((max_batch_size - 1).bit_length() + 1)]


@dataclass(frozen=True)
class PolicyCall:
    """One validated request for one held policy: what the batch queue gathers."""

    policy: ServedPolicy
    act: ActRequest


def _call_rows(call: PolicyCall) -> int:
    """A call's size in observations, for the batch queue."""
    return call.act.rows


Answer = dict[str, np.ndarray] | Exception
"""One call's arrays by name (`answer_arrays`), or the error that is its alone."""


class PolicyRunner:
    """A replica's policies, batch queue and forward passes.

    Args:
        device: the torch device the policies run on ("cpu", "cuda:0", "npu:0").
        precision: "fp32", "fp16" or "bf16" for the layers (the normalizer stays float32).
        models_per_replica: the most policies held at once (least recently used evicted);
            None: every served policy.
        ingress: recorded in `/v1/info`.
        replica_id: Serve's id of this replica, recorded in `/v1/info`; None outside Serve.
    """

    def __init__(self, device: str, precision: str = "fp32",
                 models_per_replica: int | None = None, ingress: str = "",
                 replica_id: str | None = None) -> None:
        self.device = device
        self.precision = precision
        self.models_per_replica = models_per_replica
        self.ingress = ingress
        self.replica_id = replica_id
        self.settings = BatchSettings()
        self.policies: PolicySet | None = None
        self.metrics = ReplicaMetrics()
        self.in_flight = 0
        """Requests being answered now (past their body), the one asking included."""
        self.started = time.time()
        self.load_ms: dict[str, float] = {}
        self._held = HeldPolicies(self._load, models_per_replica)
        self._warmed_up_to: dict[str, int] = {}
        self._last_alone: weakref.ref[HuggyAgent] | None = None
        """The agent of the latest forward pass if that was a request's alone, else None."""
        self._batches: BatchQueue[PolicyCall, Answer] = BatchQueue(
            self._run_batch, _call_rows, self.settings.max_batch_size,
            self.settings.batch_wait_timeout_s)

    async def configure(self, settings: BatchSettings, policies: PolicySet | None) -> None:
        """Apply new batch settings and, where given, a new set of policies.

        Policies removed or changed are dropped (requests holding them finish); the first
        `models_per_replica` of the new set (`PolicySet.preferred`) are loaded; every held policy is
        warmed up at every batch size it may see (`warmup_sizes`: graph engines capture one graph per
        power of two), so a replica reports healthy only once a first request costs no more than any
        other. Each agent runs with `engine="auto"` (onnxruntime on a CPU, CUDA or NPU graphs on an
        accelerator).

        Args:
            settings: the batch settings.
            policies: the served policies; None: the same as before.

        Raises:
            ValueError: no policies, and none were given before.
            PolicyLoadError: a policy to load cannot be loaded.
        """
        if policies is None:
            if self.policies is None:
                raise ValueError("the first user_config of a replica must name its 'policies'")
            policies = self.policies
        self._batches.max_batch_size = settings.max_batch_size
        self._batches.wait_s = settings.batch_wait_timeout_s
        old = {entry.id: entry for entry in self.policies.entries} if self.policies else {}
        self.settings = settings
        self.policies = policies
        gone = [policy_id for policy_id, entry in old.items()
                if policy_id not in policies.ids or policies.entry(policy_id) != entry]
        self._held.drop(gone)
        for policy_id in gone:
            self._warmed_up_to.pop(policy_id, None)
        held = self.held()
        room = (self.models_per_replica or len(policies.ids)) - len(held)
        for policy_id in [i for i in policies.preferred() if i not in held][:max(room, 0)]:
            await self._held.get(policies.entry(policy_id))
        for policy_id in self.held():
            self._warm_up(self._held[policy_id], settings.max_batch_size)

    async def _load(self, entry: PolicyEntry) -> ServedPolicy:
        """Load a policy of the catalogue in a worker thread (the held ones answer meanwhile)
        and warm up its one-row paths."""
        start = time.perf_counter()
        served = await asyncio.to_thread(self._build, entry)
        self.load_ms[entry.id] = round((time.perf_counter() - start) * 1e3, 1)
        self.metrics.counters["policy_loads"] += 1
        self._warmed_up_to[entry.id] = 1
        return served

    def _build(self, entry: PolicyEntry) -> ServedPolicy:
        agent = HuggyAgent.from_checkpoint(entry.path, device=self.device,
                                           precision=self.precision, engine="auto")
        agent.warmup([1])
        probe = [np.zeros((1, *i.shape), dtype=np.float32) for i in agent.spec.inputs]
        return ServedPolicy(entry, agent, probe[0] if len(probe) == 1 else probe)

    def _warm_up(self, served: ServedPolicy, max_batch_size: int) -> None:
        """Run every path of `served` once at each size a request or batch may have, up to
        `max_batch_size`: batches take `distribution`, lone requests `compute_action`
        (deterministic or stochastic), each its own graphs in a graph engine."""
        if max_batch_size > self._warmed_up_to.get(served.id, 0):
            served.agent.warmup(warmup_sizes(max_batch_size))
            self._warmed_up_to[served.id] = max_batch_size

    def held(self) -> list[str]:
        """The policies this replica holds.

        Returns:
            Their ids, least recently used first.
        """
        return self._held.ids()

    def check_health(self) -> None:
        """One forward pass of a zero observation through every held policy; reports the
        metrics counted since the last report. Raises what a failing pass raises."""
        for policy_id in self.held():
            served = self._held[policy_id]
            served.agent.distribution(served.probe)
        self.metrics.report()

    def expect_alone(self) -> None:
        """Called as an act request enters the replica: if it finds the replica idle and the
        latest pass was a lone request's, it will likely run alone too, so that pass's agent is
        told (`expect_row`) while the request is still being read (the native engine wakes a
        second core for the pass). After a batch, no: under load requests batch, and a helper
        woken on a busy machine takes the CPU from the replica itself."""
        if (not self.in_flight and self._last_alone is not None
                and not self.settings.batch_wait_timeout_s):
            agent = self._last_alone()
            if agent is not None:
                agent.expect_row()

    async def act(self, body: bytes, named: str | None, may_run_alone: bool = True) -> bytes:
        """The answer to an act body.

        The common body (`plain_one_row`) for a policy held now is read in one pass; any other
        is read in full before the policy is chosen (a bad body is refused before an unknown
        policy), and the body's `"session"` may choose it.

        Args:
            body: the request's JSON bytes.
            named: the policy id the request names (route or header), None for none.
            may_run_alone: whether a request that finds the replica idle may skip the batch
                queue (Serve's own gRPC ingress hands calls over one at a time, so each would
                find the replica idle and none would share a pass).

        Returns:
            The answer's JSON bytes.

        Raises:
            ApiError: the request is refused (400, 404, 413, 422).
        """
        self.in_flight += 1
        try:
            served = self._held_choice(named)
            if served is not None:
                act = plain_one_row(body, served.agent.spec)
                if act is not None:
                    return await self._answer(served, act, may_run_alone)
            document, exact = read_act_document(body)
            served = await self._choose(named, document.get("session"))
            act = act_from_document(document, exact, served.agent.spec, self.settings.max_rows)
            return await self._answer(served, act, may_run_alone)
        finally:
            self.in_flight -= 1

    def _held_choice(self, named: str | None) -> ServedPolicy | None:
        """The held policy that a request naming `named` (or none) and giving no session
        gets; None if it is unknown or not held now."""
        assert self.policies is not None
        try:
            return self._held.held(self.policies.entry(self.policies.choose(named)))
        except KeyError:
            return None

    async def _choose(self, named: str | None, session: Any) -> ServedPolicy:
        """The held policy of a request (loaded on a miss); 404 listing the known ids for an
        unknown one, 422 for a bad session key."""
        assert self.policies is not None
        try:
            session = check_session_key(session)
        except ValueError as error:
            raise ApiError(422, "invalid_request", str(error)) from None
        try:
            entry = self.policies.entry(self.policies.choose(named, session))
        except KeyError as error:
            raise ApiError(404, "unknown_policy", error.args[0]) from None
        return await self._held.get(entry)

    async def _answer(self, served: ServedPolicy, act: ActRequest, may_run_alone: bool) -> bytes:
        """The answer to a validated request: a batch of one straight away where the replica is
        otherwise idle (and `may_run_alone`), else through the batch queue."""
        self.metrics.count_request(served.id)
        alone = False
        if may_run_alone and not self.settings.batch_wait_timeout_s and self.in_flight == 1:
            await asyncio.sleep(0)  # requests that arrived with this one reach this point too
            alone = self.in_flight == 1
        result = (self._forward_alone(served, act) if alone
                  else await self._batches.submit(PolicyCall(served, act)))
        if isinstance(result, Exception):
            raise result
        return act_response(result, act.single, served.agent.fingerprint, served.id)

    async def _run_batch(self, calls: list[PolicyCall]) -> list[Answer]:
        """The batch the queue gathered: one forward pass per policy among `calls` (a pass
        never mixes policies), the answers in the order of `calls`."""
        by_policy: dict[str, list[int]] = {}
        for index, call in enumerate(calls):
            by_policy.setdefault(call.policy.id, []).append(index)
        results: list[Answer] = [None] * len(calls)  # type: ignore[list-item]
        for indices in by_policy.values():
            answers = self._forward(calls[indices[0]].policy, [calls[i].act for i in indices])
            for index, answer in zip(indices, answers, strict=True):
                results[index] = answer
        return results

    def _forward_alone(self, served: ServedPolicy, act: ActRequest) -> dict[str, np.ndarray]:
        """A batch of one, with no batch to gather: `compute_action`, the same actions as
        `_forward(served, [act])` (within the numerical contract) in one call to the engine."""
        agent = served.agent
        kwargs: dict[str, Any] = {}
        if act.action_mask is not None:
            kwargs["action_mask"] = act.action_mask
        if act.memory is not None:
            kwargs["memory"] = act.memory
        obs = act.inputs[0] if len(act.inputs) == 1 else act.inputs
        result = agent.compute_action(obs, act.deterministic, act.seed, act.row_offset, **kwargs)
        self.metrics.counters["requests_alone"] += 1
        self._last_alone = weakref.ref(agent)
        self.metrics.count_batch(1, act.rows)
        return answer_arrays(agent, result)

    def _forward(self, served: ServedPolicy, requests: list[ActRequest]) -> list[Answer]:
        """ONE forward pass of `served` over the rows of all `requests` (each input, and the
        memories, concatenated), then each request's own heads with its own seed and mask."""
        agent = served.agent
        self._last_alone = None
        inputs = [np.concatenate(parts) if len(parts) > 1 else parts[0]
                  for parts in zip(*(r.inputs for r in requests), strict=True)]
        memory = None
        if agent.spec.memory_size:
            memory = np.concatenate([r.memory for r in requests])
        outputs = agent.distribution(inputs[0] if len(inputs) == 1 else inputs, memory=memory)
        self.metrics.count_batch(len(requests), len(inputs[0]))
        memory_rows = None if outputs.memory is None else outputs.memory.cpu().numpy()
        starts = np.cumsum([0, *(request.rows for request in requests)]).tolist()
        try:
            actions = agent.actions_of_parts(outputs, requests)
        except Exception:  # noqa: BLE001 - find the request that failed: see below
            return [self._actions_alone(agent, outputs[start:stop], request)
                    for request, start, stop in zip(requests, starts, starts[1:], strict=False)]
        return [answer_arrays(agent, part, None if memory_rows is None else
                              memory_rows[start:stop])
                for part, start, stop in zip(actions, starts, starts[1:], strict=False)]

    @staticmethod
    def _actions_alone(agent: HuggyAgent, rows: PolicyOutputs, request: ActRequest) -> Answer:
        """One request's answer from its own rows of a batch whose heads failed together: its
        error, if it is the one that failed, goes back to it alone."""
        try:
            actions = agent.actions_from(rows, request.deterministic, request.seed,
                                         request.row_offset, request.action_mask)
        except Exception as error:  # noqa: BLE001 - handed back to that request alone
            return error
        return answer_arrays(agent, actions, None if rows.memory is None else
                             rows.memory.cpu().numpy())

    def _default_entry(self) -> PolicyEntry:
        assert self.policies is not None
        return self.policies.entry(self.policies.default)

    def health(self) -> dict[str, Any]:
        """`GET /v1/healthz`.

        Returns:
            `{"status": "ok", "model": <the default policy's weights fingerprint>}`.
        """
        return {"status": "ok", "model": self._default_entry().fingerprint}

    def info(self) -> dict[str, Any]:
        """`GET /v1/info`; reports the metrics counted since the last report.

        Returns:
            The default policy's description, the served policies with this replica's counters per
                policy, its batching settings and counters.
        """
        self.metrics.report()
        assert self.policies is not None
        default = self._default_entry()
        held = self.held()
        description = (self._held[default.id].agent.describe() if default.id in held
                       else {"spec": default.spec, "fingerprint": default.fingerprint,
                             "source": default.path, "step": default.step})
        requests = self.metrics.policy_requests
        return {
            **description,
            "policy": default.id,
            "policies": {entry.id: {"requests": requests.get(entry.id, 0),
                                    "held": entry.id in held,
                                    "load_ms": self.load_ms.get(entry.id)}
                         for entry in self.policies.entries},
            "split": None if self.policies.split is None else self.policies.split.shares(),
            "held": held,
            "models_per_replica": self.models_per_replica,
            "batching": asdict(self.settings),
            "counters": self.metrics.summary(),
            "replica": self.replica_id,
            "ingress": self.ingress,
            "warmed_up_to": self._warmed_up_to.get(default.id, 0),
            "uptime_s": round(time.time() - self.started, 3),
        }

    def openapi(self, keyed: bool) -> dict[str, Any]:
        """`GET /v1/openapi.json`: every served policy's route with its interface.

        Args:
            keyed: whether the server requires an API key.

        Returns:
            The OpenAPI document.
        """
        assert self.policies is not None
        interfaces = {entry.id: ActorSpec.from_dict(entry.spec)
                      for entry in self.policies.entries}
        act_ids = list(self.policies.split.ids) if self.policies.split else [
            self.policies.default]
        return openapi_document(interfaces[act_ids[0]], self.settings.max_rows,
                                self.settings.max_body_bytes, keyed, interfaces, act_ids)

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`.

        Returns:
            Every served policy (id, interface, spec, fingerprint, source, step, whether this replica
                holds it), the default and the split.
        """
        assert self.policies is not None
        held = self.held()
        return {"default": self.policies.default,
                "split": None if self.policies.split is None else self.policies.split.shares(),
                "models": [{**entry.as_dict(), "held": entry.id in held}
                           for entry in self.policies.entries]}
