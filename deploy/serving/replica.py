"""One replica of the policy server: a Ray Serve deployment with dynamic batching.

One code path serves one policy or many: a policy id (`<run>@<step>`, `<parent>/<file>`, as
`huggy_agent.discovery` labels them) keys the route (`/v1/models/{id}/act`, or the
`serve_multiplexed_model_id` header on `/v1/act`), the replica's table of held policies
(`deploy.serving.held`: at most `models_per_replica`, least recently used evicted), the batches
(a forward pass never mixes policies) and the counters. `/v1/act` without an id answers with the
split's policy (`"session"` keeps a user on one) or the default. The policies, default and split
travel in the `user_config`, so a redeploy that changes them reaches running replicas through
`reconfigure`, without a restart.

A replica parses and validates each request on its own (bad ones are answered with a 4xx and
never join a batch), then the replica's batch queue (`deploy.serving.batching`, one for HTTP and
gRPC alike) gathers the rows of many requests into ONE forward pass
(`HuggyAgent.distribution`); each request's actions come from its own rows of that pass with its
own seed, the heads of all of them in one call (`HuggyAgent.actions_of_parts`), so batching
never changes a request's answer. Batches are counted in rows (observations), not requests. An
HTTP request that finds the replica otherwise idle (`batch_wait_timeout_s` 0, no other request
in the replica, and still none after one turn of the event loop, in which requests that arrived
with it reach the same point) has no batch to join: it runs as a batch of one straight away,
without the round trip through the batch queue; so does a call to the replica's own gRPC server
(`grpc_address`). Behind `huggy serve`'s HAProxy, HTTP requests reach the replica through a
listener of its own (`deploy.serving.http_server`, a Unix socket in HAProxy's folder
`haproxy_folder`) rather than Serve's HTTP server, and take the same path from `__call__` on:
the same answers for less of the replica's CPU than Serve's server takes to answer an echo
(docs/benchmarks.md). A request that enters an idle replica after a lone pass wakes the native
engine's row helper (`HuggyAgent.expect_row`), a second core that shares such a lone pass. The
common body, one observation row for a policy held now, is read in one pass (`plain_one_row`).
Calls through Serve's gRPC ingress always take the queue (see `Act`; docs/serving.md's Batching
section has the costs).

A replica collects young objects less often than Python does by default
(`YOUNG_GC_THRESHOLD`): a batch's requests hold thousands of them at once.

Each agent runs with `engine="auto"` (onnxruntime on a CPU, CUDA or NPU graphs on an
accelerator). A replica loads the policies it holds and warms up every batch size they may see
(`warmup_sizes`: graph engines capture one graph per power of two) in `reconfigure`, so it
reports healthy only once a first request costs no more than any other. A policy loaded later,
on a miss, is loaded in a worker thread (the held ones keep answering) and warmed up at one row.

With an API key, every request is checked where it enters the replica (`_route` for HTTP,
`_act_grpc` for gRPC), before any routing: every route but `/v1/healthz` answers 401 without
`Authorization: Bearer <key>`. Only the key's SHA-256 digest travels to the replicas.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import ray
from ray import serve
from ray.serve.grpc_util import RayServegRPCContext
from ray.serve.metrics import Counter
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from deploy.serving.batching import BatchQueue
from deploy.serving.catalogue import PolicyEntry, PolicySet
from deploy.serving.grpc_ingress import (
    ACT_METHOD,
    RawMessage,
    grpc_status,
    start_replica_server,
)
from deploy.serving.grpc_server import CallContext, UnaryServer
from deploy.serving.haproxy import private_folder, replica_socket
from deploy.serving.held import HeldPolicies, ServedPolicy
from deploy.serving.http_server import UnixHttpServer
from deploy.serving.metrics import BucketCounters
from deploy.serving.openapi import openapi_document
from deploy.serving.parsing import (
    ActRequest,
    act_from_document,
    plain_one_row,
    read_act_document,
)
from deploy.serving.responses import (
    ApiError,
    act_response,
    answer_arrays,
    error_response,
    internal_error,
)
from deploy.serving.routes import ApiKey, check_route
from deploy.serving.settings import BatchSettings, split_user_config
from huggy_agent import HuggyAgent, PolicyOutputs
from huggy_agent.devices import resolve_device
from huggy_agent.http_api import (
    ACT_PATH,
    HEALTH_PATH,
    INFO_PATH,
    MODEL_ACT_ROUTE,
    MODELS_PATH,
    POLICY_ID_HEADER,
    check_session_key,
)
from huggy_agent.spec import ActorSpec

DEPLOYMENT_NAME = "HuggyPolicy"
JSON = "application/json"
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
OWN_SERVERS_GRACE_S = 4.0
"""How long the calls in flight of the replica's own servers (gRPC, and HTTP for HAProxy) may
take to finish at shutdown, seconds (under the deployment's `graceful_shutdown_timeout_s`)."""
METRICS_REPORT_PASSES = 256
"""Forward passes whose metrics are handed to Ray together (see `_report_metrics`)."""
CLIENT_CLOSED_REQUEST = 499
"""The status of a request whose client left before sending its body (nginx's name for it): it
is counted, not logged as a failure."""
YOUNG_GC_THRESHOLD = 20_000
"""A replica process's threshold for collecting its youngest objects (Python's default is 700
more container objects allocated than freed). The requests of a batch hold thousands of
objects at once that all die young, so at 700 the collector ran at almost every batch and
traversed objects about to be freed anyway: 13 us of the replica's CPU per request at 16
clients and 26 us at 64 (docs/benchmarks.md). At 20,000 it runs when objects accumulate."""
logger = logging.getLogger("ray.serve")


def collect_young_objects_less_often() -> None:
    """Set this process's young-generation threshold to `YOUNG_GC_THRESHOLD` (the older
    generations' thresholds kept). A replica calls it once as it starts."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, middle, oldest)


@dataclass(frozen=True)
class PolicyCall:
    """One validated request for one held policy: what the batch queue gathers."""

    policy: ServedPolicy
    act: ActRequest


def _call_rows(call: PolicyCall) -> int:
    """A call's size in observations, for the batch queue."""
    return call.act.rows


def warmup_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= `max_batch_size`: every rung (of a graph
    engine) that a batch of up to `max_batch_size` rows lands on."""
    return [1 << k for k in range((max_batch_size - 1).bit_length() + 1)]


def _pinned_device(placement_device: str) -> str:
    """Check, in the replica, that the accelerator Ray granted is usable; fail at start if not."""
    try:
        return str(resolve_device(placement_device))
    except RuntimeError as error:
        granted = ray.get_runtime_context().get_accelerator_ids()
        visible = {name: os.environ[name] for name in
                   ("ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if name in os.environ}
        raise RuntimeError(
            f"replica pinned to {placement_device} cannot use it: {error}. Ray granted "
            f"{ {k: v for k, v in granted.items() if v} }, visible devices {visible}") from None


_POLICY_ID_NAMES = (POLICY_ID_HEADER.encode(), POLICY_ID_HEADER.replace("_", "-").encode())


def _act_headers(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """(Content-Length, the policy id header) of an ASGI request's headers, in one pass, each
    the first of its name (as starlette's `Headers.get`); the id by `POLICY_ID_HEADER`, else by
    its spelling with dashes; None where absent."""
    declared = None
    named: list[str | None] = [None, None]
    for name, value in headers:
        if name == b"content-length":
            if declared is None:
                declared = value.decode("latin-1")
        elif name in _POLICY_ID_NAMES:
            spelling = _POLICY_ID_NAMES.index(name)
            if named[spelling] is None:
                named[spelling] = value.decode("latin-1")
    return declared, named[0] if named[0] is not None else named[1]


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
    """One replica: the served policies (each a HuggyAgent on the device Ray pinned it to,
    loaded on first use, at most `models_per_replica` at once) behind the `/v1` HTTP API.

    The policies, the default and the split come with the `user_config` (`reconfigure`), so a
    redeploy that changes them applies to running replicas without a restart. A replica loads
    and warms up the policies it holds there, the default first, before it reports healthy.
    """

    def __init__(self, device: str, precision: str = "fp32", ingress: str = "",
                 models_per_replica: int | None = None, api_key: ApiKey | None = None,
                 grpc_address: tuple[str, int] | None = None,
                 haproxy_folder: str | None = None, route_prefix: str = "/") -> None:
        self.device = _pinned_device(device)
        collect_young_objects_less_often()
        self.precision = precision
        self.models_per_replica = models_per_replica
        self.settings = BatchSettings()
        self.policies: PolicySet | None = None
        self.api_key = api_key
        self.grpc_address = grpc_address
        """(host, port) of the replica's own gRPC server, started once the first
        `reconfigure` has loaded the policies; None: none."""
        self._grpc_server: UnaryServer | None = None
        self.haproxy_folder = None if haproxy_folder is None else Path(haproxy_folder)
        """`huggy serve`'s HAProxy folder: where that exists on this node, HTTP requests come
        through the replica's own listener there (`_listen_for_haproxy`); None: none."""
        self.route_prefix = route_prefix
        """The app's route prefix, which the paths of those requests keep (as under Serve)."""
        self._http_server: UnixHttpServer | None = None
        self._in_flight = 0
        """Requests inside this replica now (HTTP and gRPC), the one asking included."""
        self._last_alone: weakref.ref[HuggyAgent] | None = None
        """The agent of the latest forward pass if that was a request's alone, else None (see
        `_expect_alone`)."""
        self._held = HeldPolicies(self._load, models_per_replica)
        self._warmed_up_to: dict[str, int] = {}
        self.load_ms: dict[str, float] = {}
        self.ingress = ingress
        self.started = time.time()
        self.counters = {"requests": 0, "requests_alone": 0, "rejected": 0, "forward_passes": 0,
                         "rows": 0, "largest_batch_requests": 0, "largest_batch_rows": 0,
                         "policy_loads": 0, "disconnected": 0}
        self.policy_requests: dict[str, int] = {}
        self._batch_requests = BucketCounters(
            "huggy_batch_requests", "Requests served per forward pass", BATCH_BUCKETS)
        self._batch_rows = BucketCounters(
            "huggy_batch_rows", "Observations per forward pass", BATCH_BUCKETS)
        self._forward_passes = Counter(
            "huggy_forward_passes", description="Forward passes of the policy network")
        self._requests_by_policy = Counter(
            "huggy_policy_requests", description="Requests answered, by policy",
            tag_keys=("policy",))
        self._batches: BatchQueue[PolicyCall, dict[str, np.ndarray] | Exception] = BatchQueue(
            self._run_batch, _call_rows, self.settings.max_batch_size,
            self.settings.batch_wait_timeout_s)
        self._unreported: list[tuple[int, int]] = []
        self._unreported_policies: dict[str, int] = {}

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """Apply a `user_config`: batch settings, and the policies with their default and
        split. Policies removed or changed are dropped (requests holding them finish); the
        first `models_per_replica` of the new set (`PolicySet.preferred`) are loaded and
        warmed up. Raises ValueError on a bad config."""
        settings, policies = split_user_config(config)
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
        if self.grpc_address is not None and self._grpc_server is None:
            self._grpc_server = await start_replica_server(self._act_own_grpc, *self.grpc_address)
        if self.haproxy_folder is not None and self._http_server is None:
            self._http_server = await self._listen_for_haproxy(self.haproxy_folder)
        if self._http_server is not None:
            self._http_server.max_body_bytes = settings.max_body_bytes

    async def _listen_for_haproxy(self, folder: Path) -> UnixHttpServer | None:
        """The replica's own HTTP listener on its socket in HAProxy's `folder`
        (`deploy.serving.haproxy.replica_socket`), where HAProxy sends its requests once it
        next writes its configuration; None where `folder` is not on this node or cannot hold
        the socket (HAProxy then reaches the replica through Serve's HTTP server)."""
        if not folder.is_dir():
            return None
        context = serve.get_replica_context()
        path = replica_socket(folder, context.replica_id.unique_id)
        server = UnixHttpServer(self._from_haproxy, self.settings.max_body_bytes,
                                abandoned=self._count_disconnected,
                                root_path=self.route_prefix.rstrip("/"))
        try:
            private_folder(path.parent)
            await server.start(path)
        except (OSError, RuntimeError) as error:
            logger.warning("replica %s serves HTTP through Serve's server only: %s",
                           context.replica_id.unique_id, error)
            return None
        return server

    def _count_disconnected(self) -> None:
        """A client left before its request's body arrived: counted, not answered."""
        self.counters["disconnected"] += 1

    async def _from_haproxy(self, scope: dict[str, Any], body: bytes) -> Response:
        """A request read by the replica's own listener: handed to `__call__` as Serve's HTTP
        server hands one over."""
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        return await self(Request(scope, receive))

    async def __del__(self) -> None:
        """Serve's shutdown of the replica: its own servers stop taking requests and answer
        those in flight (within the deployment's graceful shutdown time); the socket goes."""
        await asyncio.gather(*(server.stop(grace=OWN_SERVERS_GRACE_S)
                               for server in (self._grpc_server, self._http_server)
                               if server is not None))

    async def _load(self, entry: PolicyEntry) -> ServedPolicy:
        """Load a policy of the catalogue (in a worker thread, so the held policies keep
        answering meanwhile) and warm up its one-row paths."""
        start = time.perf_counter()
        served = await asyncio.to_thread(self._build, entry)
        self.load_ms[entry.id] = round((time.perf_counter() - start) * 1e3, 1)
        self.counters["policy_loads"] += 1
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
        """The ids of the policies this replica holds, least recently used first."""
        return self._held.ids()

    def check_health(self) -> None:
        """Serve's periodic health check: one forward pass of a zero observation through every
        held policy must succeed. Also reports the metrics counted since the last report."""
        for policy_id in self.held():
            served = self._held[policy_id]
            served.agent.distribution(served.probe)
        self._report_metrics()

    def _expect_alone(self) -> None:
        """Called as a request enters the replica: if it finds the replica idle and the latest
        pass was a lone request's, it will likely run alone too, so that pass's agent is told
        (`expect_row`) while the request is still being read (the native engine wakes a second
        core for the pass). After a batch, no: under load requests batch, and a helper woken
        on a busy machine takes the CPU from the replica itself (at 64 clients a woken helper
        held 12% of the replica's time, docs/benchmarks.md)."""
        if (not self._in_flight and self._last_alone is not None
                and not self.settings.batch_wait_timeout_s):
            agent = self._last_alone()
            if agent is not None:
                agent.expect_row()

    async def __call__(self, request: Request) -> Response:
        self._expect_alone()
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
            if self.api_key is not None:
                self.api_key.authorize(path, request.headers.get("authorization"))
            route, policy_id = check_route(path, request.method)
            if route in (ACT_PATH, MODEL_ACT_ROUTE):
                return await self._act(request, policy_id)
            if route == HEALTH_PATH:
                body = {"status": "ok", "model": self._default_entry().fingerprint}
            elif route == INFO_PATH:
                body = self.info()
            elif route == MODELS_PATH:
                body = self.models()
            else:
                body = self.openapi()
            return Response(json.dumps(body).encode(), media_type=JSON)
        except ApiError as error:
            self.counters["rejected"] += 1
            return error_response(error)
        except ClientDisconnect:  # the client left before its body arrived: no one to answer
            self.counters["disconnected"] += 1
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Exception as error:  # answered as JSON; the replica serves on
            logger.exception("request %s %s failed", request.method, path)
            return error_response(internal_error(error))

    async def _act(self, request: Request, named: str | None) -> Response:
        declared, header_named = _act_headers(request.scope["headers"])
        body = await self._read_body(request, declared)
        named = header_named if named is None else named
        return Response(await self._answer_body(body, named), media_type=JSON)

    async def _answer_body(self, body: bytes, named: str | None, may_run_alone: bool = True
                           ) -> bytes:
        """The answer to an act body for the policy `named` (by the path or the header), else
        the split's or the default; `may_run_alone`: see `_answer`.

        The common body (`plain_one_row`) for a policy held now is read in one pass; any other
        is read in full before the policy is chosen (a bad body is refused before an unknown
        policy), and the body's session may choose it."""
        served = self._held_choice(named)
        if served is not None:
            act = plain_one_row(body, served.agent.spec)
            if act is not None:
                return await self._answer(served, act, may_run_alone)
        document, exact = read_act_document(body)
        served = await self._choose(named, document.get("session"))
        act = act_from_document(document, exact, served.agent.spec, self.settings.max_rows)
        return await self._answer(served, act, may_run_alone)

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

    async def _answer(self, served: ServedPolicy, act: ActRequest, may_run_alone: bool = True
                      ) -> bytes:
        """The answer to a validated request: a batch of one straight away where the replica is
        otherwise idle (and `may_run_alone`), else through the batch queue (see `Act`)."""
        self.counters["requests"] += 1
        self.policy_requests[served.id] = self.policy_requests.get(served.id, 0) + 1
        self._unreported_policies[served.id] = self._unreported_policies.get(served.id, 0) + 1
        alone = False
        if may_run_alone and not self.settings.batch_wait_timeout_s and self._in_flight == 1:
            await asyncio.sleep(0)  # requests that arrived with this one reach this point too
            alone = self._in_flight == 1
        result = (self._forward_alone(served, act) if alone
                  else await self._batches.submit(PolicyCall(served, act)))
        if isinstance(result, Exception):
            raise result
        return act_response(result, act.single, served.agent.fingerprint, served.id)

    async def Act(self, request: bytes,  # noqa: N802 - gRPC method name
                  grpc_context: RayServegRPCContext) -> RawMessage:
        """`/huggy.v1.Policy/Act` of Serve's gRPC ingress: the same JSON in and out as /v1/act;
        the policy by the `multiplexed_model_id` metadata, else the split's or the default.
        Always through the batch queue: Serve's gRPC server hands requests over one at a time,
        so each would find the replica idle and none would share a forward pass."""
        named = serve.get_multiplexed_model_id() or None  # `multiplexed_model_id` metadata
        return RawMessage(await self._act_grpc(request, grpc_context, named, may_run_alone=False))

    async def _act_own_grpc(self, request: bytes, context: CallContext) -> bytes:
        """`/huggy.v1.Policy/Act` of the replica's own gRPC server: as `Act`, but a call that
        finds the replica otherwise idle runs alone at once, as an HTTP request does."""
        named = dict(context.invocation_metadata() or ()).get("multiplexed_model_id") or None
        return await self._act_grpc(request, context, named, may_run_alone=True)

    async def _act_grpc(self, request: bytes, context: CallContext | RayServegRPCContext,
                        named: str | None, may_run_alone: bool) -> bytes:
        """The answer to one gRPC call; a refused one ends with the status of its HTTP error
        (`grpc_status`) and the API's JSON as the details."""
        if may_run_alone:
            self._expect_alone()
        self._in_flight += 1
        try:
            if self.api_key is not None:
                metadata = dict(context.invocation_metadata() or ())
                self.api_key.authorize(ACT_PATH, metadata.get("authorization"))
            limit = self.settings.max_body_bytes
            if len(request) > limit:
                raise ApiError(413, "body_too_large", f"request is {len(request)} bytes, the "
                               f"limit is {limit} bytes; send fewer rows per request")
            return await self._answer_body(request, named, may_run_alone)
        except ApiError as error:
            self.counters["rejected"] += 1
            context.set_code(grpc_status(error.status))
            context.set_details(error.body().decode())
            return b""
        except Exception as error:  # answered with the API's JSON; the replica serves on
            logger.exception("gRPC call %s failed", ACT_METHOD)
            context.set_code(grpc.StatusCode.INTERNAL)
            context.set_details(internal_error(error).body().decode())
            return b""
        finally:
            self._in_flight -= 1

    async def _read_body(self, request: Request, declared: str | None) -> bytes:
        """The body, refused with 413 when its `declared` Content-Length or what arrives
        exceeds the limit."""
        limit = self.settings.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, "body_too_large", f"request body is {declared} bytes, the limit "
                           f"is {limit} bytes; send fewer rows per request")
        chunks, size, more = [], 0, True
        while more:  # the ASGI messages themselves: starlette's `stream` without its generator
            message = await request.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "body_too_large", f"request body exceeds the limit of {limit} "
                               "bytes; send fewer rows per request")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _run_batch(self, calls: list[PolicyCall]
                         ) -> list[dict[str, np.ndarray] | Exception]:
        """The batch the queue gathered, through `_forward_calls`."""
        return self._forward_calls(calls)

    def _forward_calls(self, calls: list[PolicyCall]) -> list[dict[str, np.ndarray] | Exception]:
        """One `_forward` per policy among `calls`, so a forward pass never mixes policies;
        the answers in the order of `calls`."""
        by_policy: dict[str, list[int]] = {}
        for index, call in enumerate(calls):
            by_policy.setdefault(call.policy.id, []).append(index)
        results: list[dict[str, np.ndarray] | Exception] = [None] * len(calls)  # type: ignore[list-item]
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
        self.counters["requests_alone"] += 1
        self._last_alone = weakref.ref(agent)
        self._count_batch(1, act.rows)
        return answer_arrays(agent, result)

    def _forward(self, served: ServedPolicy, requests: list[ActRequest]
                 ) -> list[dict[str, np.ndarray] | Exception]:
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
        self._count_batch(len(requests), len(inputs[0]))
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
    def _actions_alone(agent: HuggyAgent, rows: PolicyOutputs, request: ActRequest
                       ) -> dict[str, np.ndarray] | Exception:
        """One request's answer from its own rows of a batch whose heads failed together: its
        error, if it is the one that failed, goes back to it alone."""
        try:
            actions = agent.actions_from(rows, request.deterministic, request.seed,
                                         request.row_offset, request.action_mask)
        except Exception as error:  # noqa: BLE001 - handed back to that request alone
            return error
        return answer_arrays(agent, actions, None if rows.memory is None else
                             rows.memory.cpu().numpy())

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
        """Hand the forward passes and the requests per policy counted since the last report
        to Ray's metrics.

        Not on every request: the metric calls are a measurable share of a one-observation
        answer, and Ray exports metrics every few seconds anyway. Reports happen every
        `METRICS_REPORT_PASSES` passes, at each health check (every 10 s) and with /v1/info.
        The batch sizes go on bucket counters (`BucketCounters`), not Ray's `Histogram`, each of
        whose observations costs Ray's metrics agent a call.
        """
        if self._unreported:
            requests, rows = zip(*self._unreported, strict=True)
            self._batch_requests.add(requests)
            self._batch_rows.add(rows)
            self._forward_passes.inc(len(self._unreported))
        self._unreported.clear()
        for policy_id, count in self._unreported_policies.items():
            self._requests_by_policy.inc(count, tags={"policy": policy_id})
        self._unreported_policies.clear()

    def _default_entry(self) -> PolicyEntry:
        assert self.policies is not None
        return self.policies.entry(self.policies.default)

    def info(self) -> dict[str, Any]:
        """The default policy's description, the served policies with this replica's counters
        per policy, its batching settings and counters."""
        self._report_metrics()
        assert self.policies is not None
        counters = dict(self.counters)
        passes = counters["forward_passes"]
        counters["mean_batch_requests"] = counters["requests"] / passes if passes else 0.0
        counters["mean_batch_rows"] = counters["rows"] / passes if passes else 0.0
        context = serve.get_replica_context()
        default = self._default_entry()
        held = self.held()
        description = (self._held[default.id].agent.describe() if default.id in held
                       else {"spec": default.spec, "fingerprint": default.fingerprint,
                             "source": default.path, "step": default.step})
        return {
            **description,
            "policy": default.id,
            "policies": {entry.id: {"requests": self.policy_requests.get(entry.id, 0),
                                    "held": entry.id in held,
                                    "load_ms": self.load_ms.get(entry.id)}
                         for entry in self.policies.entries},
            "split": None if self.policies.split is None else self.policies.split.shares(),
            "held": held,
            "models_per_replica": self.models_per_replica,
            "batching": asdict(self.settings),
            "counters": counters,
            "replica": context.replica_id.unique_id if context else None,
            "ingress": self.ingress,
            "warmed_up_to": self._warmed_up_to.get(default.id, 0),
            "uptime_s": round(time.time() - self.started, 3),
        }

    def openapi(self) -> dict[str, Any]:
        """This server's OpenAPI document: every served policy's route, with its interface."""
        assert self.policies is not None
        interfaces = {entry.id: ActorSpec.from_dict(entry.spec)
                      for entry in self.policies.entries}
        act_ids = list(self.policies.split.ids) if self.policies.split else [
            self.policies.default]
        return openapi_document(interfaces[act_ids[0]], self.settings.max_rows,
                                self.settings.max_body_bytes, self.api_key is not None,
                                interfaces, act_ids)

    def models(self) -> dict[str, Any]:
        """`GET /v1/models`: every served policy (id, interface, spec, fingerprint, source,
        step), the default and the split."""
        assert self.policies is not None
        held = self.held()
        return {"default": self.policies.default,
                "split": None if self.policies.split is None else self.policies.split.shares(),
                "models": [{**entry.as_dict(), "held": entry.id in held}
                           for entry in self.policies.entries]}
