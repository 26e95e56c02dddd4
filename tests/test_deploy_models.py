"""Many policies behind one endpoint: the catalogue, A/B splits and their assignment (pure parts).

The policies are copies of a fixture checkpoint whose `mu` bias is shifted by a different amount
in each copy, so every id has its own weights and its own actions.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import numpy as np
import orjson
import pytest
import requests
import torch

from deploy.evaluation.sources import served_policy_specs
from deploy.serving.catalogue import PolicyEntry, PolicySet, catalogue
from deploy.serving.server import DEFAULT_INGRESS, deploy, start_serve, stop_serve
from deploy.serving.settings import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL as TOL
from huggy_agent_client.http_api import (
    POLICY_ID_HEADER,
    SESSION_KEY_LIMIT,
    Split,
    check_session_key,
    session_point,
    unknown_policy_message,
)
from huggy_agent_client.remote import RemoteAgent
from tests.support.fixtures import REPO_ROOT, fixtures_dir, mlagents_fixtures_dir
from tests.support.processes import free_port
from tests.support.ray_cluster import RayCluster

BASE_PT = ("ppo_baseline", "Huggy", "Huggy-2000343.pt")
MU_BIAS = "action_model._continuous_distribution.mu.bias"


def checkpoint_run(folder: Path, steps: list[int], base: tuple[str, ...] = BASE_PT) -> Path:
    """A results folder `folder` with `Huggy/Huggy-<step>.pt` for each step: the base checkpoint
    with its mu bias shifted by 0.05 * (index + 1), so each checkpoint acts differently."""
    checkpoint = torch.load(fixtures_dir().joinpath(*base), weights_only=True)
    (folder / "Huggy").mkdir(parents=True)
    bias = checkpoint["Policy"][MU_BIAS].clone()
    for index, step in enumerate(steps):
        checkpoint["Policy"][MU_BIAS] = bias + 0.05 * (index + 1)
        torch.save(checkpoint, folder / "Huggy" / f"Huggy-{step}.pt")
    return folder


# -- the catalogue ---------------------------------------------------------------------------------

def test_catalogue_labels_checkpoints_and_files_as_evaluate_does(tmp_path: Path) -> None:
    run = checkpoint_run(tmp_path / "my_run", [3000, 1000, 2000])
    onnx = fixtures_dir() / "ppo_num_layers_2" / "Huggy.onnx"
    entries = catalogue([str(run), str(onnx)])
    assert [e.id for e in entries] == ["my_run@1000", "my_run@2000", "my_run@3000",
                                      "ppo_num_layers_2/Huggy.onnx"]
    assert [e.step for e in entries[:3]] == [1000, 2000, 3000]
    assert [e.source for e in entries] == [str(run)] * 3 + [str(onnx)]
    assert entries[0].path == str((run / "Huggy" / "Huggy-1000.pt").resolve())
    for entry in entries:
        agent = HuggyAgent(entry.path, device="cpu")
        assert entry.fingerprint == agent.fingerprint
        assert entry.spec == agent.spec.as_dict()
        assert entry.interface == agent.spec.describe()
    assert len({e.fingerprint for e in entries}) == 4  # the shifted copies differ
    assert entries[0].spec["continuous_size"] == 21
    assert PolicyEntry.from_dict(entries[1].as_dict()) == entries[1]


def test_catalogue_repeated_ids_get_suffixes_and_bad_sources_say_why(tmp_path: Path) -> None:
    onnx = fixtures_dir() / "ppo_baseline" / "Huggy.onnx"
    copy = tmp_path / "ppo_baseline" / "Huggy.onnx"
    copy.parent.mkdir()
    shutil.copy(onnx, copy)
    assert [e.id for e in catalogue([str(onnx), str(copy)])] == [
        "ppo_baseline/Huggy.onnx", "ppo_baseline/Huggy.onnx#2"]
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        catalogue([str(tmp_path / "nothing.pt")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no checkpoint or export files"):
        catalogue([str(tmp_path / "empty")])
    with pytest.raises(ValueError, match="at least one policy"):
        catalogue([])
    with pytest.raises(ValueError, match=r"missing field\(s\) \['fingerprint'"):
        PolicyEntry.from_dict({"id": "a", "path": "p", "source": "s", "interface": "i",
                               "spec": {}})


def test_unknown_policy_message_lists_every_known_id() -> None:
    message = unknown_policy_message("run@9", ["run@1", "run@2", "b/Huggy.onnx"])
    assert message == ("no policy 'run@9' is served here; known policies: run@1, run@2, "
                       "b/Huggy.onnx")


# -- splits ----------------------------------------------------------------------------------------

KNOWN = ["run@1", "run@2", "run@3", "b/Huggy.onnx"]


def test_split_parses_ids_with_at_slash_and_equals_signs() -> None:
    split = Split.parse("run@1=0.7, b/Huggy.onnx=0.2,run@3=0.1", KNOWN)
    assert split.ids == ("run@1", "b/Huggy.onnx", "run@3")
    assert split.weights == (0.7, 0.2, 0.1)
    assert Split.parse("x=y=3,z=1").as_dict() == {"x=y": 3.0, "z": 1.0}
    assert Split.parse("a=90,b=10").shares() == {"a": 0.9, "b": 0.1}
    assert Split.from_weights({"run@1": 1, "run@2": 3}, KNOWN).shares() == {"run@1": 0.25,
                                                                          "run@2": 0.75}


@pytest.mark.parametrize(("text", "message"), [
    ("", r"expects ID=WEIGHT,ID=WEIGHT,\.\.\., received ''"),
    ("run@1", r"received 'run@1' in 'run@1'"),
    ("run@1=0.5,", r"received '' in 'run@1=0.5,'"),
    ("=0.5", r"received '=0.5'"),
    ("run@1=half", r"the weight of 'run@1' must be a number, received 'half'"),
    ("run@1=-1,run@2=2", r"weight of 'run@1' must be a finite number >= 0, received -1.0"),
    ("run@1=inf", r"must be a finite number >= 0, received inf"),
    ("run@1=0,run@2=0", r"must not all be zero"),
    ("run@1=1,run@1=2", r"each policy may appear once in a split, received \['run@1'\]"),
    ("run@1=1,run@7=1", r"not served: \['run@7'\]; known policies: run@1, run@2, run@3, "
                        r"b/Huggy.onnx"),
])
def test_split_errors_name_what_was_expected_and_what_came(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Split.parse(text, KNOWN)


def test_session_point_is_blake2b_of_the_utf8_key() -> None:
    """Pinned values: the same on every machine, process and Python version, so a session keeps
    its policy across replicas and restarts."""
    assert session_point("user-1") == 0.6502337683590543
    assert session_point("") == 0.310639420326747
    assert session_point("ünï") == 0.01293942541763443
    digest = hashlib.blake2b(b"user-1", digest_size=8, person=b"huggy-split").digest()
    assert session_point("user-1") == int.from_bytes(digest, "big") / 2**64


def test_sessions_split_within_two_points_of_the_weights_and_always_stick() -> None:
    split = Split.parse("run@1=0.7,run@2=0.2,run@3=0.1", KNOWN)
    keys = [f"user-{i}" for i in range(10_000)]
    first = [split.assign(key) for key in keys]
    again = [split.assign(key, random.Random(7)) for key in reversed(keys)][::-1]
    assert first == again  # 100% sticky, whatever the generator
    counts = {policy_id: first.count(policy_id) / len(keys) for policy_id in split.ids}
    for policy_id, share in split.shares().items():
        assert abs(counts[policy_id] - share) <= 0.02, (policy_id, counts)


def test_sessions_keep_their_policy_in_another_process() -> None:
    """Python's own `hash` of a str changes per process (PYTHONHASHSEED); the assignment must
    not: another process with another hash seed than this one assigns every key alike."""
    keys = [f"user-{i}" for i in range(200)]
    code = ("import sys; from huggy_agent_client.http_api import Split; s = Split.parse(sys.argv[1]); "
            f"print(','.join(s.assign(k) for k in {keys!r}))")
    split = "run@1=0.5,run@2=0.3,run@3=0.2"
    here = ",".join(Split.parse(split).assign(key) for key in keys)
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    other = subprocess.run([sys.executable, "-c", code, split], capture_output=True, text=True,
                           check=True, cwd=REPO_ROOT,
                           env={"PYTHONHASHSEED": hash_seed, "PATH": ""}).stdout.strip()
    assert other == here


def test_requests_without_a_session_split_at_random_by_weight() -> None:
    split = Split.parse("run@1=3,run@2=1,run@3=0", KNOWN)
    rng = random.Random(2026)
    draws = [split.assign(None, rng) for _ in range(10_000)]
    assert draws.count("run@3") == 0  # a zero weight gets nothing
    assert abs(draws.count("run@1") / 10_000 - 0.75) <= 0.02
    assert abs(draws.count("run@2") / 10_000 - 0.25) <= 0.02


def test_points_map_to_shares_in_order() -> None:
    split = Split.parse("a=1,b=0,c=3")
    assert [split.pick(p) for p in (0.0, 0.2499, 0.25, 0.9999999, np.nextafter(1.0, 0))] == [
        "a", "a", "c", "c", "c"]
    assert Split.parse("a=1,b=0").pick(np.nextafter(1.0, 0)) == "a"


def test_session_keys_are_short_strings() -> None:
    assert check_session_key("user-1") == "user-1"
    assert check_session_key(None) is None
    for bad, shown in ((17, "an integer"), ("", "a string of 0 characters"),
                       ("x" * (SESSION_KEY_LIMIT + 1), "a string of 257 characters")):
        with pytest.raises(ValueError, match=f"'session' must be a string of 1 to 256 "
                                             f"characters .* received {shown}"):
            check_session_key(bad)
    with pytest.raises(ValueError, match=re.escape(
            "'session' must be a string of Unicode characters, received a lone UTF-16 surrogate "
            "'\\udc00' at character 2")):
        check_session_key("ab\udc00")  # JSON can write it: "ab\\udc00"


def test_huggy_serve_and_rollout_refuse_bad_arguments_before_starting_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from huggy_agent.cli import main

    run = str(checkpoint_run(tmp_path / "r", [10, 20]))
    for args, message in [
        ([run, "--split", "r@10=1,r@30=1"], "split names policies that are not served: "
                                            "['r@30']; known policies: r@10, r@20"),
        ([run, "--default", "r@30"], "default policy 'r@30' is not served; known policies: "
                                     "r@10, r@20"),
        ([run, "--split", "r@10"], "--split expects ID=WEIGHT,ID=WEIGHT,..., received 'r@10'"),
        ([run, "--policy", run], "give either POLICY... or --policy, not both"),
        ([str(tmp_path / "none.pt")], "policy not found"),
        ([run, "--port", "28100", "--grpc-port", "28100"],
         "--grpc-port 28100 is --port: give gRPC a port of its own"),
    ]:
        assert main(["serve", *args]) == 2
        assert message in capsys.readouterr().err
    for args, message in [(["--port", "-1"], "argument --port: expected a port, 1 to 65535, "
                                             "got -1"),
                          (["--grpc-port", "65536"], "argument --grpc-port: expected a port, 1 "
                                                     "to 65535, got 65536"),
                          (["--batch-wait-ms", "-1"], "argument --batch-wait-ms: expected a "
                                                      "number >= 0 and <= 10000, got -1"),
                          (["--batch-wait-ms", "nan"], "argument --batch-wait-ms: expected a "
                                                       "number >= 0 and <= 10000, got nan"),
                          (["--start-timeout", "0"], "argument --start-timeout: expected a number "
                                                     "> 0, got 0"),
                          (["--start-timeout", "nan"], "argument --start-timeout: expected a "
                                                       "number > 0, got nan"),
                          (["--replicas", "0"], "argument --replicas: expected a whole "
                                                "number >= 1, got 0"),
                          (["--replicas", "-1"], "argument --replicas: expected a whole "
                                                 "number >= 1, got -1"),
                          (["--autoscale", "--max-replicas", "0"], "argument --max-replicas: "
                                                                   "expected a whole number >= 1, "
                                                                   "got 0"),
                          (["--num-cpus", "inf"], "argument --num-cpus: expected a number >= 0, "
                                                  "got inf"),
                          (["--num-cpus", "one"], "argument --num-cpus: expected a number >= 0, "
                                                  "got 'one'"),
                          (["--max-rows", "0"], "argument --max-rows: expected a whole number "
                                                ">= 1, got 0"),
                          (["--max-body-bytes", "1e6"], "argument --max-body-bytes: expected a "
                                                        "whole number >= 1, got '1e6'")]:
        with pytest.raises(SystemExit) as refused:
            main(["serve", run, *args])
        assert refused.value.code == 2 and message in capsys.readouterr().err
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for args, message in [
            (["rollout", "--base-port", "0"],
             "argument --base-port: expected a port, 1 to 65535, got 0"),
            (["rollout", "--worker-id", "-1"],
             "argument --worker-id: expected a whole number, 0 to 65535, got -1"),
            (["rollout", "--seed", str(2**24)],
             f"argument --seed: expected a whole number, 0 to 2**24 - 1, got {2**24}"),
            (["rollout", "--timeout-wait", "0"],
             "argument --timeout-wait: expected a whole number >= 1, got 0"),
            (["rollout", "--record", str(tmp_path / "none" / "x.jsonl")],
             f"argument --record: expected a file in an existing folder, got "
             f"'{tmp_path / 'none' / 'x.jsonl'}' (no folder '{tmp_path / 'none'}')"),
            (["rollout", "--demo", str(tmp_path)],
             f"argument --demo: expected a file to write, got the folder '{tmp_path}'"),
            (["evaluate", run, "--out", str(a_file)],
             f"argument --out: expected a folder to write into, got the file '{a_file}'"),
            (["tournament", "heuristic:chaser", "heuristic:idle", "--out", str(a_file)],
             f"argument --out: expected a folder to write into, got the file '{a_file}'")]:
        with pytest.raises(SystemExit) as refused:
            main(args)
        assert refused.value.code == 2 and message in capsys.readouterr().err
    assert main(["rollout", "--base-port", "65000", "--worker-id", "536"]) == 2
    assert ("--base-port 65000 + --worker-id 536 is beyond the last port, 65535"
            in capsys.readouterr().err)
    assert main(["evaluate", "--policy-id", "r@10", run]) == 2
    assert "names a policy served at --policy-url, which was not given" in (
        capsys.readouterr().err)


# -- the set a server serves -----------------------------------------------------------------------

def entries(*ids: str) -> list[PolicyEntry]:
    return [PolicyEntry(id=i, path=f"/p/{i}.pt", source="/p", interface="59 floats -> 21",
                        spec={}, fingerprint=f"{n:016x}") for n, i in enumerate(ids)]


def test_policy_set_chooses_named_then_split_then_default() -> None:
    served = PolicySet.build(entries("a@1", "a@2", "b/Huggy.onnx"))
    assert served.default == "a@1"  # the first
    assert served.choose(None) == "a@1"
    assert served.choose("b/Huggy.onnx") == "b/Huggy.onnx"
    with pytest.raises(KeyError, match="no policy 'a@3' is served here; known policies: a@1, "
                                       "a@2, b/Huggy.onnx"):
        served.choose("a@3")
    split = PolicySet.build(entries("a@1", "a@2", "b/Huggy.onnx"), default="a@2",
                            split="a@1=1,b/Huggy.onnx=1")
    assert split.choose("a@2", session="k") == "a@2"  # a named policy wins over the split
    assert split.choose(None, "user-1") == Split.parse("a@1=1,b/Huggy.onnx=1").assign("user-1")
    assert split.preferred() == ["a@2", "a@1", "b/Huggy.onnx"]


def test_policy_set_round_trips_through_a_serve_config_and_refuses_bad_ones() -> None:
    served = PolicySet.build(entries("a@1", "a@2"), split={"a@2": 3, "a@1": 1})
    again = PolicySet.from_config(served.as_config())
    assert again == served and again.split.shares() == {"a@2": 0.75, "a@1": 0.25}
    with pytest.raises(ValueError, match="default policy 'z' is not served; known policies: "
                                         "a@1, a@2"):
        PolicySet.build(entries("a@1", "a@2"), default="z")
    with pytest.raises(ValueError, match=r"not served: \['z'\]"):
        PolicySet.build(entries("a@1"), split="a@1=1,z=1")
    with pytest.raises(ValueError, match=r"unique, received \['a@1'\]"):
        PolicySet.build(entries("a@1", "a@1"))
    with pytest.raises(ValueError, match="needs 'policies', a non-empty list"):
        PolicySet.from_config({"policies": []})


# -- served by real Ray Serve over real HTTP (HAProxy ingress) ------------------------------------

STEPS = [100_000 * (i + 1) for i in range(15)]
RUN = "ckpt_run"
IDS = [f"{RUN}@{step}" for step in STEPS]
DISCRETE = "discrete_multibranch/Target.onnx"
BATCH_WAIT_S = 0.05
KEY = "models-key-0123456789"


def file_id(step: int) -> str:
    """The id of one checkpoint file named on its own: `<parent>/<file>`."""
    return f"Huggy/Huggy-{step}.pt"


@dataclass(frozen=True)
class Served:
    base: str
    run: Path
    discrete: Path
    port: int

    def url(self, app: str) -> str:
        return f"{self.base}/{app}"


def app_args(policies: list[str], **options: Any) -> AppArgs:
    return AppArgs(policies=policies, accelerator="cpu", num_cpus=0.25,
                   ingress=DEFAULT_INGRESS, **options)


@pytest.fixture(scope="module")
def served(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One Serve instance: `models` (the 15 checkpoints of a run and a discrete policy, all
    held, default the 4th, batches that wait 50 ms), `ab` (a 70/30 split of two checkpoints),
    `lru` (four checkpoints, two held per replica), `mixed` (two checkpoints split 50/50 and a
    discrete policy, behind an API key) and `live` (for adding and removing)."""
    folder = tmp_path_factory.mktemp("models")
    run = checkpoint_run(folder / RUN, STEPS)
    discrete = mlagents_fixtures_dir() / DISCRETE
    port = free_port()
    start_serve("127.0.0.1", port, DEFAULT_INGRESS)
    try:
        deploy(app_args([str(run), str(discrete)], default=IDS[3],
                        batch_wait_timeout_s=BATCH_WAIT_S), name="models",
               route_prefix="/models", timeout_s=300)
        deploy(app_args([str(run / "Huggy" / f"Huggy-{STEPS[0]}.pt"),
                         str(run / "Huggy" / f"Huggy-{STEPS[1]}.pt")],
                        split=f"{file_id(STEPS[0])}=0.7,{file_id(STEPS[1])}=0.3"),
               name="ab", route_prefix="/ab", timeout_s=180)
        deploy(app_args([str(run / "Huggy" / f"Huggy-{s}.pt") for s in STEPS[:4]],
                        models_per_replica=2), name="lru", route_prefix="/lru", timeout_s=180)
        key_file = folder / "api-key"
        key_file.write_text(KEY + "\n")
        deploy(app_args([str(run / "Huggy" / f"Huggy-{s}.pt") for s in STEPS[:2]]
                        + [str(discrete)], split=f"{file_id(STEPS[0])}=1,{file_id(STEPS[1])}=1",
                        api_key_file=str(key_file)),
               name="mixed", route_prefix="/mixed", timeout_s=180)
        yield Served(f"http://127.0.0.1:{port}", run, discrete, port)
    finally:
        stop_serve(port)


