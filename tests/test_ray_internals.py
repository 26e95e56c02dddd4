"""The private Ray names huggy-agent relies on, all in `deploy.ray_internals`: each works on the
installed Ray, and on a Ray release without it fails with a message that names the Ray version
and the missing piece (simulated here by taking each piece away). No cluster is started."""

from __future__ import annotations

import os
import re

import pytest
import ray
from ray import serve

from deploy import ray_internals
from deploy.ray_internals import RayInternalsError


def _refusal(name: str) -> str:
    return (rf"^Ray {re.escape(ray.__version__)} has no {re.escape(name)}, which huggy-agent "
            rf"uses to .*; huggy-agent supports Ray {re.escape(ray_internals.SUPPORTED_RAY)}\.x")


def test_the_installed_ray_is_the_supported_one_and_has_every_piece() -> None:
    assert ray.__version__.startswith(ray_internals.SUPPORTED_RAY + ".")
    ray_internals.check(serve=True)


def test_deployment_version_is_set_and_refused_clearly_without_it() -> None:
    @serve.deployment
    class Echo:
        def __call__(self) -> str:
            return "echo"

    assert ray_internals.deployment_with_version(Echo, "v-123").version == "v-123"

    class WithoutInternal:
        def options(self, *, version: str) -> None:  # a release that dropped `_internal`
            raise AssertionError("not reached")

    with pytest.raises(RayInternalsError, match=_refusal("Deployment.options(version=..., "
                                                         "_internal=True)")):
        ray_internals.deployment_with_version(WithoutInternal(), "v-123")


def test_serve_check_refuses_a_deployment_options_without_internal(monkeypatch) -> None:
    from ray.serve.deployment import Deployment

    def options(self: object, version: str = "") -> None:
        raise AssertionError("not reached")

    monkeypatch.setattr(Deployment, "options", options)
    ray_internals.check()  # the core pieces are still there
    with pytest.raises(RayInternalsError, match=_refusal("Deployment.options(version=..., "
                                                         "_internal=True)")):
        ray_internals.check(serve=True)


def test_task_attempt_number_is_refused_clearly_without_it(monkeypatch) -> None:
    class CoreWorker:  # a release whose core worker has no attempt number
        pass

    monkeypatch.setattr(ray._raylet, "CoreWorker", CoreWorker)
    with pytest.raises(RayInternalsError, match=_refusal(
            "ray._raylet.CoreWorker.get_current_task_attempt_number")):
        ray_internals.task_attempt_number()
    with pytest.raises(RayInternalsError, match="get_current_task_attempt_number"):
        ray_internals.check()


def test_reload_config_is_refused_clearly_without_it(monkeypatch) -> None:
    monkeypatch.delattr(ray._raylet, "Config")
    with pytest.raises(RayInternalsError, match=_refusal("ray._raylet.Config")):
        ray_internals.reload_config()


def test_single_machine_cluster_sets_and_restores_the_flag(monkeypatch) -> None:
    constants = ray._private.ray_constants
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    with ray_internals.single_machine_cluster():
        assert constants.ENABLE_RAY_CLUSTER is False
        assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert constants.ENABLE_RAY_CLUSTER is True
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    monkeypatch.delattr(constants, "ENABLE_RAY_CLUSTER")
    with pytest.raises(RayInternalsError, match=_refusal(
            "ray._private.ray_constants.ENABLE_RAY_CLUSTER")), \
            ray_internals.single_machine_cluster():
        pass
