"""Rendering: the drawing against a worked-out pixel mapping, camera frames against the
observation, the render side channel against the simulation itself, and the Gymnasium render
contract (RecordVideo on the single env, the vector env's tuple of frames)."""

from __future__ import annotations

import re

import gymnasium
import numpy as np
import pytest

import envs  # noqa: F401  (registers the envs)
from envs import HuggyEnv, HuggyVectorEnv, UnityVectorEnv
from envs.render import ARENA_PX, Overlay, SlotTracks, huggy_frame, visual_frame
from envs.standin import poses
from envs.standin.sim import HuggySim, SimConfig
from tests.support.envs import env_kwargs, gait_actions


def _pixel(x: float, z: float, half_width: float) -> tuple[int, int]:
    """The arena view's mapping, worked out: 0.8 m of margin around the arena, 480 pixels."""
    scale = ARENA_PX / (2 * (half_width + 0.8))
    return int((x + half_width + 0.8) * scale), int((half_width + 0.8 - z) * scale)


def _pose(x: float = 1.0, z: float = -2.0, yaw: float = 0.3, stick=(4.0, 4.0)) -> np.ndarray:
    sim = HuggySim(SimConfig(num_agents=1, render=1), seed=0)
    state = sim.poses()[0].copy()
    state[poses.POSITION] = (x, 0.8, z)
    state[poses.YAW] = yaw
    state[poses.STICK] = stick
    return state


FUR = (196, 124, 58)
FLOOR = (214, 198, 160)
GRID = (198, 180, 140)


def test_the_dog_and_the_stick_are_drawn_where_the_pose_puts_them():
    state = _pose()
    frame = huggy_frame(state, np.zeros((0, 2)), Overlay())
    assert frame.shape == (480, 640, 3) and frame.dtype == np.uint8
    x, y = _pixel(1.0, -2.0, 7.0)
    assert tuple(frame[y, x]) == FUR  # the body's centre
    moved = state.copy()
    moved[poses.POSITION] = (-3.0, 0.8, 2.5)
    frame = huggy_frame(moved, np.zeros((0, 2)), Overlay())
    assert tuple(frame[y, x]) in (FLOOR, GRID)  # the empty floor (x = 1 m is a grid line)
    x, y = _pixel(-3.0, 2.5, 7.0)
    assert tuple(frame[y, x]) == FUR
    sx, sy = _pixel(4.0, 4.0, 7.0)
    assert tuple(frame[sy, sx]) == (112, 72, 30)  # the stick


def test_a_frame_is_a_pure_function_of_its_inputs():
    state, trail = _pose(), np.array([[0.0, 0.0], [0.5, -1.0], [1.0, -2.0]])
    overlay = Overlay(label="policy.onnx", step=12, episode_return=0.25, slot=3)
    first = huggy_frame(state, trail, overlay)
    np.testing.assert_array_equal(huggy_frame(state, trail, overlay), first)
    assert not np.array_equal(huggy_frame(state, trail, Overlay(step=13, episode_return=0.25,
                                                                 label="policy.onnx", slot=3)),
                              first)
    ended = huggy_frame(state, trail, Overlay(ended="reached the stick"))
    assert not np.array_equal(ended[10:50, 100:380], huggy_frame(state, trail, Overlay())
                              [10:50, 100:380])


def test_a_bad_pose_is_refused():
    with pytest.raises(ValueError, match=re.escape(f"expected a pose of {poses.POSE_SIZE} "
                                                   "values, got shape (3,)")):
        huggy_frame(np.zeros(3), np.zeros((0, 2)), Overlay())


def test_visual_frames_are_the_observation_in_bytes():
    rng = np.random.default_rng(0)
    image = rng.random((3, 10, 12), dtype=np.float32)
    frame = visual_frame(image)
    factor = 26  # the smallest whole factor that makes 10 rows at least 256
    assert frame.shape == (260, 312, 3)
    expected = np.rint(image.transpose(1, 2, 0) * 255).astype(np.uint8)
    np.testing.assert_array_equal(frame[::factor, ::factor], expected)
    gray = visual_frame(image[:1], min_height=10)
    np.testing.assert_array_equal(gray[..., 0], gray[..., 2])
    with pytest.raises(ValueError, match=re.escape("1 or 3 channels, got shape (4, 10, 12)")):
        visual_frame(rng.random((4, 10, 12)))


def test_pose_records_round_trip():
    sim = HuggySim(SimConfig(num_agents=3, render=1), seed=1)
    record = poses.encode_record(sim.agent_id, sim.poses(), sim.agent_id[:1], sim.poses()[:1])
    assert record[:16] == poses.RENDER_CHANNEL_ID.bytes_le
    message = poses.decode_payload(record[20:])
    np.testing.assert_array_equal(message.ids, sim.agent_id)
    np.testing.assert_array_equal(message.poses, sim.poses())
    np.testing.assert_array_equal(message.final_poses, sim.poses()[:1])
    with pytest.raises(ValueError, match="expected a version 1 pose record"):
        poses.decode_payload(record[20:-4])