@pytest.fixture(scope="module")
def agents(served: Served) -> dict[str, HuggyAgent]:
    """The in-process reference of every policy of `models`, by id."""
    local = {f"{RUN}@{step}": HuggyAgent(served.run / "Huggy" / f"Huggy-{step}.pt", device="cpu")
             for step in STEPS}
    local[DISCRETE] = HuggyAgent(served.discrete, device="cpu")
    return local


def model_url(base: str, policy_id: str) -> str:
    return f"{base}/v1/models/{quote(policy_id, safe='@/')}/act"


def huggy_obs(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 59)).astype(np.float32)


def post(url: str, document: dict, headers: dict | None = None) -> requests.Response:
    return requests.post(url, data=orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY),
                         headers=headers, timeout=60)


def test_every_checkpoint_is_held_on_one_replica_and_answers_like_in_process(
        served: Served, agents: dict[str, HuggyAgent]) -> None:
    base = served.url("models")
    listing = requests.get(f"{base}/v1/models", timeout=10).json()
    assert [m["id"] for m in listing["models"]] == [*IDS, DISCRETE]
    assert listing["default"] == IDS[3] and listing["split"] is None
    for model in listing["models"]:
        agent = agents[model["id"]]
        assert (model["fingerprint"], model["spec"], model["interface"]) == (
            agent.fingerprint, agent.spec.as_dict(), agent.spec.describe())
        assert model["held"] is True
    assert listing["models"][0]["source"] == str(served.run)
    info = requests.get(f"{base}/v1/info", timeout=10).json()
    assert sorted(info["held"]) == sorted([*IDS, DISCRETE])  # all 16 on the one replica
    assert info["counters"]["policy_loads"] == 16  # loaded and warmed up before healthy
    assert info["warmed_up_to"] == 256
    obs = huggy_obs(5, seed=1)
    for policy_id in IDS:
        answer = post(model_url(base, policy_id), {"obs": obs}).json()
        assert (answer["policy"], answer["model"]) == (policy_id, agents[policy_id].fingerprint)
        np.testing.assert_allclose(np.asarray(answer["actions"], np.float32),
                                   agents[policy_id].compute_action(obs), rtol=0, atol=TOL)
    # the checkpoints really differ: a mixed-up policy would be caught
    assert np.abs(agents[IDS[0]].compute_action(obs) - agents[IDS[1]].compute_action(obs)
                  ).max() > 0.01


