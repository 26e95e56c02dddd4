"""Access control and the OpenAPI document, against live apps on one Serve instance of the
session cluster (HAProxy ingress): the bundled Huggy policy without and with an API key, a
discrete multi-branch policy with action masks (two inputs) and a recurrent one, both with the key.

The key is required on every route but /v1/healthz, by HTTP and by `RemoteAgent`, and never shows
up in a log. Schemathesis, with every check, must find nothing wrong in what each server publishes
about itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from deploy.serving.app import build_app
from deploy.serving.routes import ApiKey
from deploy.serving.server import DEFAULT_INGRESS, deploy, start_serve, stop_serve
from deploy.serving.settings import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from huggy_agent_client.remote import RemoteAgent, RemoteRequestError
from tests.support.fixtures import mlagents_fixtures_dir
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

KEY = "fuzz-key-0123456789"
EXAMPLES = 40


@pytest.fixture(scope="module")
def fuzzed(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, str]]:
    """App name -> base URL, all behind one Serve instance; "key_file": the key's file."""
    key_file = tmp_path_factory.mktemp("fuzz") / "api-key"
    key_file.write_text(KEY + "\n")
    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    base = f"http://127.0.0.1:{port}"
    common = {"accelerator": "cpu", "num_cpus": 0.25, "ingress": DEFAULT_INGRESS}
    apps = {"huggy_open": {}, "huggy": {"api_key_file": str(key_file)},
            "target": {"policy": str(mlagents_fixtures_dir() / "discrete_multibranch"),
                       "api_key_file": str(key_file)},
            "recurrent": {"policy": str(mlagents_fixtures_dir() / "lstm"),
                          "api_key_file": str(key_file)}}  # every app at the default limits
    try:
        for name, args in apps.items():
            deploy(AppArgs(**common, **args), name=name, route_prefix=f"/{name}", timeout_s=180)
        yield {**{name: f"{base}/{name}" for name in apps}, "key_file": str(key_file)}
    finally:
        stop_serve(port)


def schemathesis(url: str, key: str | None) -> subprocess.CompletedProcess:
    """`st run` of the server's own document: every check, a bounded number of examples, and
    deterministic generation (the same requests every run)."""
    st = str(Path(sys.executable).with_name("st"))
    config = Path(__file__).with_name("schemathesis.toml")
    command = [st, "--config-file", str(config), "run", f"{url}/v1/openapi.json", "--url", url,
               "--checks", "all", "--max-examples", str(EXAMPLES), "--generation-deterministic",
               "--no-color", "--request-timeout", "60"]
    if key:
        command += ["--header", f"Authorization: Bearer {key}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize(("app", "key"), [("huggy_open", None), ("huggy", KEY), ("target", KEY),
                                          ("recurrent", KEY)])
def test_schemathesis_finds_nothing(fuzzed: dict[str, str], app: str, key: str | None) -> None:
    result = schemathesis(fuzzed[app], key)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "No issues found" in output, output[-6000:]
    tested = re.search(r"Tested: (\d+)", output)
    generated = re.search(r"(\d+) generated", output)
    # act, the policy's own act route, models, healthz and info (schemathesis leaves out the
    # document's own route)
    assert tested and int(tested.group(1)) == 5, output[-3000:]
    assert generated and int(generated.group(1)) >= 5 * EXAMPLES, output[-3000:]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


UNAUTHORIZED = "this server requires its API key as 'Authorization: Bearer <key>', received "


def test_the_key_opens_every_route_but_healthz(fuzzed: dict[str, str]) -> None:
    url = fuzzed["huggy"]
    obs = np.random.default_rng(5).standard_normal((2, 59)).astype(np.float32)
    act = {"obs": obs.tolist()}
    with requests.Session() as session:
        for headers, problem in (({}, "no Authorization header"),
                                 (bearer("not-the-key"), "a wrong API key"),
                                 ({"Authorization": KEY}, f"an Authorization header of scheme "
                                                          f"{KEY[:20]!r}")):
            for method, path in (("POST", "/v1/act"), ("GET", "/v1/info"),
                                 ("GET", "/v1/openapi.json"), ("GET", "/v1/nowhere"),
                                 ("GET", "/v1/act")):
                answer = session.request(method, url + path, json=act, headers=headers,
                                         timeout=60)
                assert answer.status_code == 401, (method, path, answer.text)
                assert answer.headers["WWW-Authenticate"] == 'Bearer realm="huggy"'
                assert answer.json() == {"error": "unauthorized",
                                         "message": UNAUTHORIZED + problem}
        health = session.get(f"{url}/v1/healthz", timeout=60)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        good = session.post(f"{url}/v1/act", json=act, headers=bearer(KEY), timeout=60)
        assert good.status_code == 200
        np.testing.assert_allclose(np.asarray(good.json()["actions"], dtype=np.float32),
                                   HuggyAgent(device="cpu").compute_action(obs), rtol=0,
                                   atol=FP32_ACTION_ATOL)
        wrong_method = session.get(f"{url}/v1/act", headers=bearer(KEY), timeout=60)
        assert (wrong_method.status_code, wrong_method.headers["Allow"]) == (405, "POST")
        document = session.get(f"{url}/v1/openapi.json", headers=bearer(KEY), timeout=60).json()
        assert document["security"] == [{"bearer": []}]
        assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        # the app without a key answers everyone, and says so in its document
        open_url = fuzzed["huggy_open"]
        assert session.post(f"{open_url}/v1/act", json=act, timeout=60).status_code == 200
        assert "security" not in session.get(f"{open_url}/v1/openapi.json", timeout=60).json()


