"""One replica of the policy server: the Ray Serve deployment. It owns the replica's policies
and forward passes (`deploy.serving.runner`), the one service every ingress calls
(`deploy.serving.service`), and the replica's own servers; its Serve methods are two more
ingresses.

Where requests come in:
- HTTP and gRPC behind `huggy serve`'s HAProxy: the replica's own listener on a Unix socket in
  HAProxy's folder (`haproxy_folder`, `deploy.serving.http_server`), where that folder is on
  this node.
- HTTP through Serve's HTTP server in the replica (`__call__`): other ingresses, replicas on
  other nodes, and HAProxy's health checks.
- gRPC through Serve's gRPC ingress (`Act`).

The policies, the default and the split come with the `user_config` (`reconfigure`), so a
redeploy that changes them applies to running replicas without a restart; the replica loads
and warms up what it holds there before it reports healthy. `PUT /v1/policies` asks for such a
redeploy: the replica hands the change to `huggy serve`'s change desk (`deploy.serving.changes`)
and answers once it is applied. With an API key, only its SHA-256 digest travels to the
replicas.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.exceptions import RayServeException
from ray.serve.grpc_util import RayServegRPCContext
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from deploy.serving.changes import DESK_NAMESPACE, PolicyChange, desk_name
from deploy.serving.grpc_ingress import RawMessage, grpc_code
from deploy.serving.haproxy import private_folder, replica_socket
from deploy.serving.http_server import UnixHttpServer
from deploy.serving.responses import ApiError
from deploy.serving.routes import ApiKey
from deploy.serving.runner import PolicyRunner, collect_young_objects_less_often
from deploy.serving.service import (
    CLIENT_CLOSED_REQUEST,
    ActService,
    Reply,
    RequestHead,
    request_head,
)
from deploy.serving.settings import split_user_config
from huggy_agent.devices import resolve_device
from huggy_agent_client.http_api import ACT_PATH, POLICIES_PATH

DEPLOYMENT_NAME = "HuggyPolicy"
OWN_LISTENER_GRACE_S = 4.0
"""How long the requests in flight of the replica's own listener may take to finish at
shutdown, seconds (under the deployment's `graceful_shutdown_timeout_s`)."""
logger = logging.getLogger("ray.serve")


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


def _replica_id() -> str | None:
    """Serve's id of this replica; None outside a Serve deployment."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except RayServeException:
        return None


def _app_name() -> str | None:
    """The Serve application of this replica; None outside a Serve deployment."""
    try:
        return serve.get_replica_context().app_name
    except RayServeException:
        return None


async def hand_in_change(app: str | None, change: PolicyChange) -> dict[str, Any]:
    """Hand a live change to the change desk of `huggy serve`'s process and wait for its outcome.

    Args:
        app: this replica's application.
        change: the change, its form checked.

    Returns:
        The served set, once every replica runs it.

    Raises:
        ApiError: 501 where no desk exists (an app of `serve run` or `serve deploy`); the desk's
            refusal (422 naming what is wrong, 500 for a redeploy that failed).
    """
    try:
        desk = ray.get_actor(desk_name(app or ""), namespace=DESK_NAMESPACE)
    except ValueError:
        raise ApiError(501, "not_supported", f"PUT {POLICIES_PATH} is applied by `huggy serve`'s "
                       "own process, which this app does not have (it was deployed with "
                       "`serve run` or `serve deploy`): change the policies in its config's "
                       "user_config and deploy it again") from None
    outcome = await desk.submit.remote(change.as_dict())
    if "error" in outcome:
        raise ApiError(outcome["status"], "change_refused", outcome["error"])
    return dict(outcome["served"])


def http_response(reply: Reply) -> Response:
    """A starlette answer for Serve's HTTP server.

    Args:
        reply: the service's reply.

    Returns:
        The response, its body JSON.
    """
    return Response(reply.body, status_code=reply.status, media_type="application/json",
                    headers=dict(reply.headers))


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
    loaded on first use, at most `models_per_replica` at once) behind the `/v1` HTTP API and
    the gRPC method.

    Args:
        device: the placement's device ("cpu", "cuda", "npu"); checked usable here.
        precision: the layers' precision.
        ingress: recorded in `/v1/info`.
        models_per_replica: the most policies held at once; None: all.
        api_key: the key's digest; None: no key.
        haproxy_folder: `huggy serve`'s HAProxy folder; where it exists on this node, HTTP
            requests and gRPC calls come through the replica's own listener there.
        route_prefix: the app's route prefix, which the listener's HTTP requests keep in their
            paths (as under Serve).
    """

    runner_class: type[PolicyRunner] = PolicyRunner
    """What answers with the policies: a subclass may take its place (a test's gated batches)."""

    def __init__(self, device: str, precision: str = "fp32", ingress: str = "",
                 models_per_replica: int | None = None, api_key: ApiKey | None = None,
                 haproxy_folder: str | None = None, route_prefix: str = "/") -> None:
        collect_young_objects_less_often()
        self.runner = self.runner_class(_pinned_device(device), precision, models_per_replica,
                                        ingress, _replica_id())
        app = _app_name()
        self.service = ActService(self.runner, api_key,
                                  lambda change: hand_in_change(app, change))
        self.haproxy_folder = None if haproxy_folder is None else Path(haproxy_folder)
        self.route_prefix = route_prefix.rstrip("/")
        self._http_server: UnixHttpServer | None = None

    async def reconfigure(self, config: dict[str, Any]) -> None:
        """Apply a `user_config`: batch settings, and the policies with their default and split
        (`PolicyRunner.configure`); then start the replica's own listener, once.

        Args:
            config: the deployment's `user_config`.

        Raises:
            ValueError: a bad config (naming the key or value).
        """
        settings, policies = split_user_config(config)
        await self.runner.configure(settings, policies)
        if self.haproxy_folder is not None and self._http_server is None:
            self._http_server = await self._listen_for_haproxy(self.haproxy_folder)

    async def _listen_for_haproxy(self, folder: Path) -> UnixHttpServer | None:
        """The replica's own HTTP listener on its socket in HAProxy's `folder`
        (`deploy.serving.haproxy.replica_socket`), where HAProxy sends its requests once it
        next writes its configuration; None where `folder` is not on this node or cannot hold
        the socket (HAProxy then reaches the replica through Serve's HTTP server)."""
        if not folder.is_dir():
            return None
        replica_id = self.runner.replica_id or "local"
        path = replica_socket(folder, replica_id)
        server = UnixHttpServer(self.service, root_path=self.route_prefix)
        try:
            private_folder(path.parent)
            await server.start(path)
        except (OSError, RuntimeError) as error:
            logger.warning("replica %s serves HTTP through Serve's server only: %s",
                           replica_id, error)
            return None
        return server

    async def __del__(self) -> None:
        """Serve's shutdown of the replica: its own listener stops taking requests and answers
        those in flight (within the deployment's graceful shutdown time); the socket goes."""
        if self._http_server is not None:
            await self._http_server.stop(grace=OWN_LISTENER_GRACE_S)

    def check_health(self) -> None:
        """Serve's periodic health check (`PolicyRunner.check_health`)."""
        self.runner.check_health()

    def held(self) -> list[str]:
        """The policies this replica holds.

        Returns:
            Their ids, least recently used first.
        """
        return self.runner.held()

    async def __call__(self, request: Request) -> Response:
        """A request through Serve's HTTP server: admitted on its headers, its body read within
        the limit as it arrives, answered by the service."""
        scope = request.scope
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        try:
            admission = self.service.admit(request.method, path, request_head(scope["headers"]))
            body = await self._read_body(request)
        except ApiError as error:
            return http_response(self.service.refusal(error))
        except ClientDisconnect:  # the client left before its body arrived: no one to answer
            self.service.abandoned()
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return http_response(await self.service.reply(admission, body))

    async def _read_body(self, request: Request) -> bytes:
        """The body of an admitted request, refused with 413 once what arrives exceeds the
        limit; ClientDisconnect if the client leaves first."""
        chunks, size, more = [], 0, True
        while more:  # the ASGI messages themselves: starlette's `stream` without its generator
            message = await request.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            self.service.check_size(size)
            chunks.append(chunk)
        return b"".join(chunks)

    async def Act(self, request: bytes,  # noqa: N802 - gRPC method name
                  grpc_context: RayServegRPCContext) -> RawMessage:
        """`/huggy.v1.Policy/Act` of Serve's gRPC ingress: the same JSON in and out as /v1/act; the policy
        by the `multiplexed_model_id` metadata, else the split's or the default. Always through the
        batch queue: Serve's gRPC server hands requests over one at a time, so each would find the
        replica idle and none would share a forward pass. Serve has read the whole message before this
        runs.

        Args:
            request: the call's message, the JSON body.
            grpc_context: Serve's gRPC context: the call's metadata in, the status out.

        Returns:
            The answer's JSON; empty, with the status and the API's JSON error as details, for a
                refused or failed call.
        """
        metadata = dict(grpc_context.invocation_metadata() or ())
        head = RequestHead(metadata.get("authorization"), len(request),
                           serve.get_multiplexed_model_id() or None)
        try:
            admission = self.service.admit("POST", ACT_PATH, head)
        except ApiError as error:
            reply = self.service.refusal(error)
        else:
            reply = await self.service.reply(admission, request, may_run_alone=False)
        if reply.status != 200:
            grpc_context.set_code(grpc_code(reply.status))
            grpc_context.set_details(reply.body.decode())
            return RawMessage(b"")
        return RawMessage(reply.body)