def test_header_default_and_unknown_ids(served: Served, agents: dict[str, HuggyAgent]) -> None:
    base = served.url("models")
    obs = huggy_obs(2, seed=2)
    by_header = post(f"{base}/v1/act", {"obs": obs}, {POLICY_ID_HEADER: IDS[9]}).json()
    assert by_header["policy"] == IDS[9]
    np.testing.assert_allclose(np.asarray(by_header["actions"], np.float32),
                               agents[IDS[9]].compute_action(obs), rtol=0, atol=TOL)
    default = post(f"{base}/v1/act", {"obs": obs}).json()
    assert default["policy"] == IDS[3]
    np.testing.assert_allclose(np.asarray(default["actions"], np.float32),
                               agents[IDS[3]].compute_action(obs), rtol=0, atol=TOL)
    for reply in (post(model_url(base, f"{RUN}@7"), {"obs": obs}),
                  post(f"{base}/v1/act", {"obs": obs}, {POLICY_ID_HEADER: "nope"})):
        assert reply.status_code == 404
        assert reply.json()["error"] == "unknown_policy"
        assert reply.json()["message"] == unknown_policy_message(
            reply.json()["message"].split("'")[1], [*IDS, DISCRETE])
    assert "known policies: ckpt_run@100000, ckpt_run@200000" in reply.json()["message"]


