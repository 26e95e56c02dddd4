"""The policy as a Ray Serve deployment with dynamic batching, and its app builder.

    serve run deploy.serve:app policy=path/to/Huggy.onnx accelerator=cpu
    serve run deploy/serve_config.yaml

A replica parses and validates each request on its own (bad ones are answered with a 4xx and
never join a batch), then `@serve.batch` gathers the rows of many requests into ONE forward pass
(`HuggyAgent.distribution`); each request's actions come from its own slice of that pass with its
own seed (`HuggyAgent.actions_from`), so batching never changes a request's answer. Batches are
counted in rows (observations), not requests. A request that finds the replica otherwise idle
(`batch_wait_timeout_s` 0, and after one turn of the event loop, in which requests that arrived
with it reach the same point, no other request in the replica) has no batch to join: it runs as
a batch of one straight away, without the round trip through the batch queue (about 1 ms per
request on a busy 2-core machine, where a whole echo request takes 1-2 ms).

The agent runs with `engine="auto"` (onnxruntime on a CPU, CUDA or NPU graphs on an accelerator).
A replica warms up every batch size it may see (`warmup_sizes`: graph engines capture one graph
per power of two) in its constructor and in `reconfigure`, so it reports healthy only once a
first request costs no more than any other.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import ray
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from ray import serve
from ray.serve import Application
from ray.serve.grpc_util import RayServegRPCContext
from ray.serve.metrics import Counter, Histogram
from starlette.requests import Request
from starlette.responses import Response

from deploy.api import (
    ACT_PATH,
    HEALTH_PATH,
    INFO_PATH,
    ActRequest,
    ApiError,
    act_response,
    check_route,
    openapi_document,
    parse_act_request,
)
from deploy.grpc_ingress import RawMessage, grpc_status
from deploy.placement import ACCELERATORS, ReplicaPlacement, plan_placement
from huggy_agent import Actions, HuggyAgent

DEPLOYMENT_NAME = "HuggyPolicy"
JSON = "application/json"
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
METRICS_REPORT_PASSES = 256
"""Forward passes whose metrics are handed to Ray together (see `_report_metrics`)."""


@dataclass(frozen=True)
class BatchSettings:
    """Batching and request limits; also the deployment's `user_config` (changeable live)."""

    max_batch_size: int = 256
    """Most observations (rows, over all requests) in one forward pass."""
    batch_wait_timeout_s: float = 0.0
    """How long a batch waits for more requests after its first; 0 takes what is queued."""
    max_rows: int = 256
    """Most observations in one request (413 above); at most `max_batch_size`."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted (413 above)."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BatchSettings:
        """Settings from a `user_config` dict; raises ValueError naming any bad key or value."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - names)
        if unknown:
            raise ValueError(f"unknown batch setting(s) {unknown}; expected {sorted(names)}")
        settings = cls(**{**asdict(cls()), **config})
        for name in ("max_batch_size", "max_rows", "max_body_bytes"):
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, received {value!r}")
        wait = settings.batch_wait_timeout_s
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 10:
            raise ValueError(f"batch_wait_timeout_s must be a number in [0, 10], received {wait!r}")
        if settings.max_rows > settings.max_batch_size:
            raise ValueError(f"max_rows ({settings.max_rows}) must not exceed max_batch_size "
                             f"({settings.max_batch_size}): a request is never split over batches")
        return settings


def _total_rows(requests: list[ActRequest]) -> int:
    """Batch size in observations, for `@serve.batch(batch_size_fn=...)`."""
    return sum(request.rows for request in requests)


