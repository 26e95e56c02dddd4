"""The work behind `huggy rollout` (its parser lives in envs/cli.py)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlagents_envs.environment import UnityEnvironment
from tqdm import tqdm

from envs.agents import agent_from_source
from envs.behaviors import resolve_key, team_of
from envs.instance import SlotLayout
from envs.recording.base import Recorder
from envs.recording.dataset import MinariRecorder, check_new_dataset, dataset_env_spec
from envs.recording.demo import DemoRecorder
from envs.recording.video import VideoRecorder
from envs.rollout import (
    ESTIMATOR,
    ESTIMATOR_DESCRIPTION,
    EpisodeResult,
    RolloutInterrupted,
    RolloutResult,
    rollout,
    slot_quotas,
    terminated_label,
)
from envs.standin.launcher import standin_behavior
from envs.team_rollout import TeamRolloutResult, rollout_teams
from envs.teams import BUILTIN, TeamsEnv
from envs.vector_env import UnityVectorEnv
from huggy_agent import HuggyAgent
from huggy_agent.formats.sources import hub_provenance, policy_path
from huggy_agent.tables import format_table
from huggy_agent_client.http_api import load_api_key

_TEAM_KEY = re.compile(r"^(team=\d+|[^=/\\.:]+\?team=\d+|[^=/\\.:?]+)=(.+)$")


def parse_policy_option(text: str) -> tuple[str | None, str]:
    """One `[KEY=]POLICY` of `--policy`.

    KEY is `team=N`, a behavior with its team (`SoccerTwos?team=1`) or a behavior's name (`Goalie`:
    no '/', '.' or ':'), so a policy path with '=' in it needs a '/' before it (`./a=b.onnx`).

    Args:
        text: the option's value.

    Returns:
        (KEY or None, POLICY).

    Raises:
        ValueError: a team that is not a number (`team=x=...`).
    """
    if text.startswith("team=") and not re.match(r"team=\d+=", text):
        raise ValueError(f"--policy {text}: a team is a number, such as team=0=POLICY or "
                         "team=1=POLICY")
    match = _TEAM_KEY.match(text)
    return (match.group(1), match.group(2)) if match else (None, text)


def load_agent(args: argparse.Namespace) -> Any:
    """The policy to drive.

    Args:
        args: the parsed `huggy rollout` command line.

    Returns:
        A remote one (`--policy-url`: one policy for the whole rollout, also behind an A/B split)
            or a local `HuggyAgent`.
    """
    if args.policy_url:
        # the HTTP client (requests) is imported only for --policy-url
        from huggy_agent_client.remote import RemoteAgent

        return RemoteAgent(args.policy_url, api_key=load_api_key(args.api_key_file))
    return HuggyAgent(args.policy, device=args.device, precision=args.precision, seed=args.seed)


def _behavior_name(args: argparse.Namespace) -> str:
    """A name for the behavior the stand-in plays: the policy file's run or behavior."""
    if args.policy is None:
        return "Agent"
    path = Path(args.policy)
    return path.stem.split("-")[0] if path.suffix else path.name


def quota_text(episodes: int, slots: int) -> str:
    """How episodes are spread over agent slots, in words.

    Args:
        episodes: the episodes counted.
        slots: the agent slots.

    Returns:
        Such as "5 from each of 18 slots".
    """
    quotas = slot_quotas(episodes, slots)
    extra = episodes % slots
    if extra == 0:
        return f"{quotas[0]} from each of {slots} slots"
    return (f"{quotas[0]} from each of slots 0-{extra - 1}, {quotas[-1]} from each of the other "
            f"{slots - extra}")


