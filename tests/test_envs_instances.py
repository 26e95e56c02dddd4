"""Several Unity processes behind one HuggyVectorEnv (`instances=K`): real stand-ins over real
gRPC, each driven from its own worker process. Slots, actions reaching the right process and
agent (the stand-in echoes them: `SimConfig.echo_actions`), autoreset, seeds, faults, closing,
`gymnasium.make_vec`, `rollout_per_instance` against one-instance rollouts, `huggy rollout`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest

import envs
from envs import HuggyVectorEnv, InstanceError, RolloutInterrupted, rollout, rollout_per_instance
from envs.instance import instance_seed
from envs.spin_wait import ENVIRONMENT_VARIABLE
from envs.standin.sim import ACT_SIZE, OBS_SIZE
from envs.vector_env import EnvironmentStartError
from huggy_agent import HuggyAgent
from tests.support.envs import (
    KillAfter,
    env_kwargs,
    gait_actions,
    wait_until_dead,
    wait_until_gone,
)
from tests.support.fixtures import REPO_ROOT
from tests.support.processes import free_port, free_port_with_the_next_held

pytestmark = pytest.mark.standin  # every test here starts the stand-in

ECHO = {"echo_actions": 1}
FRESH_JOINTS = [2, 3, 5, 7, 10]  # upper X, Y, strength, lower X, strength of leg 0: 0.5 at spawn


@pytest.fixture(scope="module")
def agent() -> HuggyAgent:
    return HuggyAgent(device="cpu", seed=0)


def _all_pids(env: HuggyVectorEnv) -> list[int]:
    return [*env.worker_process_ids, *(pid for pid in env.process_ids if pid is not None)]


@pytest.mark.parametrize("instances", [2, 3])
def test_slots_are_stable_and_actions_reach_their_agent(tmp_path: Path, instances: int) -> None:
    """Every observation echoes the actions its own stand-in slot received, that slot's index
    within its instance, and its instance's port: actions went to the right process and agent,
    before and after episodes end (Unity's agent order changes then)."""
    n, cap = 4, 7
    rng = np.random.default_rng(instances)
    # Instance i of K tries worker ids i, i + K, i + 2K, ...: the first whose port is free.
    # The test holds instance 1's first port, so that one moves on (a port another program
    # holds may move any instance too).
    with free_port_with_the_next_held() as base, HuggyVectorEnv(**env_kwargs(
            tmp_path, base_port=base, num_agents=n, max_steps=cap, env_parameters=ECHO,
            instances=instances)) as env:
        assert env.num_envs == n * instances and env.instances == instances
        assert env.instance_slices == tuple(slice(i * n, (i + 1) * n) for i in range(instances))
        assert env.observation_space.shape == (n * instances, OBS_SIZE)
        assert env.action_space.shape == (n * instances, ACT_SIZE)
        assert len(set(env.ports)) == len(set(env.worker_ids)) == instances
        assert env.ports == tuple(base + w for w in env.worker_ids)
        assert [w % instances for w in env.worker_ids] == list(range(instances))
        assert env.worker_ids[1] >= 1 + instances
        assert len(set(_all_pids(env))) == 2 * instances
        instance_of = np.repeat(np.arange(instances), n)
        port_of = np.array(env.ports, dtype=np.float32)[instance_of]
        local_slot = np.tile(np.arange(n), instances).astype(np.float32)
        obs, infos = env.reset(seed=4)
        np.testing.assert_array_equal(obs[:, :ACT_SIZE], 0.0)
        np.testing.assert_array_equal(obs[:, ACT_SIZE], local_slot)
        np.testing.assert_array_equal(obs[:, ACT_SIZE + 1], port_of)
        seen = {(i, a) for i, a in zip(instance_of, infos["agent_id"], strict=True)}
        ids, lengths, ended_total = env.agent_ids, np.zeros(n * instances, int), 0
        for _ in range(3 * cap + 2):
            actions = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
            obs, _, terminated, truncated, infos = env.step(actions)
            ended = terminated | truncated
            lengths += 1
            np.testing.assert_array_equal(truncated, lengths == cap)  # the step cap
            assert not (terminated & truncated).any()
            np.testing.assert_array_equal(obs[:, :ACT_SIZE], actions)
            np.testing.assert_array_equal(obs[:, ACT_SIZE], local_slot)
            np.testing.assert_array_equal(obs[:, ACT_SIZE + 1], port_of)
            np.testing.assert_array_equal(env.agent_ids[~ended], ids[~ended])
            np.testing.assert_array_equal(infos["agent_id"], env.agent_ids)
            if ended.any():
                np.testing.assert_array_equal(infos["_final_obs"], ended)
                np.testing.assert_array_equal(infos["final_info"]["agent_id"][ended], ids[ended])
                for slot in np.flatnonzero(ended):
                    np.testing.assert_array_equal(infos["final_obs"][slot][:ACT_SIZE],
                                                  actions[slot])
                    assert infos["final_obs"][slot][ACT_SIZE + 1] == port_of[slot]
                fresh = {(i, a) for i, a in zip(instance_of[ended], env.agent_ids[ended],
                                                strict=True)}
                assert not fresh & seen  # each episode a new agent id within its instance
                seen |= fresh
                ended_total += int(ended.sum())
            lengths[ended] = 0
            ids = env.agent_ids
        assert ended_total >= 3 * n * instances


def test_autoreset_and_scripted_lengths_per_instance(tmp_path: Path) -> None:
    """Scripted episodes: a slot's length and final reward follow its index within its own
    instance (3 + 2 s decisions, reward s; even s terminated, odd s truncated)."""
    n, instances = 3, 2
    script = {"episode_length": 3, "episode_length_step": 2}
    with HuggyVectorEnv(**env_kwargs(tmp_path, num_agents=n, env_parameters=script,
                                     instances=instances, seed=1)) as env:
        env.reset(seed=2)
        local = np.tile(np.arange(n), instances)
        length = 3 + 2 * local
        ids = env.agent_ids
        for t in range(1, 16):
            obs, rewards, terminated, truncated, infos = env.step(gait_actions(t, env.num_envs))
            ends = t % length == 0
            np.testing.assert_array_equal(terminated, ends & (local % 2 == 0))
            np.testing.assert_array_equal(truncated, ends & (local % 2 == 1))
            np.testing.assert_array_equal(rewards[ends], local[ends].astype(np.float32))
            np.testing.assert_array_equal(rewards[~ends], 0.0)
            if not ends.any():
                assert "final_obs" not in infos
                continue
            np.testing.assert_array_equal(infos["_final_obs"], ends)
            for slot in range(env.num_envs):
                final = infos["final_obs"][slot]
                if not ends[slot]:
                    assert final is None
                    continue
                assert final.shape == (OBS_SIZE,) and final.dtype == np.float32
                assert not np.array_equal(final, obs[slot])
                np.testing.assert_array_equal(obs[slot, FRESH_JOINTS], 0.5)  # a fresh dog
            np.testing.assert_array_equal(infos["final_info"]["agent_id"][ends], ids[ends])
            ids = env.agent_ids


def _trajectory(env: HuggyVectorEnv, steps: int, **reset: object) -> list[np.ndarray]:
    obs, _ = env.reset(**reset)
    out = [obs]
    for t in range(steps):
        obs, rewards, *_ = env.step(gait_actions(t, env.num_envs))
        out += [obs, rewards]
    return out


def test_seeds_are_derived_per_instance_and_deterministic(tmp_path: Path) -> None:
    """reset(seed=s): instance i runs exactly what a one-instance env reset with
    instance_seed(s, i) runs; reset(options={"seeds": [...]}) seeds each instance itself."""
    n, steps = 3, 25
    kwargs = env_kwargs(tmp_path, num_agents=n, max_steps=9)
    singles = {}
    for seed in (5, instance_seed(5, 1), 8):
        with HuggyVectorEnv(**kwargs) as one:
            singles[seed] = _trajectory(one, steps, seed=seed)
    assert instance_seed(5, 0) == 5 and instance_seed(5, 1) == (5 + 10_368_889) % 2**24
    with HuggyVectorEnv(**kwargs, instances=2) as two:
        derived = _trajectory(two, steps, seed=5)
        again = _trajectory(two, steps, seed=5)
        chosen = _trajectory(two, steps, options={"seeds": [8, 5]})
        with pytest.raises(ValueError, match=re.escape(
                "options['seeds'] needs one seed per instance: expected 2, got 1")):
            two.reset(options={"seeds": [3]})
        with pytest.raises(ValueError, match=re.escape(
                "pass either seed= or options={'seeds': [...]}, not both")):
            two.reset(seed=1, options={"seeds": [3, 4]})
        with pytest.raises(ValueError, match=re.escape("seed must be in [0, 16777216), got -1")):
            two.reset(options={"seeds": [3, -1]})
        with pytest.raises(ValueError, match=re.escape("unknown reset option(s) ['mask']")):
            two.reset(options={"mask": [True]})
    for a, b in zip(derived, again, strict=True):
        np.testing.assert_array_equal(a, b)
    for whole, first, second in ((derived, 5, instance_seed(5, 1)), (chosen, 8, 5)):
        for k, array in enumerate(whole):
            np.testing.assert_array_equal(array[:n], singles[first][k])
            np.testing.assert_array_equal(array[n:], singles[second][k])


@pytest.mark.parametrize("victim", ["unity", "worker"])
def test_a_killed_instance_is_named_and_nothing_is_left(tmp_path: Path, agent: HuggyAgent,
                                                        victim: str) -> None:
    env = HuggyVectorEnv(**env_kwargs(tmp_path, num_agents=4, max_steps=10, timeout_wait=10,
                                      instances=3))
    try:
        pids = _all_pids(env)
        pid = env.process_ids[1] if victim == "unity" else env.worker_process_ids[1]
        # instance 1 starts on worker id 1, or 1 + 3k where another process held that port
        with pytest.raises(RolloutInterrupted, match=r"instance 1 \(worker_id \d+, port "
                           r"\d+, Unity pid \d+\) failed") as info:
            rollout(KillAfter(agent, steps=15, pid=pid), env, episodes=100, seed=0)
        cause = info.value.__cause__
        assert isinstance(cause, InstanceError) and cause.instance == 1
        if victim == "worker":
            assert "its worker process" in str(cause) and "was killed by signal 9" in str(cause)
        assert len(info.value.result.episodes) == 12  # every slot's first 10-step episode
        assert wait_until_dead(pids) == []
        assert wait_until_gone(str(tmp_path)) == []
        with pytest.raises(RuntimeError, match="the instance workers are closed"):
            env.step(np.zeros(env.action_space.shape))
    finally:
        env.close()
        env.close()


def test_an_instance_that_cannot_start_is_named(tmp_path: Path) -> None:
    """Instance 1's executable exits at once: the error names it, and instance 0 (which did
    start) is closed too."""
    kwargs = env_kwargs(tmp_path, timeout_wait=10)
    broken = tmp_path / "Huggy.x86_64"
    broken.write_text(f'#!/bin/sh\ncase "$*" in *"--mlagents-port {kwargs["base_port"] + 1} "*)\n'
                      f'  echo crashing >&2; exit 3;;\nesac\nexec {envs.builtin_huggy_path()} "$@"\n')
    broken.chmod(0o755)
    with pytest.raises(EnvironmentStartError,
                       match=r"^instance 1: .* could not be started.*return code 3"):
        HuggyVectorEnv(file_name=str(broken), **kwargs, instances=2)
    assert wait_until_gone(str(tmp_path)) == []


@pytest.mark.filterwarnings("ignore:.*Box observation space (minimum|maximum) value is")
def test_make_vec_with_instances_and_closing_twice(tmp_path: Path) -> None:
    env = gymnasium.make_vec("huggy_agent/Huggy-v0", num_envs=6, instances=2,
                             **env_kwargs(tmp_path))
    pids = _all_pids(env)
    try:
        assert isinstance(env, HuggyVectorEnv)
        assert env.num_envs == 6 and env.instance_slices == (slice(0, 3), slice(3, 6))
        assert env.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.SAME_STEP
        assert env.single_observation_space == gymnasium.spaces.Box(
            -np.inf, np.inf, (OBS_SIZE,), np.float32)
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        with pytest.raises(ValueError, match=re.escape(
                "expected actions of shape (6, 21), got (3, 21)")):
            env.step(np.zeros((3, ACT_SIZE)))
        env.step(env.action_space.sample())
        for pid in pids:  # workers and stand-ins never load torch
            assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text()
        # 2 instances poll only with 4 CPUs to use, unless the budget is set (envs.spin_wait)
        expected = os.environ.get(ENVIRONMENT_VARIABLE,
                                  "0" if len(os.sched_getaffinity(0)) < 4 else None)
        for pid in pids:
            variables = dict(entry.partition(b"=")[::2] for entry in
                             Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if entry)
            value = variables.get(ENVIRONMENT_VARIABLE.encode())
            assert (None if value is None else value.decode()) == expected, pid
    finally:
        env.close()
        env.close()
    assert wait_until_dead(pids) == []
    with pytest.raises(ValueError, match="num_envs=5 slots cannot be split evenly over 2 "
                                         "instances"):
        HuggyVectorEnv(num_envs=5, instances=2)
    with pytest.raises(ValueError, match=re.escape("instances must be an integer >= 1, got 0")):
        HuggyVectorEnv(instances=0)
    for num_envs in (0, -2, np.int64(0), 2.0, True):  # named as written, not as num_agents
        with pytest.raises(ValueError, match=re.escape(
                f"num_envs must be an integer >= 1 (1: every agent of the behavior), got "
                f"{num_envs!r}")):
            HuggyVectorEnv(num_envs=num_envs)


@pytest.mark.parametrize("deterministic", [True, False])
def test_rollout_per_instance_equals_one_instance_rollouts(tmp_path: Path, agent: HuggyAgent,
                                                           deterministic: bool) -> None:
    """Item j of a K-instance rollout_per_instance is exactly rollout() on one instance reset
    with seeds[j]: episodes, returns to the bit, agent-steps; a spare instance counts nothing."""
    kwargs = env_kwargs(tmp_path, num_agents=5, max_steps=30)
    seeds, counts = [3, 11, 3], [7, 5, 0]
    with HuggyVectorEnv(**kwargs, instances=3) as env:
        together = rollout_per_instance(agent, env, counts, seeds, deterministic)
    for seed, count, result in zip(seeds, counts, together, strict=True):
        if count == 0:
            assert result.episodes == [] and result.agent_steps == 0
            continue
        with HuggyVectorEnv(**kwargs) as one:
            alone = rollout(agent, one, episodes=count, deterministic=deterministic, seed=seed)
        assert result.episodes == alone.episodes
        assert result.agent_steps == alone.agent_steps
    assert sum(r.seconds for r in together) > 0
    with HuggyVectorEnv(**kwargs) as one, pytest.raises(ValueError, match=re.escape(
            "need one episode count and one seed per instance (1), got 2 and 2")):
        rollout_per_instance(agent, one, [1, 1], [0, 0])


def test_pinned_instances_share_a_core_with_their_worker(tmp_path: Path) -> None:
    """pin_cores=True: instance i's worker and Unity process run on the i-th core this process
    may use (wrapping around); without it they keep this process's cores."""
    cores = sorted(os.sched_getaffinity(0))
    kwargs = env_kwargs(tmp_path, num_agents=1)
    with HuggyVectorEnv(**kwargs, instances=3, pin_cores=True) as pinned:
        for i, (worker, unity) in enumerate(zip(pinned.worker_process_ids, pinned.process_ids,
                                                strict=True)):
            expected = {cores[i % len(cores)]}
            assert os.sched_getaffinity(worker) == expected
            assert os.sched_getaffinity(unity) == expected
        pinned.reset(seed=0)
        pinned.step(np.zeros((3, ACT_SIZE), np.float32))
    with HuggyVectorEnv(**kwargs, instances=2) as free:
        assert {frozenset(os.sched_getaffinity(pid)) for pid in _all_pids(free)} == {
            frozenset(cores)}


def test_huggy_rollout_with_instances(tmp_path: Path) -> None:
    record = tmp_path / "episodes.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "huggy_agent.cli", "rollout", "--instances", "2", "--pin-cores",
         "--episodes",
         "8", "--env-param", "num_agents=3", "--env-param", "max_steps=20", "--record",
         str(record), "--base-port", str(free_port()), "--timeout-wait", "30", "--no-progress"],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"^counted \(per-slot quota\) +2 from each of slots 0-1, 1 from each of "
                     r"the other 4$", out.stdout, re.MULTILINE)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(line["slot"], line["slot_episode"]) for line in lines] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (3, 0), (4, 0), (5, 0)]
    assert {line["instances"] for line in lines} == {2}


