"""Accelerator pinning: which Ray resources a replica asks for, and which torch device it uses.

Pure functions over resource dictionaries (no Ray import), so the rules are checked before
anything is deployed: a replica that no node can hold, or more fixed replicas than the cluster has
accelerators for, is reported at once with the numbers, instead of waiting forever to be scheduled.

    accelerator   Ray asks for                 the replica runs on
    npu           resources={"NPU": 1}         npu:0 of ASCEND_RT_VISIBLE_DEVICES (set by Ray)
    gpu           num_gpus=1                   cuda:0 of CUDA_VISIBLE_DEVICES (set by Ray)
    cpu           num_cpus only                cpu
    auto          the first of npu, gpu, cpu that the cluster has
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ACCELERATORS = ("auto", "cpu", "gpu", "npu")
_RAY_RESOURCE = {"npu": "NPU", "gpu": "GPU"}
_TORCH_DEVICE = {"npu": "npu:0", "gpu": "cuda:0", "cpu": "cpu"}


@dataclass(frozen=True)
class ReplicaPlacement:
    """What each replica holds (`ray_actor_options`) and the torch device it loads the policy on."""

    accelerator: str
    device: str
    num_cpus: float

    @property
    def resources(self) -> dict[str, float]:
        """The Ray resources one replica holds, in Ray's resource names."""
        needed = {"CPU": self.num_cpus}
        if self.accelerator in _RAY_RESOURCE:
            needed[_RAY_RESOURCE[self.accelerator]] = 1.0
        return {name: amount for name, amount in needed.items() if amount > 0}

    def ray_actor_options(self) -> dict:
        """The Ray options of one replica.

        Returns:
            Options for `serve.deployment(ray_actor_options=...)` or `ray.remote(**...)`: `num_cpus`,
                and `num_gpus` or `resources={"NPU": 1}` for an accelerator.
        """
        options: dict = {"num_cpus": self.num_cpus}
        if self.accelerator == "gpu":
            options["num_gpus"] = 1
        elif self.accelerator == "npu":
            options["resources"] = {"NPU": 1}
        return options


def resolve_accelerator(accelerator: str, cluster_resources: Mapping[str, float]) -> str:
    """The accelerator a name stands for on a cluster.

    Args:
        accelerator: one of `ACCELERATORS`.
        cluster_resources: the cluster's total resources, in Ray's names.

    Returns:
        For `auto`, the first of `npu`, `gpu` and `cpu` that the cluster has; any other name as it
            is.

    Raises:
        ValueError: an unknown name.
    """
    if accelerator not in ACCELERATORS:
        raise ValueError(f"unknown accelerator {accelerator!r}; expected one of "
                         f"{', '.join(ACCELERATORS)}")
    if accelerator != "auto":
        return accelerator
    for kind in ("npu", "gpu"):
        if cluster_resources.get(_RAY_RESOURCE[kind], 0) >= 1:
            return kind
    return "cpu"


def plan_placement(accelerator: str, num_cpus: float, replicas: int,
                   nodes: Sequence[Mapping[str, float]]) -> ReplicaPlacement:
    """The placement of replicas on a cluster, checked before anything is deployed.

    Args:
        accelerator: one of `ACCELERATORS`.
        num_cpus: CPUs each replica holds, >= 0.
        replicas: how many, >= 1.
        nodes: the resources of each alive node, in Ray's names.

    Returns:
        What each replica holds and the torch device it loads the policy on.

    Raises:
        ValueError: an unknown accelerator, negative CPUs or no replica.
        RuntimeError: the replicas cannot all start: no node can hold one replica, or the cluster
            lacks the total for all of them (with the numbers).
    """
    if num_cpus < 0:
        raise ValueError(f"num_cpus must be >= 0, received {num_cpus}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, received {replicas}")
    totals: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            totals[name] = totals.get(name, 0.0) + amount
    kind = resolve_accelerator(accelerator, totals)
    placement = ReplicaPlacement(kind, _TORCH_DEVICE[kind], num_cpus)
    needed = placement.resources
    described = _describe(needed)
    if not any(all(node.get(name, 0) >= amount for name, amount in needed.items())
               for node in nodes):
        seen = "; ".join(_describe(_relevant(node, needed)) for node in nodes) or "none"
        raise RuntimeError(f"cannot start a replica on accelerator {kind!r}: each replica needs "
                           f"{described}, and no node has that (nodes: {seen})")
    for name, amount in needed.items():
        if totals.get(name, 0) < amount * replicas:
            raise RuntimeError(
                f"cannot start {replicas} replicas on accelerator {kind!r}: each needs "
                f"{described}, so {replicas} need {name}: {amount * replicas:g}, and the "
                f"cluster has {name}: {totals.get(name, 0):g} in total; use fewer replicas")
    return placement


def _relevant(node: Mapping[str, float], needed: Mapping[str, float]) -> dict[str, float]:
    return {name: node.get(name, 0) for name in needed}


def _describe(resources: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in resources.items()) + "}"