def summary_rows(result: RolloutResult, slots: int, behavior: str | None = None
                 ) -> list[tuple[str, object]]:
    """The statistics of a rollout's episodes, for its summary table.

    Args:
        result: the rollout's result.
        slots: the agent slots it counted over.
        behavior: the ML-Agents behavior (it names the terminated count: "reached stick" for
            Huggy).

    Returns:
        (statistic, value) rows.
    """
    returns = [e.episode_return for e in result.episodes]
    lengths = [e.length for e in result.episodes]
    terminated = sum(e.terminated for e in result.episodes)
    return [
        ("episodes", len(returns)),
        ("counted (per-slot quota)", quota_text(len(returns), slots)),
        ("mean return", statistics.fmean(returns) if returns else float("nan")),
        ("std return", statistics.pstdev(returns) if returns else float("nan")),
        ("min return", min(returns) if returns else float("nan")),
        ("max return", max(returns) if returns else float("nan")),
        ("mean length", statistics.fmean(lengths) if lengths else float("nan")),
        (terminated_label([behavior]), f"{terminated}/{len(returns)}"),
        ("agent-steps", result.agent_steps),
        ("agent-steps/s", result.agent_steps_per_second),
        ("seconds", result.seconds),
    ]


def episode_record(number: int, episode: EpisodeResult, context: dict[str, Any]) -> str:
    """One JSON line of the `--record` file.

    Args:
        number: the episode's number in the result.
        episode: the episode.
        context: what every line repeats (env, policy, seed, ...).

    Returns:
        The line, without its newline.
    """
    return json.dumps({"episode": number, "slot": episode.slot, "slot_episode": episode.index,
                       "return": episode.episode_return, "length": episode.length,
                       "terminated": episode.terminated, **context})


def _policy_name(policy: Path | None) -> str:
    """The policy as the record names it: hf://owner/repo@commit/path for one from the Hub."""
    if policy is None:
        return "bundled"
    found = hub_provenance(policy)
    return str(policy) if found is None else found.describe()


def recorders_for(args: argparse.Namespace, agent: Any, context: dict[str, Any],
                  behavior: dict | None) -> list[Recorder]:
    """The recorders `--video`, `--demo` and `--dataset` ask for.

    Args:
        args: the parsed `huggy rollout` command line.
        agent: the policy (its fingerprint goes into a dataset's metadata).
        context: the rollout's env, policy, seed and mode.
        behavior: the stand-in's behavior spec, None with a Unity build.

    Returns:
        The recorders, in that order.

    Raises:
        ValueError: the `--dataset` id is not of Minari's form, or exists already.
        ImportError: `--dataset` without Minari installed.
    """
    recorders: list[Recorder] = []
    if args.video is not None:
        recorders.append(VideoRecorder(args.video, slot=0, episodes=args.video_episodes,
                                       label=str(context["policy"])))
    if args.demo is not None:
        recorders.append(DemoRecorder(args.demo))
    if args.dataset is not None:
        check_new_dataset(args.dataset)
        metadata = {**context, "fingerprint": getattr(agent, "fingerprint", None),
                    "episodes": args.episodes, "estimator": ESTIMATOR,
                    "estimator_description": ESTIMATOR_DESCRIPTION,
                    "behavior": None if behavior is None else behavior.get("behavior")}
        recorders.append(MinariRecorder(
            args.dataset, env_spec=dataset_env_spec(
                None if args.env == "builtin" else str(Path(args.env)), behavior,
                env_parameters=dict(args.env_param)),
            metadata=metadata, algorithm_name=f"huggy rollout of {context['policy']}",
            description=(f"{args.episodes} episodes of {context['policy']} "
                         f"({'deterministic' if context['deterministic'] else 'stochastic'}) "
                         f"on {args.env}, seed {args.seed}: {ESTIMATOR_DESCRIPTION}")))
    return recorders


def run_rollout(args: argparse.Namespace) -> int:
    """Run `huggy rollout` and print a summary table.

    One behavior's agents run as a vector env; in a scene of several behaviors or teams
    (`--env builtin:<scene>` or `--policy KEY=POLICY`), every behavior by its own policy
    (`run_team_rollout`).

    Args:
        args: the parsed command line.

    Returns:
        The exit code: 0, or 1 when the environment died mid-rollout (the episodes counted before
            are printed).

    Raises:
        ValueError: `--episodes` below 1, a port beyond 65535, or a policy that cannot be found.
    """
    if args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    base_port = UnityEnvironment.BASE_ENVIRONMENT_PORT if args.base_port is None \
        else args.base_port
    if base_port + args.worker_id > 65535:
        raise ValueError(f"--base-port {base_port} + --worker-id {args.worker_id} is beyond the "
                         "last port, 65535")
    options = [parse_policy_option(text) for text in args.policy or []]
    if args.env.startswith(BUILTIN + ":") or len(options) > 1 or any(k for k, _ in options):
        return run_team_rollout(args, options)
    try:
        args.policy = policy_path(options[0][1]) if options else None
    except argparse.ArgumentTypeError as error:
        raise ValueError(str(error)) from None
    return _run_one_behavior(args)


