"""Promotion by `huggy watch` into a running `huggy serve` on 127.0.0.1 (the session's Ray cluster):
`PUT /v1/policies` behind the API key, applied by the change desk and its loop as `huggy serve`'s
own process runs them (`deploy.serving.server.start_change_desk`, `apply_changes`); a
checkpoint proven better takes a canary share of the sticky split, then all of it; `huggy watch
--rollback` returns to the policy served before. Checked by what the endpoint answers."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests

from deploy.evaluation import statistics as stats
from deploy.serving.server import (
    DEFAULT_INGRESS,
    apply_changes,
    deploy,
    start_change_desk,
    start_serve,
    stop_serve,
)
from deploy.serving.settings import AppArgs
from deploy.watch.decisions import Decision
from deploy.watch.promotion import Promoter
from deploy.watch.store import WatchStore
from huggy_agent import HuggyAgent
from huggy_agent.cli import main
from huggy_agent.numerics import FP32_ACTION_ATOL as TOL
from huggy_agent_client.http_api import Split
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "watch"))
from generate import write_checkpoint

pytestmark = pytest.mark.ray

KEY = "watch-promotion-key"
OBS = np.linspace(-1.0, 1.0, 59, dtype=np.float32)  # one Huggy observation


@dataclass(frozen=True)
class Server:
    url: str
    baseline: str
    """The id of the policy served at the start."""
    baseline_file: Path
    checkpoint: Path
    """The watch's copy of the better checkpoint."""


@pytest.fixture(scope="module")
def server(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A `huggy serve` of one policy behind an API key, with its change desk and the loop that
    applies changes (in a thread here, as in `huggy serve`'s own process)."""
    folder = tmp_path_factory.mktemp("promotion")
    baseline = write_checkpoint(folder / "served", 100_000, 0.3)
    checkpoint = write_checkpoint(folder / "watch" / "checkpoints", 200_000, 0.0)
    key_file = folder / "api-key"
    key_file.write_text(KEY + "\n")
    port = free_port()
    args = AppArgs(policies=[str(baseline)], accelerator="cpu", num_cpus=0.25,
                   ingress=DEFAULT_INGRESS, api_key_file=str(key_file))
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    stop = threading.Event()
    try:
        deploy(args, timeout_s=180)
        applier = threading.Thread(target=apply_changes, args=(
            start_change_desk(), args, args.policy_set(), 180, stop))
        applier.start()
        url = f"http://127.0.0.1:{port}"
        models = requests.get(f"{url}/v1/models", timeout=30,
                              headers={"Authorization": f"Bearer {KEY}"}).json()
        try:
            yield Server(url, models["default"], baseline, checkpoint)
        finally:
            stop.set()
            applier.join()
    finally:
        stop_serve(port)


def served(server: Server) -> dict:
    return requests.get(f"{server.url}/v1/models", timeout=30,
                        headers={"Authorization": f"Bearer {KEY}"}).json()


def act(server: Server, session: str | None = None) -> dict:
    body: dict = {"obs": OBS.tolist()} | ({"session": session} if session else {})
    reply = requests.post(f"{server.url}/v1/act", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_a_change_needs_the_key_and_a_well_formed_body(server: Server) -> None:
    change = {"policies": [{"id": server.baseline}]}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = requests.put(f"{server.url}/v1/policies", json=change, headers=headers,
                               timeout=30)
        assert refused.status_code == 401
    bad = requests.put(f"{server.url}/v1/policies", json={"policies": [{"id": "x", "path": "rel"}]},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert bad.status_code == 422
    assert "policies[0].path must be an absolute path" in bad.json()["message"]
    unknown = requests.put(f"{server.url}/v1/policies", json={"policies": [{"id": "nope"}]},
                           headers={"Authorization": f"Bearer {KEY}"}, timeout=180)
    assert unknown.status_code == 422 and "give its 'path'" in unknown.json()["message"]
    assert served(server)["default"] == server.baseline


def test_a_better_checkpoint_takes_a_canary_share_then_all_and_rolls_back(
        server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = WatchStore(tmp_path / "watch.db")
    record = store.add_policy("run@200000", "f" * 16, "checkpoint", "results/run/x.onnx",
                              "2026-01-01T00:00:00.000+00:00", path=str(server.checkpoint),
                              run="run", step=200_000)
    evidence = Decision(1, "run@200000", "f" * 16, "better", 8, 144,
                        stats.Estimate(1.0, 0.9, 1.1), "iqm", "run@200000", server.baseline,
                        stats.Estimate(0.3, 0.1, 0.5), 1, 3, 0.001)
    now = [0.0]
    promoter = Promoter(server.url, KEY, store, canary_share=0.25, canary_s=30.0,
                        clock=lambda: now[0])
    promoter.promote(record, evidence)
    canary = served(server)
    assert sorted(model["id"] for model in canary["models"]) == sorted(
        [server.baseline, "run@200000"])
    assert canary["default"] == server.baseline
    assert canary["split"] == {server.baseline: 0.75, "run@200000": 0.25}
    expected = Split.parse(f"{server.baseline}=0.75,run@200000=0.25")
    sessions = [f"user-{i}" for i in range(40)]
    assert [act(server, key)["policy"] for key in sessions] == [
        expected.assign(key) for key in sessions]
    assert not promoter.done()
    promoter.tick()  # not due yet: nothing changes
    assert served(server)["split"] == canary["split"]
    now[0] = 30.0
    promoter.tick()
    assert promoter.done()
    after = served(server)
    assert after["default"] == "run@200000" and after["split"] is None
    answer = act(server, "user-0")
    assert answer["policy"] == "run@200000"
    np.testing.assert_allclose(
        np.asarray(answer["actions"], np.float32),
        HuggyAgent(server.checkpoint, device="cpu").compute_action(OBS), rtol=0, atol=TOL)
    promoter.close()
    store.close()
    # `huggy watch --rollback`: back to the policy served before the promotion
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    assert main(["watch", "--serve", server.url, "--api-key-file", str(key_file),
                 "--db", str(tmp_path / "watch.db"), "--rollback"]) == 0
    back = served(server)
    assert [model["id"] for model in back["models"]] == [server.baseline]
    assert act(server, "user-0")["policy"] == server.baseline
    kinds = [(p["kind"], p["label"], p["previous"])
             for p in WatchStore(tmp_path / "watch.db").promotions()]
    assert kinds == [("canary", "run@200000", server.baseline),
                     ("served", "run@200000", server.baseline),
                     ("rollback", server.baseline, "run@200000")]
    # nothing left to roll back
    assert main(["watch", "--serve", server.url, "--api-key-file", str(key_file),
                 "--db", str(tmp_path / "watch.db"), "--rollback"]) == 2
    assert "logs no promotion into a server to roll back since the last rollback" in \
        capsys.readouterr().err