def test_each_request_is_validated_against_its_own_policy(
        served: Served, agents: dict[str, HuggyAgent]) -> None:
    base = served.url("models")
    discrete = agents[DISCRETE]
    inputs = {i.name: np.zeros((3, *i.shape), np.float32) for i in discrete.spec.inputs}
    answer = post(model_url(base, DISCRETE), {"inputs": inputs}).json()
    assert answer["policy"] == DISCRETE and answer["model"] == discrete.fingerprint
    np.testing.assert_array_equal(np.asarray(answer["discrete"]),
                                  discrete.compute_action(list(inputs.values())))
    huggy_to_discrete = post(model_url(base, DISCRETE), {"obs": huggy_obs(1, 3)[0]})
    assert huggy_to_discrete.status_code == 422
    assert "observation inputs" in huggy_to_discrete.json()["message"]
    discrete_to_huggy = post(model_url(base, IDS[0]), {"inputs": inputs})
    assert discrete_to_huggy.status_code == 422
    assert "obs_0" in discrete_to_huggy.json()["message"]


def test_a_batch_never_mixes_policies(served: Served, agents: dict[str, HuggyAgent]) -> None:
    """45 requests over 15 policies at once, gathered by a 50 ms batch wait: each answer is its
    own policy's (a batch that mixed policies would answer some with another's weights), and
    every policy had a pass of its own. How many requests share a pass depends on arrival
    times, so it is not asserted."""
    base = served.url("models")
    before = requests.get(f"{base}/v1/info", timeout=10).json()["counters"]
    targets = [IDS[i % 15] for i in range(45)]
    observations = [huggy_obs(2, 100 + i) for i in range(45)]

    async def burst() -> list[tuple[int, dict]]:
        async with aiohttp.ClientSession() as session:
            async def one(policy_id: str, obs: np.ndarray) -> tuple[int, dict]:
                async with session.post(model_url(base, policy_id), data=orjson.dumps(
                        {"obs": obs}, option=orjson.OPT_SERIALIZE_NUMPY)) as reply:
                    return reply.status, orjson.loads(await reply.read())
            return list(await asyncio.gather(*(one(p, o) for p, o in
                                               zip(targets, observations, strict=True))))

    answers = asyncio.run(burst())
    for policy_id, obs, (status, answer) in zip(targets, observations, answers, strict=True):
        assert status == 200 and answer["policy"] == policy_id
        np.testing.assert_allclose(np.asarray(answer["actions"], np.float32),
                                   agents[policy_id].compute_action(obs), rtol=0, atol=TOL)
    after = requests.get(f"{base}/v1/info", timeout=10).json()["counters"]
    requests_made = after["requests"] - before["requests"]
    passes = after["forward_passes"] - before["forward_passes"]
    assert requests_made == 45
    assert passes >= 15  # never fewer passes than policies in the burst