def test_workers_and_standins_exit_when_the_python_side_is_killed(tmp_path: Path) -> None:
    code = (
        "import time, envs\n"
        f"env = envs.HuggyVectorEnv(base_port={free_port()}, log_folder={str(tmp_path)!r}, "
        "num_agents=2, instances=2)\n"
        "print(*env.worker_process_ids, *env.process_ids, flush=True)\n"
        "time.sleep(300)\n"
    )
    python = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT)
    try:
        pids = [int(pid) for pid in python.stdout.readline().split()]
        assert len(pids) == 4
    finally:
        python.kill()
        python.wait()
    assert wait_until_dead(pids, timeout=15) == []
    assert wait_until_gone(str(tmp_path), timeout=15) == []


def test_a_worker_that_stops_answering_is_killed(tmp_path: Path, monkeypatch) -> None:
    """A worker frozen mid-run (SIGSTOP) is given up after timeout_wait + ANSWER_MARGIN_S:
    it and its Unity process are killed, the other instance is closed."""
    monkeypatch.setattr(envs.workers, "ANSWER_MARGIN_S", 1.0)
    # timeout_wait leaves the running worker time to answer on a loaded 2-core machine.
    env = HuggyVectorEnv(**env_kwargs(tmp_path, num_agents=2, timeout_wait=8, instances=2))
    pids = _all_pids(env)
    try:
        env.reset(seed=0)
        os.kill(env.worker_process_ids[1], signal.SIGSTOP)
        with pytest.raises(InstanceError, match=r"^instance 1 \(.*\) failed: TimeoutError: no "
                                                r"answer within 9 s$"):
            env.step(np.zeros(env.action_space.shape))
        assert wait_until_dead(pids) == []
        assert wait_until_gone(str(tmp_path)) == []
    finally:
        env.close()
