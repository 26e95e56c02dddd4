"""Reads a `.demo` file with ML-Agents' own trainer (`mlagents.trainers.demo_loader`, mlagents
1.1.0) and saves what it read as an .npz, for tests/test_recording.py.

Run as `python tests/mlagents_demo_reader.py FILE.demo OUT.npz` in its own process: importing
the trainer sets torch's thread count, and needs two shims for a current stack (mlagents 1.1.0
pins Python 3.10 and numpy 1.23): `np.float` (gone in numpy 2, named in an annotation of
`mlagents.trainers.buffer`) and `pkg_resources.get_distribution` (gone from setuptools >= 81,
used to check torch's version). `import envs` comes first: it makes the protobuf modules work.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import types
from pathlib import Path

import numpy as np

import envs  # noqa: F401  (mlagents-envs' protobuf modules on the installed protobuf)


def _install_shims() -> None:
    if not hasattr(np, "float"):
        np.float = float  # type: ignore[attr-defined]
    if "pkg_resources" not in sys.modules:
        shim = types.ModuleType("pkg_resources")

        class DistributionNotFound(Exception):
            pass

        def get_distribution(name: str) -> types.SimpleNamespace:
            try:
                return types.SimpleNamespace(version=importlib.metadata.version(name))
            except importlib.metadata.PackageNotFoundError:
                raise DistributionNotFound(name) from None

        shim.DistributionNotFound = DistributionNotFound  # type: ignore[attr-defined]
        shim.get_distribution = get_distribution  # type: ignore[attr-defined]
        sys.modules["pkg_resources"] = shim


def main(demo: str, out: str) -> None:
    _install_shims()
    from google.protobuf.internal.decoder import _DecodeVarint32
    from mlagents.trainers.buffer import BufferKey
    from mlagents.trainers.demo_loader import demo_to_buffer, load_demonstration
    from mlagents_envs.communicator_objects.demonstration_meta_pb2 import (
        DemonstrationMetaProto,
    )

    spec, pairs, expected = load_demonstration(demo)
    data = Path(demo).read_bytes()
    size, position = _DecodeVarint32(data, 0)
    meta = DemonstrationMetaProto.FromString(data[position : position + size])
    arrays: dict[str, np.ndarray] = {}
    for k, pair in enumerate(pairs):
        info = pair.agent_info
        for i, obs in enumerate(info.observations):
            arrays[f"obs{i}_{k}"] = np.array(obs.float_data.data, np.float32).reshape(
                tuple(obs.shape))
        arrays[f"continuous_{k}"] = np.array(pair.action_info.continuous_actions, np.float32)
        arrays[f"discrete_{k}"] = np.array(pair.action_info.discrete_actions, np.int64)
        arrays[f"mask_{k}"] = np.array(info.action_mask, bool)
    arrays["reward"] = np.array([p.agent_info.reward for p in pairs], np.float32)
    arrays["done"] = np.array([p.agent_info.done for p in pairs], bool)
    arrays["max_step"] = np.array([p.agent_info.max_step_reached for p in pairs], bool)
    # What behavioral cloning trains on: the trainer's own buffer from the file.
    _, buffer = demo_to_buffer(demo, sequence_length=1)
    arrays["buffer_done"] = np.array(buffer[BufferKey.DONE], bool)
    arrays["buffer_reward"] = np.array(buffer[BufferKey.ENVIRONMENT_REWARDS], np.float32)
    if spec.action_spec.continuous_size:
        arrays["buffer_continuous"] = np.array(
            [np.asarray(a, np.float32) for a in buffer[BufferKey.CONTINUOUS_ACTION]])
    summary = {
        "observation_shapes": [list(o.shape) for o in spec.observation_specs],
        "dimension_properties": [[int(d) for d in o.dimension_property]
                                 for o in spec.observation_specs],
        "continuous_size": spec.action_spec.continuous_size,
        "discrete_branches": list(spec.action_spec.discrete_branches),
        "expected": expected, "pairs": len(pairs),
        "meta": {"api_version": meta.api_version, "name": meta.demonstration_name,
                 "steps": meta.number_steps, "episodes": meta.number_episodes,
                 "mean_reward": meta.mean_reward},
    }
    arrays["summary"] = np.array(json.dumps(summary))
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