def _run_one_behavior(args: argparse.Namespace) -> int:
    agent = load_agent(args)
    file_name = None if args.env == BUILTIN else str(Path(args.env))
    policy_name = (f"{args.policy_url} ({agent.policy_id})" if args.policy_url
                   else _policy_name(args.policy))
    context = {"env": args.env, "policy": policy_name,
               "deterministic": not args.stochastic, "seed": args.seed,
               "instances": args.instances}
    bar = tqdm(total=args.episodes, unit="episode", file=sys.stderr, disable=args.no_progress)

    def progress(episode: EpisodeResult) -> None:
        bar.update(1)
        bar.set_postfix(last_return=f"{episode.episode_return:.3f}")

    behavior = None
    if file_name is None:  # the stand-in plays Huggy, or the policy's own behavior
        behavior = standin_behavior(agent.spec.as_dict(), _behavior_name(args))
    recorders = recorders_for(args, agent, context, behavior)
    env = UnityVectorEnv(file_name=file_name, worker_id=args.worker_id, seed=args.seed,
                         timeout_wait=args.timeout_wait, base_port=args.base_port,
                         env_parameters=dict(args.env_param), instances=args.instances,
                         behavior_spec=behavior, pin_cores=args.pin_cores,
                         render_mode="rgb_array" if args.video is not None else None)
    status = 0
    try:
        result = rollout(agent, env, episodes=args.episodes, deterministic=not args.stochastic,
                         seed=args.seed, progress=progress, recorders=recorders)
    except RolloutInterrupted as error:
        result, status = error.result, 1
        print(f"huggy rollout: {error}", file=sys.stderr)
    finally:
        bar.close()
        env.close()
    if args.record:  # in (slot, episode index) order, as the statistics count them
        with open(args.record, "w", encoding="utf-8") as record:
            for number, episode in enumerate(result.episodes):
                record.write(episode_record(number, episode, context) + "\n")
    print(format_table(["statistic", "value"],
                       [("policy", policy_name),
                        *summary_rows(result, env.num_envs, env.behavior_name)]))
    for line in recording_lines(recorders):
        print(line)
    return status


def recording_lines(recorders: list[Recorder]) -> list[str]:
    """What the recorders wrote, for the summary.

    Args:
        recorders: the rollout's recorders.

    Returns:
        One line per video, demonstration file or dataset written.
    """
    lines = []
    for recorder in recorders:
        for path in getattr(recorder, "written", []):
            lines.append(f"video: {path}")
        summary = getattr(recorder, "summary", None)
        if summary is not None:
            lines.append(f"demonstration: {summary.path} ({summary.episodes} episodes, "
                         f"{summary.steps} steps, mean reward {summary.mean_reward:.4f})")
        dataset = getattr(recorder, "dataset", None)
        if dataset is not None:
            lines.append(f"Minari dataset: {dataset.spec.dataset_id} ({dataset.total_episodes} "
                         f"episodes, {dataset.total_steps} steps)")
    return lines