def answer_arrays(agent: HuggyAgent, actions: Any, memory: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
    """What `/v1/act` answers, by name: `continuous`, `discrete` and `memory` as the policy has
    them, from `compute_action`'s result (with the memory in it) or `actions_from`'s."""
    if agent.spec.memory_size and memory is None:
        actions, memory = actions
    if isinstance(actions, Actions):
        arrays = {"continuous": actions.continuous, "discrete": actions.discrete}
    else:
        arrays = {"discrete" if agent.spec.discrete_branches else "continuous": actions}
    if memory is not None:
        arrays["memory"] = memory
    return arrays


def warmup_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= `max_batch_size`: every rung (of a graph
    engine) that a batch of up to `max_batch_size` rows lands on."""
    return [1 << k for k in range((max_batch_size - 1).bit_length() + 1)]


def _pinned_device(placement_device: str) -> str:
    """Check, in the replica, that the accelerator Ray granted is usable; fail at start if not."""
    from huggy_agent.devices import resolve_device

    try:
        return str(resolve_device(placement_device))
    except RuntimeError as error:
        granted = ray.get_runtime_context().get_accelerator_ids()
        visible = {name: os.environ[name] for name in
                   ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if name in os.environ}
        raise RuntimeError(
            f"replica pinned to {placement_device} cannot use it: {error}. Ray granted "
            f"{ {k: v for k, v in granted.items() if v} }, visible devices {visible}") from None


@serve.deployment(
    name=DEPLOYMENT_NAME,
    max_ongoing_requests=512,
    health_check_period_s=10,
    health_check_timeout_s=30,
    graceful_shutdown_timeout_s=5,
    max_constructor_retry_count=3,
    logging_config={"enable_access_log": False, "log_level": "WARNING"},
)
class HuggyPolicyDeployment:
    """One replica: a HuggyAgent on the device Ray pinned it to, behind the `/v1` HTTP API."""

    def __init__(self, policy: str | None, device: str, precision: str = "fp32",
                 ingress: str = "") -> None:
        device = _pinned_device(device)
        self.agent = (HuggyAgent(device=device, precision=precision, engine="auto")
                      if policy is None else
                      HuggyAgent.from_checkpoint(policy, device=device, precision=precision,
                                                 engine="auto"))
        self.settings = BatchSettings()
        self._in_flight = 0
        """Requests inside this replica now (HTTP and gRPC), the one asking included."""
        self._warmed_up_to = 0
        self._warm_up(self.settings.max_batch_size)
        self.ingress = ingress
        self.started = time.time()
        self.counters = {"requests": 0, "requests_alone": 0, "rejected": 0, "forward_passes": 0,
                         "rows": 0, "largest_batch_requests": 0, "largest_batch_rows": 0}
        probe = [np.zeros((1, *i.shape), dtype=np.float32) for i in self.agent.spec.inputs]
        self._probe: Any = probe[0] if len(probe) == 1 else probe
        self._batch_requests = Histogram(
            "huggy_batch_requests", description="Requests served per forward pass",
            boundaries=BATCH_BUCKETS)
        self._batch_rows = Histogram(
            "huggy_batch_rows", description="Observations per forward pass",
            boundaries=BATCH_BUCKETS)
        self._forward_passes = Counter(
            "huggy_forward_passes", description="Forward passes of the policy network")
        self._unreported: list[tuple[int, int]] = []

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Apply a `user_config` (keys of BatchSettings); raises ValueError on a bad one."""
        settings = BatchSettings.from_config(config or {})
        self._act_batch.set_max_batch_size(settings.max_batch_size)
        self._act_batch.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)
        self._warm_up(settings.max_batch_size)
        self.settings = settings

    def _warm_up(self, max_batch_size: int) -> None:
        """Run every path once at each size a request or batch may have, up to
        `max_batch_size`: batches take `distribution`, lone requests `compute_action`
        (deterministic or stochastic), each its own graphs in a graph engine."""
        if max_batch_size > self._warmed_up_to:
            self.agent.warmup(warmup_sizes(max_batch_size))
            self._warmed_up_to = max_batch_size

    def check_health(self) -> None:
        """Serve's periodic health check: one forward pass of a zero observation must succeed.
        Also reports the metrics counted since the last report."""
        self.agent.distribution(self._probe)
        self._report_metrics()

    async def __call__(self, request: Request) -> Response:
        self._in_flight += 1
        try:
            return await self._route(request)
        finally:
            self._in_flight -= 1

    async def _route(self, request: Request) -> Response:
        path = request.scope["path"]
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        try:
            check_route(path, request.method)
            if path == ACT_PATH:
                return await self._act(request)
            if path == HEALTH_PATH:
                body = {"status": "ok", "model": self.agent.fingerprint}
            elif path == INFO_PATH:
                body = self.info()
            else:
                body = openapi_document(self.agent.spec, self.settings.max_rows,
                                        self.settings.max_body_bytes)
            return Response(json.dumps(body).encode(), media_type=JSON)
        except ApiError as error:
            self.counters["rejected"] += 1
            return Response(error.body(), status_code=error.status, media_type=JSON)

    async def _act(self, request: Request) -> Response:
        body = await self._read_body(request)
        act = parse_act_request(body, self.agent.spec, self.settings.max_rows)
        return Response(await self._answer(act), media_type=JSON)

    async def _answer(self, act: ActRequest) -> bytes:
        self.counters["requests"] += 1
        alone = False
        if not self.settings.batch_wait_timeout_s:
            await asyncio.sleep(0)  # requests that arrived with this one reach this point too
            alone = self._in_flight == 1
        result = self._forward_alone(act) if alone else await self._act_batch(act)
        if isinstance(result, Exception):
            raise result
        return act_response(result, act.single, self.agent.fingerprint)

    async def Act(self, request: bytes,  # noqa: N802 - gRPC method name
                  grpc_context: RayServegRPCContext) -> RawMessage:
        """`/huggy.v1.Policy/Act` of the gRPC ingress: the same JSON in and out as /v1/act."""
        self._in_flight += 1
        try:
            return await self._act_grpc(request, grpc_context)
        finally:
            self._in_flight -= 1

    async def _act_grpc(self, request: bytes, grpc_context: RayServegRPCContext) -> RawMessage:
        try:
            limit = self.settings.max_body_bytes
            if len(request) > limit:
                raise ApiError(413, "body_too_large", f"request is {len(request)} bytes, the "
                               f"limit is {limit} bytes; send fewer rows per request")
            act = parse_act_request(request, self.agent.spec, self.settings.max_rows)
        except ApiError as error:
            self.counters["rejected"] += 1
            grpc_context.set_code(grpc_status(error.status))
            grpc_context.set_details(error.body().decode())
            return RawMessage()
        return RawMessage(await self._answer(act))

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, "body_too_large", f"request body is {declared} bytes, the limit "
                           f"is {limit} bytes; send fewer rows per request")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "body_too_large", f"request body exceeds the limit of {limit} "
                               "bytes; send fewer rows per request")
            chunks.append(chunk)
        return b"".join(chunks)

    @serve.batch(max_batch_size=BatchSettings.max_batch_size,
                 batch_wait_timeout_s=BatchSettings.batch_wait_timeout_s,
                 batch_size_fn=_total_rows)
    async def _act_batch(self, requests: list[ActRequest]
                         ) -> list[dict[str, np.ndarray] | Exception]:
        """The batch `@serve.batch` gathered, through `_forward`."""
        return self._forward(requests)

    def _forward_alone(self, act: ActRequest) -> dict[str, np.ndarray]:
        """A batch of one, with no batch to gather: `compute_action`, the same actions as
        `_forward([act])` (within the numerical contract) in one call to the engine."""
        agent = self.agent
        kwargs: dict[str, Any] = {}
        if act.action_mask is not None:
            kwargs["action_mask"] = act.action_mask
        if act.memory is not None:
            kwargs["memory"] = act.memory
        obs = act.inputs[0] if len(act.inputs) == 1 else act.inputs
        result = agent.compute_action(obs, act.deterministic, act.seed, act.row_offset, **kwargs)
        self.counters["requests_alone"] += 1
        self._count_batch(1, act.rows)
        return answer_arrays(agent, result)

    def _forward(self, requests: list[ActRequest]) -> list[dict[str, np.ndarray] | Exception]:
        """ONE forward pass over the rows of all `requests` (each input, and the memories,
        concatenated), then each request's own heads with its own seed and mask."""
        agent = self.agent
        inputs = [np.concatenate(parts) if len(parts) > 1 else parts[0]
                  for parts in zip(*(r.inputs for r in requests), strict=True)]
        memory = None
        if agent.spec.memory_size:
            memory = np.concatenate([r.memory for r in requests])
        outputs = agent.distribution(inputs[0] if len(inputs) == 1 else inputs, memory=memory)
        self._count_batch(len(requests), len(inputs[0]))
        results: list[dict[str, np.ndarray] | Exception] = []
        start = 0
        for request in requests:
            rows = outputs[start:start + request.rows]
            try:  # one request's failure must not fail the others of its batch
                actions = agent.actions_from(rows, request.deterministic, request.seed,
                                             request.row_offset, request.action_mask)
                new_memory = None if rows.memory is None else rows.memory.cpu().numpy()
                results.append(answer_arrays(agent, actions, new_memory))
            except Exception as error:  # noqa: BLE001 - handed back to that request alone
                results.append(error)
            start += request.rows
        return results

    def _count_batch(self, requests: int, rows: int) -> None:
        counters = self.counters
        counters["forward_passes"] += 1
        counters["rows"] += rows
        counters["largest_batch_requests"] = max(counters["largest_batch_requests"], requests)
        counters["largest_batch_rows"] = max(counters["largest_batch_rows"], rows)
        self._unreported.append((requests, rows))
        if len(self._unreported) >= METRICS_REPORT_PASSES:
            self._report_metrics()

    def _report_metrics(self) -> None:
        """Hand the forward passes counted since the last report to Ray's metrics.

        Not on every request: the three metric calls took ~0.1 ms of a one-observation answer in
        a replica on a busy 2-core machine. Ray exports metrics every few seconds anyway; reports
        happen every `METRICS_REPORT_PASSES` passes, at each health check (every 10 s) and with
        /v1/info.
        """
        for requests, rows in self._unreported:
            self._batch_requests.observe(requests)
            self._batch_rows.observe(rows)
        if self._unreported:
            self._forward_passes.inc(len(self._unreported))
        self._unreported.clear()

    def info(self) -> dict[str, Any]:
        """The policy's description, this replica's batching settings and counters."""
        self._report_metrics()
        counters = dict(self.counters)
        passes = counters["forward_passes"]
        counters["mean_batch_requests"] = counters["requests"] / passes if passes else 0.0
        counters["mean_batch_rows"] = counters["rows"] / passes if passes else 0.0
        context = serve.get_replica_context()
        return {
            **self.agent.describe(),
            "batching": asdict(self.settings),
            "counters": counters,
            "replica": context.replica_id.unique_id if context else None,
            "ingress": self.ingress,
            "warmed_up_to": self._warmed_up_to,
            "uptime_s": round(time.time() - self.started, 3),
        }