def test_remote_agent_stays_on_one_policy_of_a_split(served: Served,
                                                    agents: dict[str, HuggyAgent]) -> None:
    """Against a 70/30 split, a RemoteAgent answers with one policy for its whole life: the
    split's choice for its session (given, or its own), with that policy's interface and
    weights. Without it, consecutive calls would alternate between the two checkpoints."""
    base = served.url("ab")
    first, second = file_id(STEPS[0]), file_id(STEPS[1])
    split = Split.parse(f"{first}=0.7,{second}=0.3")
    obs = huggy_obs(2, 8)
    local = {file_id(step): agents[f"{RUN}@{step}"] for step in STEPS[:2]}
    sessions = {split.assign(f"user-{i}"): f"user-{i}" for i in range(20)}
    assert set(sessions) == {first, second}
    for policy_id, session in sessions.items():
        with RemoteAgent(base, session=session) as remote:
            assert (remote.policy_id, remote.session) == (policy_id, session)
            assert remote.fingerprint == local[policy_id].fingerprint
            for _ in range(6):
                np.testing.assert_allclose(remote.compute_action(obs),
                                           local[policy_id].compute_action(obs), rtol=0, atol=TOL)
    chosen = set()
    for _ in range(12):  # agents without a session: each keeps the one its own key gets
        with RemoteAgent(base) as remote:
            assert remote.session is not None and remote.session.startswith("remote-")
            assert remote.policy_id == split.assign(remote.session)
            answers = [post(f"{base}/v1/act", {"obs": obs[0], "session": remote.session}).json()
                       ["policy"] for _ in range(4)]
            assert answers == [remote.policy_id] * 4
            remote.compute_action(obs)
            chosen.add(remote.policy_id)
    assert chosen <= {first, second}


