"""The fixture sets under tests/fixtures: real trained Huggy policies and ML-Agents policies of
every other kind (each set's README says where it came from)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


FIXTURES = REPO_ROOT / "tests" / "fixtures"


def _fixture_set(name: str, variable: str) -> Path:
    """The fixture set `tests/fixtures/<name>` (or `$<variable>` where set). Where it is absent,
    the test (or, when called at import time, the whole module) is skipped, saying how to get it."""
    path = Path(os.environ.get(variable, FIXTURES / name))
    if path.is_dir():
        return path
    if variable in os.environ:
        how = f"${variable} names no folder; unset it to use tests/fixtures/{name}"
    else:
        how = (f"it ships with the repository (`git checkout -- tests/fixtures/{name}` restores it), "
               f"or set ${variable} to a copy")
    pytest.skip(f"fixture set {name!r} not found at {path}: {how}", allow_module_level=True)


def fixtures_dir() -> Path:
    """Three real trained Huggy policies (tests/fixtures/huggy, see its README; `$HUGGY_FIXTURES`
    overrides)."""
    return _fixture_set("huggy", "HUGGY_FIXTURES")


FIXTURE_RUNS = ("ppo_baseline", "ppo_num_layers_2", "ppo_normalize_False")


def mlagents_fixtures_dir() -> Path:
    """ML-Agents policies of every other kind (tests/fixtures/mlagents, see its README;
    `$MLAGENTS_FIXTURES` overrides)."""
    return _fixture_set("mlagents", "MLAGENTS_FIXTURES")


MLAGENTS_RUNS = ("discrete_multibranch", "hybrid", "raycast_stack", "visual_simple",
                 "visual_nature", "visual_resnet", "visual_fc", "lstm", "buffer_sensor",
                 "pyramids_trained")


EXTRA_FIXTURES = FIXTURES / "mlagents_extra"
EXTRA_RUNS = ("sac_continuous", "sac_discrete", "poca_hybrid", "visual_match3", "soccertwos_standin")


def mlagents_policy_files() -> list[Path]:
    """Every ML-Agents fixture file the loaders must read: each run's final `.onnx` and its
    `.pt` where it has one (the trained Pyramids policy has none), tests/fixtures/mlagents
    first, then tests/fixtures/mlagents_extra (SAC, POCA, match3)."""
    runs = [mlagents_fixtures_dir() / run for run in MLAGENTS_RUNS]
    runs += [EXTRA_FIXTURES / run for run in EXTRA_RUNS]
    files = []
    for run in runs:
        files += sorted(run.glob("*.onnx")) + sorted(run.glob("*/*.pt"))
    return files