def test_remote_agent_sends_the_key(fuzzed: dict[str, str], monkeypatch) -> None:
    url = fuzzed["recurrent"]
    local = HuggyAgent.from_checkpoint(mlagents_fixtures_dir() / "lstm", device="cpu")
    obs = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float32)
    monkeypatch.delenv("HUGGY_API_KEY", raising=False)
    with pytest.raises(RemoteRequestError, match="401 unauthorized.*no Authorization header"):
        RemoteAgent(url)
    with pytest.raises(RemoteRequestError, match="401 unauthorized.*a wrong API key"):
        RemoteAgent(url, api_key="not-the-key")
    with RemoteAgent(url, api_key=KEY) as remote:
        actions, memory = remote.compute_action(obs)
    expected, expected_memory = local.compute_action(obs)
    np.testing.assert_allclose(actions, expected, rtol=0, atol=FP32_ACTION_ATOL)
    np.testing.assert_allclose(memory, expected_memory, rtol=0, atol=FP32_ACTION_ATOL)
    monkeypatch.setenv("HUGGY_API_KEY", KEY)
    with RemoteAgent(url) as remote:
        assert remote.fingerprint == local.fingerprint


def test_the_key_is_in_no_log_and_no_deployment_argument(fuzzed: dict[str, str],
                                                         ray_cluster: RayCluster) -> None:
    """After every request above (and a wrong key sent once more), no file that Ray or Serve
    wrote holds the key, and the deployment was bound with its digest only."""
    requests.get(f"{fuzzed['target']}/v1/info", headers=bearer(KEY + "-wrong"), timeout=60)
    requests.get(f"{fuzzed['target']}/v1/info", headers=bearer(KEY), timeout=60)
    needles = (KEY.encode(), (KEY + "-wrong").encode())
    logs = [path for path in ray_cluster.temp_dir.rglob("*") if path.is_file()
            and "logs" in path.parts]
    assert logs
    for path in logs:
        data = path.read_bytes()
        assert not any(needle in data for needle in needles), path
    built = build_app(AppArgs(accelerator="cpu", api_key_file=fuzzed["key_file"]),
                      nodes=[{"CPU": 2.0}])
    args = built._bound_deployment.init_args
    assert [arg for arg in args if isinstance(arg, ApiKey)] == [ApiKey.of(KEY)]
    assert KEY not in repr(args) and all(KEY not in str(arg) for arg in args)


def huggy_command(*args: str) -> subprocess.CompletedProcess:
    """`huggy ARGS` as a user runs it, without $HUGGY_API_KEY."""
    env = {name: value for name, value in os.environ.items() if name != "HUGGY_API_KEY"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return subprocess.run([sys.executable, "-m", "huggy_agent.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_rollout_and_evaluate_send_the_key_from_a_file(fuzzed: dict[str, str],
                                                       tmp_path: Path) -> None:
    url, key_file = fuzzed["huggy"], fuzzed["key_file"]
    refused = huggy_command("rollout", "--policy-url", url, "--episodes", "2")
    assert refused.returncode != 0
    assert "401 unauthorized" in refused.stdout + refused.stderr
    rollout = huggy_command("rollout", "--policy-url", url, "--api-key-file", key_file,
                            "--episodes", "2", "--base-port", str(free_port()), "--no-progress")
    assert rollout.returncode == 0, rollout.stdout + rollout.stderr
    evaluate = huggy_command("evaluate", "--policy-url", url, "--api-key-file", key_file,
                             "--no-ray", "--episodes", "2", "--episodes-per-item", "2",
                             "--num-agents", "2", "--no-progress", "--out", str(tmp_path))
    assert evaluate.returncode == 0, evaluate.stdout + evaluate.stderr
    assert url in evaluate.stdout
    assert KEY not in rollout.stdout + rollout.stderr + evaluate.stdout + evaluate.stderr


def test_evaluate_hands_the_key_to_runners_on_a_joined_cluster(fuzzed: dict[str, str],
                                                               ray_cluster: RayCluster,
                                                               tmp_path: Path) -> None:
    """The session cluster's nodes were started without $HUGGY_API_KEY: its runners can only
    query the server with the key that `huggy evaluate` hands them, and it stays out of the
    report."""
    url, key_file = fuzzed["huggy"], fuzzed["key_file"]
    evaluate = huggy_command("evaluate", "--policy-url", url, "--api-key-file", key_file,
                             "--address", ray_cluster.address, "--runners", "1",
                             "--episodes", "2", "--episodes-per-item", "2", "--num-agents", "2",
                             "--no-progress", "--out", str(tmp_path))
    assert evaluate.returncode == 0, evaluate.stdout + evaluate.stderr
    report = (tmp_path / "evaluation.json").read_text()
    assert '"episodes": 2' in report
    assert KEY not in report + evaluate.stdout + evaluate.stderr
