"""The client as a user of the huggy-agent-client distribution has it: `RemoteAgent` (or
`GrpcRemoteAgent`) in a fresh
interpreter where torch, onnx, onnxruntime and orjson cannot be imported (each is None in
`sys.modules` before anything else is imported, so `import torch` raises ImportError), and the
check of its answers against the bundled policy in process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np

from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.fixtures import REPO_ROOT

BLOCKED = ("torch", "onnx", "onnxruntime", "orjson")
"""What a client-only install lacks: the policy's frameworks, and orjson (an optional extra)."""

_CLIENT = """
import json, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
import numpy as np
from huggy_agent_client import GrpcRemoteAgent, RemoteAgent
from huggy_agent_client.remote import ORJSON
obs = np.asarray(json.loads(sys.argv[3]), dtype=np.float32)
url, grpc_target, key = sys.argv[2], sys.argv[4], sys.argv[5] or None
agent = (GrpcRemoteAgent(url, grpc_target, timeout=60, api_key=key) if grpc_target
         else RemoteAgent(url, timeout=60, api_key=key))
with agent:
    answers = {
        "policy": agent.policy_id,
        "batch": agent.compute_action(obs).tolist(),
        "row": agent.compute_action(obs[0]).tolist(),
        "seeded": agent.compute_action(obs, deterministic=False, seed=7, row_offset=2).tolist(),
    }
answers["orjson"] = ORJSON
answers["modules"] = sorted({name.split(".")[0] for name, module in sys.modules.items()
                             if module is not None})
print(json.dumps(answers))
"""


def actions_without_torch(url: str, obs: np.ndarray, grpc_target: str = "",
                          api_key: str = "") -> dict[str, Any]:
    """The answers of `RemoteAgent(url)` (`GrpcRemoteAgent(url, grpc_target)` with a gRPC
    address) in a fresh interpreter without `BLOCKED`: the policy id; deterministic actions of
    the batch `obs` and of its first row; stochastic ones with seed 7 from row offset 2; whether
    orjson was used; the top-level modules it imported.

    Raises:
        AssertionError: the client's process failed (with its stderr).
    """
    done = subprocess.run([sys.executable, "-c", _CLIENT, ",".join(BLOCKED), url,
                           json.dumps(obs.tolist()), grpc_target, api_key],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    answers: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answers


def assert_in_process_actions(answers: dict[str, Any], obs: np.ndarray) -> None:
    """`actions_without_torch`'s answers for `obs` are the bundled policy's in this process
    (within `FP32_ACTION_ATOL`), and the client imported none of `BLOCKED`."""
    assert answers["orjson"] is False
    assert "requests" in answers["modules"] and not set(answers["modules"]) & set(BLOCKED)
    agent = HuggyAgent(device="cpu")
    for name, expected in (("batch", agent.compute_action(obs)),
                           ("row", agent.compute_action(obs[0])),
                           ("seeded", agent.compute_action(obs, deterministic=False, seed=7,
                                                           row_offset=2))):
        got = np.asarray(answers[name], dtype=np.float32)
        assert got.shape == np.shape(expected), name
        np.testing.assert_allclose(got, expected, rtol=0, atol=FP32_ACTION_ATOL, err_msg=name)