class AppArgs(BaseModel):
    """Arguments of the app builder (`serve run deploy.serve:app key=value ...`, or a config)."""

    model_config = ConfigDict(extra="forbid")

    policy: str | None = Field(None, description="a .onnx, .pt or results folder; None: bundled")
    accelerator: Literal["auto", "cpu", "gpu", "npu"] = "auto"
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    replicas: int = Field(1, ge=1, description="fixed number of replicas (without autoscale)")
    autoscale: bool = Field(False, description="scale between 1 and max_replicas on load")
    max_replicas: int = Field(4, ge=1)
    num_cpus: float = Field(1.0, ge=0, description="CPUs each replica holds")
    max_batch_size: int = BatchSettings.max_batch_size
    batch_wait_timeout_s: float = BatchSettings.batch_wait_timeout_s
    max_rows: int = BatchSettings.max_rows
    max_body_bytes: int = BatchSettings.max_body_bytes
    max_ongoing_requests: int = Field(512, ge=1)
    ingress: str = Field("", description="recorded in /v1/info; set by deploy.runner")

    @field_validator("policy")
    @classmethod
    def _existing_policy(cls, policy: str | None) -> str | None:
        """An absolute path (replicas do not share the caller's working directory)."""
        if policy is None:
            return None
        path = Path(policy).expanduser().resolve()
        if not path.exists():
            raise ValueError(f"policy {policy!r} not found (resolved to {path})")
        return str(path)

    @model_validator(mode="after")
    def _valid_batching(self) -> AppArgs:
        self.batch_settings()
        return self

    def batch_settings(self) -> BatchSettings:
        """The batch settings part of these arguments (validated)."""
        return BatchSettings.from_config({f.name: getattr(self, f.name)
                                          for f in fields(BatchSettings)})