def test_slot_tracks_keep_the_ended_episode():
    tracks = SlotTracks(2)
    tracks.reset(np.array([[0.0, 0.0], [1.0, 1.0]]))
    rewards = np.array([0.5, 0.25], np.float32)
    tracks.step(rewards, np.array([False, False]), np.array([False, False]),
                np.array([[0.1, 0.0], [1.1, 1.0]]), None)
    tracks.step(rewards, np.array([False, True]), np.array([False, False]),
                np.array([[0.2, 0.0], [5.0, 5.0]]), np.array([[0.0, 0.0], [1.2, 1.0]]))
    assert tracks.lengths.tolist() == [2, 0] and tracks.final_lengths[1] == 2
    assert tracks.final_returns[1] == 0.5 and tracks.final_terminated[1]
    np.testing.assert_array_equal(tracks.trail(1, final=True), [[1.0, 1.0], [1.1, 1.0],
                                                                [1.2, 1.0]])
    np.testing.assert_array_equal(tracks.trail(1), [[5.0, 5.0]])
    np.testing.assert_array_equal(tracks.trail(0), [[0.0, 0.0], [0.1, 0.0], [0.2, 0.0]])


@pytest.mark.standin
def test_the_side_channel_carries_the_simulations_poses(tmp_path):
    """Every slot's pose after each step, and the last pose of each ended episode, are those of
    the same simulation run here with the same seed and actions (scripted episodes end at
    different steps per slot)."""
    config = SimConfig(num_agents=5, episode_length=4, episode_length_step=3, render=1)
    with HuggyVectorEnv(**env_kwargs(tmp_path), num_agents=5, render_mode="rgb_array",
                        env_parameters={"episode_length": 4, "episode_length_step": 3}) as env:
        env.reset(seed=21)
        sim = HuggySim(config, seed=21)
        np.testing.assert_array_equal(env._buffers.pose, sim.poses())
        ended_seen = 0
        for step in range(14):
            actions = gait_actions(step, 5)
            _, _, terminated, truncated, _ = env.step(actions)
            result = sim.step(actions)
            np.testing.assert_array_equal(env._buffers.pose, sim.poses())
            ended = terminated | truncated
            np.testing.assert_array_equal(ended, result.done)
            np.testing.assert_array_equal(env._buffers.final_pose[ended], sim.final_poses)
            ended_seen += int(ended.sum())
            frames = env.render()
            assert len(frames) == 5 and all(f.shape == (480, 640, 3) for f in frames)
        assert ended_seen >= 5


@pytest.mark.standin
def test_render_needs_poses_or_a_camera(tmp_path):
    spec = {"inputs": [{"name": "obs_0", "shape": [6], "kind": "vector"}],
            "continuous_size": 2, "discrete_branches": [], "behavior": "Flat"}
    with pytest.raises(ValueError, match=re.escape(
            "render_mode='rgb_array' needs the built-in stand-in playing Huggy (which sends its "
            "poses) or a camera sensor (a (C, H, W) observation of 1 or 3 channels); behavior "
            "'Flat?team=0' has (6,) -> 2 continuous and sends no poses")):
        UnityVectorEnv(**env_kwargs(tmp_path), behavior_spec=spec, render_mode="rgb_array")
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array', got 'human'"):
        UnityVectorEnv(**env_kwargs(tmp_path), render_mode="human")


@pytest.mark.standin
def test_camera_frames_are_the_visual_observation(tmp_path):
    spec = {"inputs": [{"name": "obs_0", "shape": [4], "kind": "vector"},
                       {"name": "obs_1", "shape": [3, 16, 16], "kind": "visual"}],
            "continuous_size": 2, "discrete_branches": [], "behavior": "Eyes"}
    with UnityVectorEnv(**env_kwargs(tmp_path), behavior_spec=spec, num_agents=2,
                        render_mode="rgb_array") as env:
        obs, _ = env.reset(seed=1)
        frames = env.render()
        for slot in range(2):
            expected = np.rint(obs[1][slot].transpose(1, 2, 0) * 255).astype(np.uint8)
            np.testing.assert_array_equal(frames[slot][::16, ::16], expected)


@pytest.mark.standin
def test_record_video_on_the_single_env_writes_an_mp4(tmp_path):
    """Gymnasium's RecordVideo (moviepy) on `gymnasium.make(..., render_mode="rgb_array")`:
    one MP4 per recorded episode, one frame per step plus the reset's."""
    import imageio_ffmpeg
    from gymnasium.wrappers import RecordVideo

    env = gymnasium.make("huggy_agent/Huggy-v0", render_mode="rgb_array",
                         **env_kwargs(tmp_path), max_steps=30)
    assert env.metadata["render_fps"] == 12.5
    env = RecordVideo(env, str(tmp_path / "videos"), episode_trigger=lambda e: e == 0,
                      name_prefix="huggy")
    env.reset(seed=2)
    steps, done = 0, False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        steps += 1
        done = terminated or truncated
    last = env.render()
    env.reset()
    env.close()
    path = tmp_path / "videos" / "huggy-episode-0.mp4"
    frames = list(imageio_ffmpeg.read_frames(str(path)))
    assert len(frames) - 1 == steps + 1  # the first item is the metadata
    assert last.shape == (480, 640, 3)


@pytest.mark.standin
def test_single_env_shows_the_last_frame_then_the_next_episode(tmp_path):
    with HuggyEnv(**env_kwargs(tmp_path), render_mode="rgb_array", max_steps=3) as env:
        env.reset(seed=5)
        for _ in range(3):
            _, _, terminated, truncated, _ = env.step(np.zeros(21, np.float32))
        assert truncated and not terminated
        np.testing.assert_array_equal(env.render(),
                                      env.vector_env.render_frame(0, final=True))
        env.reset()
        np.testing.assert_array_equal(env.render(), env.vector_env.render_frame(0))


def test_render_without_a_mode_warns_and_returns_none():
    env = HuggyEnv.__new__(HuggyEnv)
    env.render_mode = None
    with pytest.warns(UserWarning, match="without render_mode"):
        assert env.render() is None
