"""The policy server's Ray Serve application: `build_app` places the replicas
(`deploy.placement`) and hands them the batch settings and the policies as the deployment's
`user_config`, so a redeploy that changes only those reconfigures the running replicas.

    serve run deploy.serving.app:app policy=path/to/Huggy.onnx accelerator=cpu
    serve run deploy/serve_config.yaml
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
from ray.serve import Application

from deploy import ray_internals
from deploy.placement import ReplicaPlacement, plan_placement
from deploy.serving.catalogue import PolicySet
from deploy.serving.replica import HuggyPolicyDeployment
from deploy.serving.routes import ApiKey
from deploy.serving.settings import AppArgs, app_args
from huggy_agent_client.http_api import load_api_key

SERVING_PACKAGE = Path(__file__).resolve().parent
"""The serving package: its code is part of every deployment's version."""


def cluster_nodes() -> list[dict[str, float]]:
    """The resources of each alive node of the connected Ray cluster.

    Returns:
        One resource dict per alive node, in Ray's names.

    Raises:
        RuntimeError: Ray is not initialized.
    """
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialized: connect with ray.init(address=...) or run "
                           "through `serve run` / `huggy serve`")
    return [dict(node["Resources"]) for node in ray.nodes() if node["Alive"]]


def build_app(args: AppArgs, policies: PolicySet | None = None,
              nodes: list[dict[str, float]] | None = None) -> Application:
    """The application for `args`: its replicas placed, its batch settings and policies as the
    deployment's `user_config` (applied by `reconfigure`: a redeploy that changes only them
    reaches the running replicas).

    Args:
        args: the app builder's arguments.
        policies: the served policies; None: `args.policy_set()`, which reads every policy file
            (pass the set where it was built already).
        nodes: the resources of each node; None: the connected cluster's.

    Returns:
        The bound Serve application.

    Raises:
        ValueError: bad settings, or a policy set that `args` does not make.
        RuntimeError: the replicas cannot start there, or Ray is not initialized.
        RayInternalsError: this Ray lacks a private name the deployment's version needs.
    """
    ray_internals.check(serve=True)
    settings = args.batch_settings()
    if policies is None:
        policies = args.policy_set()
    placement: ReplicaPlacement = plan_placement(
        args.accelerator, args.num_cpus, 1 if args.autoscale else args.replicas,
        cluster_nodes() if nodes is None else nodes)
    options: dict[str, Any] = {
        "ray_actor_options": placement.ray_actor_options(),
        "user_config": {**asdict(settings), **policies.as_config()},
        "max_ongoing_requests": args.max_ongoing_requests,
    }
    if args.autoscale:
        options["autoscaling_config"] = {
            "min_replicas": 1, "max_replicas": args.max_replicas,
            "target_ongoing_requests": max(1, settings.max_batch_size // 4)}
    else:
        options["num_replicas"] = args.replicas
    key = load_api_key(args.api_key_file)
    init_args = (placement.device, args.precision, args.ingress, args.models_per_replica,
                 None if key is None else ApiKey.of(key),
                 # autoscaling counts the requests that Serve's HTTP server hands over
                 None if args.autoscale else args.haproxy_folder, args.route_prefix)
    deployment = HuggyPolicyDeployment.options(**options)
    # Serve's Python API gives every deploy a new random version, which restarts the replicas;
    # a version of what the replicas are built from lets a redeploy that changes only the
    # user_config reconfigure them in place (as `serve deploy` of a config file does).
    deployment = ray_internals.deployment_with_version(
        deployment, deployment_version(init_args, options["ray_actor_options"]))
    return deployment.bind(*init_args)


def deployment_version(init_args: tuple, ray_actor_options: dict[str, Any]) -> str:
    """A hash of what a replica is built from: the code of the serving package (every module in it),
    its constructor arguments and its actor options. The same for a redeploy that changes only the
    `user_config`.

    Args:
        init_args: the deployment's constructor arguments (an API key counts by its digest).
        ray_actor_options: its actor options.

    Returns:
        24 hex digits.
    """
    digest = hashlib.blake2b(digest_size=12)
    for module in sorted(SERVING_PACKAGE.glob("*.py")):
        digest.update(module.name.encode())
        digest.update(module.read_bytes())
    shown = [arg.digest.hex() if isinstance(arg, ApiKey) else arg for arg in init_args]
    digest.update(repr((shown, sorted(ray_actor_options.items()))).encode())
    return digest.hexdigest()


def app(args: dict[str, Any]) -> Application:
    """App builder for `serve run deploy.serving.app:app policy=... accelerator=...` and config files
    (whose `args` are the fields of `AppArgs`).

    Args:
        args: `AppArgs`' fields.

    Returns:
        The bound Serve application.

    Raises:
        ValueError: bad arguments (in words).
        RuntimeError: the replicas cannot start, or Ray is not initialized.
    """
    return build_app(app_args(**args))