def cluster_nodes() -> list[dict[str, float]]:
    """The resources of each alive node of the connected Ray cluster."""
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialized: connect with ray.init(address=...) or run "
                           "through `serve run` / `huggy serve`")
    return [dict(node["Resources"]) for node in ray.nodes() if node["Alive"]]


def build_app(args: AppArgs, nodes: list[dict[str, float]] | None = None) -> Application:
    """The application for `args`, placed on `nodes` (default: the connected cluster's).

    Raises ValueError for bad settings and RuntimeError when the replicas cannot start there.
    The batch settings become the deployment's `user_config`, applied by `reconfigure`.
    """
    settings = args.batch_settings()
    placement: ReplicaPlacement = plan_placement(
        args.accelerator, args.num_cpus, 1 if args.autoscale else args.replicas,
        cluster_nodes() if nodes is None else nodes)
    options: dict[str, Any] = {
        "ray_actor_options": placement.ray_actor_options(),
        "user_config": asdict(settings),
        "max_ongoing_requests": args.max_ongoing_requests,
    }
    if args.autoscale:
        options["autoscaling_config"] = {
            "min_replicas": 1, "max_replicas": args.max_replicas,
            "target_ongoing_requests": max(1, settings.max_batch_size // 4)}
    else:
        options["num_replicas"] = args.replicas
    return HuggyPolicyDeployment.options(**options).bind(
        args.policy, placement.device, args.precision, args.ingress)


def app(args: dict[str, Any]) -> Application:
    """App builder for `serve run deploy.serve:app policy=... accelerator=...` and config files."""
    return build_app(AppArgs.model_validate(args))


__all__ = ["ACCELERATORS", "AppArgs", "BatchSettings", "HuggyPolicyDeployment", "app",
           "build_app", "warmup_sizes"]