def run_team_rollout(args: argparse.Namespace, options: list[tuple[str | None, str]]) -> int:
    """Play every behavior of the scene by its policy until each team counted `--episodes` episodes;
    print one row per team.

    Args:
        args: the parsed command line.
        options: (key or None, source) of each `--policy`; a source without a key plays every
            behavior it fits.

    Returns:
        0.

    Raises:
        ValueError: options that a rollout of several teams does not take (`--policy-url`,
            `--video`, `--demo`, `--dataset`, `--instances`), no policy, a behavior no policy
            plays, a policy that fits no behavior, or a behavior two policies claim.
    """
    refused = [name for name, value in (("--policy-url", args.policy_url), ("--video", args.video),
                                        ("--demo", args.demo), ("--dataset", args.dataset))
               if value is not None]
    if refused or args.instances != 1:
        raise ValueError(f"a rollout of several behaviors or teams takes neither {refused or ''}"
                         f"{' nor --instances' if args.instances != 1 else ''}; give each team "
                         "its policy with --policy KEY=POLICY (a served one as "
                         "KEY=http://HOST:PORT#ID)")
    if not options:
        raise ValueError("give each behavior or team its policy: --policy KEY=POLICY, or one "
                         "--policy POLICY for every behavior it fits")
    env = TeamsEnv(args.env, worker_id=args.worker_id, base_port=args.base_port, seed=args.seed,
                   timeout_wait=args.timeout_wait, env_parameters=dict(args.env_param))
    try:
        agents, names = _team_agents(env, options, args)
        bar = tqdm(total=args.episodes * len({team_of(b) for b in env.behaviors}),
                   unit="episode", file=sys.stderr, disable=args.no_progress)
        try:
            result = rollout_teams(env, agents, args.episodes, seed=args.seed,
                                   deterministic=not args.stochastic,
                                   progress=lambda _: bar.update(1))
        finally:
            bar.close()
    finally:
        env.close()
    if args.record:
        with open(args.record, "w", encoding="utf-8") as record:
            for number, episode in enumerate(result.episodes):
                record.write(json.dumps({"episode": number, **asdict(episode),
                                         "policy": names[episode.behavior], "env": args.env,
                                         "deterministic": not args.stochastic,
                                         "seed": args.seed}) + "\n")
    print(team_table(result, names))
    return 0


def _team_agents(env: TeamsEnv, options: list[tuple[str | None, str]],
                 args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """Each behavior's agent and the name of its policy; ValueError for a behavior no policy
    plays, or one that two policies claim."""
    agents: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, source in options:
        agent = agent_from_source(source, device=args.device, precision=args.precision,
                                  seed=args.seed)
        if key is None:
            fits = [b for b in env.behaviors
                    if env.layouts[b] == SlotLayout.of_policy(agent.spec)]
            if not fits:
                raise ValueError(f"{source} ({agent.spec.describe()}) fits no behavior of this "
                                 f"scene: {[f'{b}: {env.layouts[b].describe()}' for b in env.behaviors]}")
            named = fits
        else:
            named = resolve_key(key, env.behaviors)
            for behavior in named:
                env.layouts[behavior].check_fits(agent.spec, source, behavior)
        for behavior in named:
            if behavior in agents:
                raise ValueError(f"{behavior} is given two policies: {names[behavior]} and "
                                 f"{source}")
            agents[behavior], names[behavior] = agent, source
    return agents, names


def team_table(result: TeamRolloutResult, names: dict[str, str]) -> str:
    """The rollout's result by team, as a table.

    Args:
        result: the team rollout's result.
        names: each behavior's policy source.

    Returns:
        One row per team (its behaviors and policies, episodes, goals for and against: episodes
            won or lost before the step limit, wins, draws, losses, mean return and length), then
            the agent-steps and seconds.
    """
    rows = []
    for summary in result.by_team():
        mine = [e for e in result.episodes if e.team == summary.team]
        rows.append((str(summary.team), ", ".join(summary.behaviors),
                     ", ".join(sorted({names[b] for b in summary.behaviors})), summary.episodes,
                     sum(e.result == 1.0 and not e.truncated for e in mine),
                     sum(e.result == 0.0 and not e.truncated for e in mine),
                     summary.wins, summary.draws, summary.losses, summary.mean_return,
                     summary.mean_length))
    return format_table(["team", "behaviors", "policy", "episodes", "goals for",
                         "goals against", "wins", "draws", "losses", "mean return",
                         "mean length"], rows) + (
        f"\n{result.agent_steps:,} agent-steps in {result.seconds:.1f} s")
