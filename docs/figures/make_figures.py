"""Make the site's figures from real runs on the stand-in, and record how each was made.

    python docs/figures/make_figures.py                  # a few minutes on 2 idle cores
    python docs/figures/make_figures.py --only frame     # remake some: evaluation, tournament, frame

- an evaluation of the three real Huggy runs of tests/fixtures/huggy (`huggy evaluate --no-ray`,
  90 episodes each): learning_curve.png, probability_of_improvement.png, performance_profile.png;
- a tournament of the scripted SoccerTwos players and the stand-in-trained SoccerTwos policy
  (`huggy tournament --no-ray`, 120 matches): ratings.png, win_rate.png;
- a frame of the Huggy stand-in driven by the bundled policy: standin_frame.png.

The PNGs are copied into docs/figures/ and figures.json records the command, the date, the
machine and the commit of each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
FIXTURES = Path("tests") / "fixtures"
"""Relative to the repository root, where the commands run."""

EVALUATION = ["evaluate", *(str(FIXTURES / "huggy" / run) for run in
                            ("ppo_baseline", "ppo_num_layers_2", "ppo_normalize_False")),
              "--no-ray", "--episodes", "90", "--seed", "0", "--no-progress"]
TOURNAMENT = ["tournament", "heuristic:chaser", "heuristic:random", "heuristic:idle",
              str(FIXTURES / "mlagents_extra" / "soccertwos_standin"), "--matches", "120",
              "--seed", "0", "--no-ray", "--no-progress"]
FRAME_STEPS = 40

FIGURES = {
    "learning_curve.png": EVALUATION,
    "probability_of_improvement.png": EVALUATION,
    "performance_profile.png": EVALUATION,
    "ratings.png": TOURNAMENT,
    "win_rate.png": TOURNAMENT,
    "standin_frame.png": ["(python) HuggyVectorEnv(render_mode='rgb_array'), bundled policy, "
                          f"seed 0, {FRAME_STEPS} steps, render_frame(0)"],
}
"""Every figure this script makes (file name -> how), and so every PNG in docs/figures/."""


def huggy(args: list[str], out: Path) -> None:
    """Run `huggy ARGS --out OUT` with this interpreter's `huggy_agent.cli`."""
    subprocess.run([sys.executable, "-m", "huggy_agent.cli", *args, "--out", str(out)],
                   check=True, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def standin_frame(path: Path) -> None:
    """One frame of slot 0 after `FRAME_STEPS` steps of the bundled policy on the stand-in."""
    from PIL import Image

    from envs import HuggyVectorEnv
    from huggy_agent import HuggyAgent

    agent = HuggyAgent()
    with HuggyVectorEnv(seed=0, render_mode="rgb_array", render_label="bundled") as env:
        obs, _ = env.reset(seed=0)
        for _ in range(FRAME_STEPS):
            obs, *_ = env.step(agent.compute_action(obs))
        Image.fromarray(env.render_frame(0)).save(path)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return f"{platform.machine()}, {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


PARTS = {"evaluation": EVALUATION, "tournament": TOURNAMENT}


def main() -> None:
    parser = argparse.ArgumentParser(description="Make the site's figures from real runs.")
    parser.add_argument("--only", default="evaluation,tournament,frame",
                        help="comma-separated parts to remake (default: all)")
    parts = parser.parse_args().only.split(",")
    unknown = sorted(set(parts) - {*PARTS, "frame"})
    if unknown:
        parser.error(f"unknown part(s) {unknown}; expected some of {[*PARTS, 'frame']}")
    made_now = []
    with tempfile.TemporaryDirectory() as work:
        for part, command in PARTS.items():
            if part in parts:
                huggy(command, Path(work) / part)
                for name, how in FIGURES.items():
                    if how is command:
                        shutil.copy(Path(work) / part / name, HERE / name)
                        made_now.append(name)
    if "frame" in parts:
        standin_frame(HERE / "standin_frame.png")
        made_now.append("standin_frame.png")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                            capture_output=True, text=True).stdout.strip()
    made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    record_path = HERE / "figures.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    for name in made_now:
        how = FIGURES[name]
        record[name] = {"how": " ".join(["huggy", *how]) if how in PARTS.values() else how[0],
                        "made": made, "machine": machine(), "commit": commit}
    record_path.write_text(json.dumps(dict(sorted(record.items())), indent=2) + "\n")
    print("wrote", ", ".join(made_now), "and figures.json to", HERE)


if __name__ == "__main__":
    main()
