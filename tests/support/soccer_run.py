"""A stand-in SoccerTwos training run for the watch's team-scene tests: three checkpoints of
different strength, laid out as `mlagents-learn` writes them."""

from __future__ import annotations

from pathlib import Path

from huggy_agent import HuggyAgent
from huggy_agent.formats.export_onnx import export_onnx
from tests.support.fixtures import EXTRA_FIXTURES

SOCCER_STEPS = {10000: {0: 0, 1: 0, 2: 0}, 20000: {}, 30000: {0: 1}}
"""Each checkpoint of the stand-in run: the trained SoccerTwos fixture with its branches' logits
shifted by +6 toward the action named ({branch: action}): at 10,000 toward standing still in
every branch (it never scores), at 20,000 as trained, at 30,000 toward running forward."""


def write_soccer_run(folder: Path) -> list[Path]:
    """A results folder of three SoccerTwos checkpoints, written by the project's exporter as
    `mlagents-learn` lays them out."""
    trained = EXTRA_FIXTURES / "soccertwos_standin" / "SoccerTwos.onnx"
    written = []
    for step, shifts in SOCCER_STEPS.items():
        actor = HuggyAgent.from_checkpoint(trained, device="cpu").loaded.build()
        state = actor.state_dict()
        for branch, action in shifts.items():
            state[f"action_model._discrete_distribution.branches.{branch}.bias"][action] += 6.0
        actor.load_state_dict(state)
        path = folder / "SoccerTwos" / f"SoccerTwos-{step}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        written.append(export_onnx(actor, path))
    return written