def test_split_is_sticky_by_session_and_changes_live(served: Served) -> None:
    base = served.url("ab")
    first, second = file_id(STEPS[0]), file_id(STEPS[1])
    replica = requests.get(f"{base}/v1/info", timeout=10).json()["replica"]
    keys = [f"user-{i}" for i in range(60)]
    expected = Split.parse(f"{first}=0.7,{second}=0.3")
    obs = huggy_obs(1, 4)[0]
    for _ in range(2):
        assigned = [post(f"{base}/v1/act", {"obs": obs, "session": key}).json()["policy"]
                    for key in keys]
        assert assigned == [expected.assign(key) for key in keys]
    assert set(assigned) == {first, second}
    anonymous = {post(f"{base}/v1/act", {"obs": obs}).json()["policy"] for _ in range(30)}
    assert anonymous <= {first, second}
    bad = post(f"{base}/v1/act", {"obs": obs, "session": 12})
    assert bad.status_code == 422 and "'session' must be a string" in bad.json()["message"]
    lone = requests.post(f"{base}/v1/act", timeout=60, data=orjson.dumps(
        {"obs": obs}, option=orjson.OPT_SERIALIZE_NUMPY)[:-1] + rb', "session": "u\ud800"}')
    assert (lone.status_code, lone.json()["message"]) == (422, (
        "'session' must be a string of Unicode characters, received a lone UTF-16 surrogate "
        "'\\ud800' at character 1"))
    # a new split, applied by the running replica (no restart)
    deploy(app_args([str(served.run / "Huggy" / f"Huggy-{STEPS[0]}.pt"),
                     str(served.run / "Huggy" / f"Huggy-{STEPS[1]}.pt")],
                    split=f"{first}=0,{second}=1"), name="ab", route_prefix="/ab", timeout_s=180)
    info = requests.get(f"{base}/v1/info", timeout=10).json()
    assert info["replica"] == replica
    assert info["split"] == {first: 0.0, second: 1.0}
    assigned = {post(f"{base}/v1/act", {"obs": obs, "session": key}).json()["policy"]
                for key in keys}
    assert assigned == {second}
    counts = info["policies"]
    assert counts[first]["requests"] + counts[second]["requests"] >= 2 * len(keys) + 30


