"""The deployment files the docs describe: the KubeRay RayService manifest and the Serve config
file run the same Serve application, and the manifest has what the Deployment page says it has
(CPU, GPU and NPU worker groups, probes on every pod, blue/green upgrades, token auth)."""

from __future__ import annotations

import yaml

from deploy.ray_internals import is_supported
from deploy.serving.settings import AppArgs
from tests.support.fixtures import REPO_ROOT

MANIFEST = REPO_ROOT / "deploy" / "kubernetes" / "rayservice.yaml"
SERVE_CONFIG = REPO_ROOT / "deploy" / "serve_config.yaml"


def load_manifest() -> tuple[dict, dict]:
    """The RayService and the Serve config inside it (`serveConfigV2`, a YAML string)."""
    service = yaml.safe_load(MANIFEST.read_text())
    return service, yaml.safe_load(service["spec"]["serveConfigV2"])


def test_the_rayservice_and_the_serve_config_run_the_same_application() -> None:
    service, inside = load_manifest()
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    assert [(app["name"], app["import_path"]) for app in inside["applications"]] == [
        (app["name"], app["import_path"]) for app in config["applications"]] == [
        ("huggy", "deploy.serving.app:app")]
    known = set(AppArgs.model_fields)
    for app in (*inside["applications"], *config["applications"]):
        assert set(app["args"]) <= known, sorted(set(app["args"]) - known)


def test_the_rayservice_has_cpu_gpu_and_npu_nodes_probes_and_blue_green_upgrades() -> None:
    service, inside = load_manifest()
    spec = service["spec"]
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}
    cluster = spec["rayClusterConfig"]
    assert is_supported(cluster["rayVersion"])
    groups = {group["groupName"]: group for group in cluster["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu", "npu"}

    def container(template: dict) -> dict:
        (only,) = template["spec"]["containers"]
        return only

    limits = {name: container(group["template"])["resources"]["limits"]
              for name, group in groups.items()}
    assert limits["gpu"]["nvidia.com/gpu"] == 1
    assert limits["npu"]["huawei.com/Ascend910"] == 1
    assert yaml.safe_load(yaml.safe_load(groups["npu"]["rayStartParams"]["resources"])) == {"NPU": 1}
    assert groups["gpu"]["rayStartParams"]["num-gpus"] == "1"
    head = container(cluster["headGroupSpec"]["template"])
    for pod in (head, *(container(group["template"]) for group in groups.values())):
        assert {"readinessProbe", "livenessProbe"} <= set(pod)
        env = {variable["name"]: variable for variable in pod["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "huggy-ray-token"
    for group in groups.values():
        probe = " ".join(container(group["template"])["readinessProbe"]["exec"]["command"])
        assert "localhost:8000/-/healthz" in probe and "local_raylet_healthz" in probe
    (app,) = inside["applications"]
    assert app["args"]["api_key_file"] == "/etc/huggy/api-key"
    assert AppArgs.model_fields["accelerator"].annotation.__args__ == ("auto", "cpu", "gpu", "npu")
    assert app["args"]["accelerator"] in ("cpu", "gpu", "npu")
