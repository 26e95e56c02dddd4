"""Names in a scene of several behaviors: mlagents-envs names a behavior `Name?team=T`, and an
agent is `Name?team=T?agent_id=K` as ML-Agents names it. Plain strings, no imports."""

from __future__ import annotations

from collections.abc import Sequence


def agent_name(behavior: str, agent_id: int) -> str:
    """How ML-Agents names an agent.

    Args:
        behavior: the behavior's name, `Name?team=T`.
        agent_id: the agent's id.

    Returns:
        `Name?team=T?agent_id=K`.
    """
    return f"{behavior}?agent_id={agent_id}"


def behavior_of(agent: str) -> str:
    """The behavior of an agent name (`agent_name`'s inverse, first part).

    Args:
        agent: `Name?team=T?agent_id=K`.

    Returns:
        `Name?team=T`.

    Raises:
        ValueError: `agent` has no `?agent_id=` part.
    """
    behavior, separator, _ = agent.rpartition("?agent_id=")
    if not separator:
        raise ValueError(f"expected an agent name such as 'SoccerTwos?team=0?agent_id=3', "
                         f"received {agent!r}")
    return behavior


def team_of(behavior: str) -> int:
    """The team of a behavior name.

    Args:
        behavior: `Name?team=T`, or a name without a team.

    Returns:
        T; 0 where the name has none.
    """
    _, separator, team = behavior.rpartition("?team=")
    return int(team) if separator and team.isdigit() else 0


def resolve_key(key: str, behaviors: Sequence[str]) -> list[str]:
    """The behaviors a `--policy KEY=...` key names.

    Args:
        key: a behavior (`Goalie`, matching every team of it), a behavior with its team
            (`SoccerTwos?team=1`) or a team (`team=1`).
        behaviors: the scene's behaviors.

    Returns:
        The behaviors it names, in the scene's order.

    Raises:
        ValueError: it names none (the message lists the scene's behaviors).
    """
    if key.startswith("team="):
        team = key.split("=", 1)[1]
        found = [b for b in behaviors if team.isdigit() and team_of(b) == int(team)]
    else:
        found = [b for b in behaviors if b == key or b.split("?team=")[0] == key]
    if not found:
        raise ValueError(f"{key!r} names no behavior of this scene; it has {list(behaviors)} "
                         "(name a behavior, Behavior?team=T, or team=T)")
    return found