def test_least_recently_used_policy_is_evicted_and_reloaded_on_a_miss(
        served: Served, agents: dict[str, HuggyAgent]) -> None:
    base = served.url("lru")
    ids = [file_id(s) for s in STEPS[:4]]
    info = requests.get(f"{base}/v1/info", timeout=10).json()
    assert info["models_per_replica"] == 2 and len(info["held"]) == 2
    obs = huggy_obs(3, 5)
    for index in (2, 3, 0):
        answer = post(model_url(base, ids[index]), {"obs": obs}).json()
        assert answer["policy"] == ids[index]
        np.testing.assert_allclose(np.asarray(answer["actions"], np.float32),
                                   agents[IDS[index]].compute_action(obs), rtol=0, atol=TOL)
    info = requests.get(f"{base}/v1/info", timeout=10).json()
    assert info["held"] == [ids[3], ids[0]]  # least recently used first
    assert info["policies"][ids[0]]["load_ms"] > 0


def test_policies_are_added_and_removed_live_without_failing_requests(
        served: Served, agents: dict[str, HuggyAgent]) -> None:
    """Eight clients keep asking two policies (and the default) while a third is added and then
    removed by redeploys: every request succeeds, the replica is never restarted."""
    base = served.url("live")
    files = [str(served.run / "Huggy" / f"Huggy-{s}.pt") for s in STEPS[:3]]
    ids = [file_id(s) for s in STEPS[:3]]
    deploy(app_args(files[:2]), name="live", route_prefix="/live", timeout_s=180)
    replica = requests.get(f"{base}/v1/info", timeout=10).json()["replica"]
    stop = threading.Event()
    answered = threading.Event()
    failures: list[str] = []
    counts = [0]

    def client(index: int) -> None:
        url = model_url(base, ids[index % 2]) if index % 4 else f"{base}/v1/act"
        with requests.Session() as session:
            while not stop.is_set():
                reply = session.post(url, data=b'{"obs": [' + b"0," * 58 + b"0]}", timeout=60)
                counts[0] += 1
                answered.set()
                if reply.status_code != 200:
                    failures.append(f"{reply.status_code} {reply.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        assert answered.wait(60)
        deploy(app_args(files), name="live", route_prefix="/live", timeout_s=180)
        added = post(model_url(base, ids[2]), {"obs": huggy_obs(1, 6)[0]}).json()
        assert added["policy"] == ids[2]
        np.testing.assert_allclose(np.asarray(added["actions"], np.float32),
                                   agents[IDS[2]].compute_action(huggy_obs(1, 6)[0]), rtol=0,
                                   atol=TOL)
        deploy(app_args(files[:2]), name="live", route_prefix="/live", timeout_s=180)
        removed = post(model_url(base, ids[2]), {"obs": huggy_obs(1, 6)[0]})
        assert removed.status_code == 404
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert counts[0] > 0
    assert requests.get(f"{base}/v1/info", timeout=10).json()["replica"] == replica


def test_remote_agent_and_evaluate_specs_name_a_served_policy(
        served: Served, agents: dict[str, HuggyAgent]) -> None:
    base = served.url("models")
    obs = huggy_obs(4, 7)
    with RemoteAgent(base, policy=IDS[12]) as remote:
        assert remote.fingerprint == agents[IDS[12]].fingerprint
        np.testing.assert_allclose(remote.compute_action(obs), agents[IDS[12]].compute_action(obs),
                                   rtol=0, atol=TOL)
    with RemoteAgent(base) as remote:  # the default
        assert remote.fingerprint == agents[IDS[3]].fingerprint
    with pytest.raises(ValueError, match="no policy 'nope' is served here; known policies: "
                                         "ckpt_run@100000"):
        RemoteAgent(base, policy="nope")
    specs = served_policy_specs(base)
    assert [(s.label, s.url, s.policy_id) for s in specs] == [
        (policy_id, base, policy_id) for policy_id in [*IDS, DISCRETE]]
    assert [s.policy_id for s in served_policy_specs(base, IDS[5])] == [IDS[5]]


def test_openapi_describes_every_policy_route_and_the_key_guards_them(served: Served) -> None:
    """Schemathesis, every check on, against the server's own document (two interfaces, a
    split, an API key): it finds nothing. Without the key every new route answers 401."""
    base = served.url("mixed")
    ids = [file_id(STEPS[0]), file_id(STEPS[1]), DISCRETE]
    for path, method in [("/v1/models", "GET"), (f"/v1/models/{ids[2]}/act", "POST"),
                         ("/v1/models/nope/act", "POST")]:
        refused = requests.request(method, f"{base}{path}", data=b"{}", timeout=60)
        assert refused.status_code == 401, (path, refused.text)
    document = requests.get(f"{base}/v1/openapi.json", headers={"Authorization": f"Bearer {KEY}"},
                            timeout=60).json()
    assert {f"/v1/models/{i}/act" for i in ids} <= set(document["paths"])
    header = document["paths"]["/v1/act"]["post"]["parameters"][0]
    assert (header["name"], header["schema"]["enum"]) == (POLICY_ID_HEADER, ids[:2])
    st = str(Path(sys.executable).with_name("st"))
    config = Path(__file__).with_name("schemathesis.toml")
    result = subprocess.run(
        [st, "--config-file", str(config), "run", f"{base}/v1/openapi.json", "--url", base,
         "--checks", "all", "--max-examples", "25", "--generation-deterministic", "--no-color",
         "--request-timeout", "60", "--header", f"Authorization: Bearer {KEY}"],
        capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "No issues found" in output, output[-6000:]
    assert "Tested: 7" in output, output[-3000:]  # act, 3 policy routes, models, info, healthz
