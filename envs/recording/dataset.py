"""Minari datasets (Farama's format for offline RL) from recorded episodes: one Minari episode
per counted episode, with the env's single-agent observation and action spaces.

Minari's `DataCollector` wraps one Gymnasium env and has no vector support, so the episodes are
collected by the rollout loop (`EpisodeCollector`), possibly on many runners, and written once
here through Minari's own `create_dataset_from_buffers` (into `$MINARI_DATASETS_PATH`, else
`~/.minari/datasets`). Each episode's Minari metadata holds its agent slot, its index within the
slot and the environment seed of its rollout; the dataset's metadata holds what the caller
passes (policy, environment, seeds, estimator) under "huggy_agent", and the env spec from which
`dataset.recover_environment()` makes the environment again (after `import envs`).

Needs the optional `data` extra (`pip install huggy-agent[data]`: minari with h5py).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from envs.recording.episodes import EpisodeCollector, RecordedEpisode
from envs.registration import ENV_ID, UNITY_ENV_ID


def check_new_dataset(dataset_id: str) -> None:
    """Fail before any work when a Minari dataset cannot be written.

    Args:
        dataset_id: the dataset's id.

    Raises:
        ImportError: Minari is missing (the `data` extra).
        ValueError: the id is not of Minari's form `(namespace/)name-vN`, or a dataset of that id
            is already there (Minari never overwrites one).
    """
    try:
        # the optional data extra, imported only when a dataset is asked for
        from minari.dataset.minari_dataset import DATASET_ID_RE
        from minari.storage import get_dataset_path
    except ImportError:
        raise ImportError("writing a Minari dataset needs Minari: pip install "
                          "'huggy-agent[data]'") from None
    match = DATASET_ID_RE.fullmatch(dataset_id)
    if match is None or match.group("version") is None:
        raise ValueError(f"a Minari dataset id has the form (namespace/)name-vN, such as "
                         f"huggy/ppo-v0; got {dataset_id!r}")
    path = get_dataset_path(dataset_id)
    if path.exists():
        raise ValueError(f"Minari dataset {dataset_id} exists already ({path}); give another "
                         "name or version, or delete it (minari delete)")


def dataset_env_spec(file_name: str | None, behavior_spec: dict | None, **options: Any) -> Any:
    """The Gymnasium `EnvSpec` of one agent of the environment the episodes came from.

    Args:
        file_name: the Unity build (`huggy_agent/Unity-v0`), or None for the built-in stand-in.
        behavior_spec: what the stand-in played (`huggy_agent/Unity-v0`); None with `file_name`
            None: Huggy (`huggy_agent/Huggy-v0`).
        **options: the `UnityVectorEnv` options the episodes were played with (`max_steps`,
            `env_parameters`); empty or None ones are left out.

    Returns:
        The registered spec with those keyword arguments.
    """
    kwargs: dict[str, Any] = {}
    if file_name is not None:
        kwargs["file_name"] = file_name
    elif behavior_spec is not None:
        kwargs["behavior_spec"] = behavior_spec
    base = gymnasium.spec(ENV_ID if not kwargs else UNITY_ENV_ID)
    kwargs.update({key: value for key, value in options.items() if value})
    return dataclasses.replace(base, kwargs={**base.kwargs, **kwargs})


def _buffer(episode: RecordedEpisode, number: int, observation_space: gymnasium.Space,
            action_space: gymnasium.Space) -> Any:
    from minari.data_collector import EpisodeBuffer

    observations: Any = episode.observations
    if not isinstance(observation_space, gymnasium.spaces.Tuple):
        (observations,) = observations
    parts = []
    spaces = (action_space.spaces if isinstance(action_space, gymnasium.spaces.Tuple)
              else (action_space,))
    for space in spaces:
        if isinstance(space, gymnasium.spaces.MultiDiscrete):
            parts.append(episode.discrete.astype(space.dtype))
        else:
            parts.append(episode.continuous.astype(space.dtype))
    actions = tuple(parts) if len(parts) > 1 else parts[0]
    ends = np.zeros(episode.length, dtype=bool)
    ends[-1] = True
    return EpisodeBuffer(
        id=number, observations=observations, actions=actions,
        rewards=episode.rewards.astype(np.float64).tolist(),
        terminations=(ends & episode.terminated).tolist(),
        truncations=(ends & (not episode.terminated)).tolist(), infos={})


def write_minari_dataset(dataset_id: str, episodes: Sequence[RecordedEpisode],
                         observation_space: gymnasium.Space, action_space: gymnasium.Space,
                         *, env_spec: Any = None, metadata: dict[str, Any] | None = None,
                         description: str | None = None, algorithm_name: str | None = None,
                         author: str | None = None) -> Any:
    """Write episodes as a new Minari dataset.

    Args:
        dataset_id: `(namespace/)(env/)name-vN`, new.
        episodes: the episodes, in the order given.
        observation_space: the single-agent observation space.
        action_space: the single-agent action space.
        env_spec: the `EnvSpec` stored as the dataset's env (and eval env), or None.
        metadata: JSON-ready data stored under "huggy_agent".
        description: Minari's description.
        algorithm_name: Minari's algorithm name.
        author: Minari's author.

    Returns:
        The written `minari.MinariDataset`.

    Raises:
        ValueError: no episodes.
    """
    import minari

    if not episodes:
        raise ValueError("no episodes to write")
    buffers = [_buffer(e, n, observation_space, action_space) for n, e in enumerate(episodes)]
    with warnings.catch_warnings():  # optional fields Minari asks for (e-mail, links), and
        # the env spec, which is stored below (Minari would make the env to read it)
        warnings.filterwarnings("ignore", message=".* is set to None", category=UserWarning)
        warnings.filterwarnings("ignore", message="env_spec is None", category=UserWarning)
        dataset = minari.create_dataset_from_buffers(
            dataset_id, buffers, observation_space=observation_space, action_space=action_space,
            algorithm_name=algorithm_name, author=author, description=description,
            data_format="hdf5", jpeg_encoding=False)
    storage = dataset.storage
    extra: dict[str, Any] = {"huggy_agent": metadata or {}}
    if env_spec is not None:
        extra["env_spec"] = extra["eval_env_spec"] = env_spec.to_json()
    storage.update_metadata(extra)
    storage.update_episode_metadata(
        [{"slot": e.slot, "slot_episode": e.index, "env_seed": -1 if e.seed is None else e.seed}
         for e in episodes], range(len(episodes)))
    return minari.load_dataset(dataset_id)


class MinariRecorder(EpisodeCollector):
    """A recorder (`envs.recording.base`) that writes the counted episodes of its slots, in
    (slot, index) order, as a Minari dataset when the rollout ends (nothing when it was
    interrupted); `dataset` is the written `MinariDataset`.

    Args:
        dataset_id: the dataset's id (new).
        **options: `write_minari_dataset`'s keyword arguments.
    """

    def __init__(self, dataset_id: str, **options: Any) -> None:
        super().__init__()
        self.dataset_id, self.options = dataset_id, options
        self.dataset: Any = None

    def start(self, context: Any, obs: Any, infos: dict[str, Any]) -> None:
        """See `Recorder.start`; also keeps the env's single-agent spaces.

        Args:
            context: where the slots are, their quotas and the reset's seed.
            obs: the first observations.
            infos: the reset's infos.
        """
        super().start(context, obs, infos)
        self._spaces = (context.env.single_observation_space, context.env.single_action_space)

    def end(self, result: Any) -> None:
        """Write the dataset, unless the rollout was interrupted.

        Args:
            result: the rollout's result, or None when it was interrupted.
        """
        super().end(result)
        if result is not None:
            self.dataset = write_minari_dataset(self.dataset_id, self.episodes, *self._spaces,
                                                **self.options)
