"""SoccerTwos arenas, vectorized with numpy: two teams of two agents and a ball per arena, the
real scene's rules and timing (see `envs.standin.soccer.field` for its constants, and the
package README for what is modelled and what is left out).

Timing follows Unity's loop, one physics step (0.02 s) at a time. Every agent asks for a
decision every 5th step and repeats its last action on the steps between. A goal or the step
limit ends the episode of all four agents of that arena at the step it happens (their last
observation is taken then), and the arena restarts at once; its new agents stand still until
the next decision step, where they ask for their first decision. So a step report holds either
the agents that finished since the last one, or every agent asking for a decision, or both; an
exchange with finished agents only comes when an episode ends between two decision steps, as
Unity sends one then.

Rewards are `SoccerSim.step`'s; what is random, and how it is seeded, `SoccerSim`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.standin.sim import SeededSim
from envs.standin.soccer import field, rays

AGENTS_PER_ARENA = 4
AGENT_TEAM = np.array([0, 0, 1, 1])
"""Team of each agent of an arena: two blue (team 0, own goal at -x), then two purple."""
BALL = AGENTS_PER_ARENA  # body index of the ball, after the agents
BRANCHES = (3, 3, 3)
"""Discrete actions: forward/back (0 none, 1 forward, 2 back), sideways (0 none, 1 right,
2 left), rotation (0 none, 1 left, 2 right)."""
CONTACT_DISTANCE = 0.02
"""Gap under which two bodies count as touching (PhysX's default contact offsets, 0.01 each)."""

_RADIUS = np.array([field.AGENT_RADIUS] * AGENTS_PER_ARENA + [field.BALL_RADIUS])
_INVERSE_MASS = np.array([1 / field.AGENT_MASS] * AGENTS_PER_ARENA + [1 / field.BALL_MASS])
_RESTITUTION = np.array([0.0] * AGENTS_PER_ARENA + [field.BOUNCINESS])
_DAMPING = 1 - field.DT * np.array([field.AGENT_DRAG] * AGENTS_PER_ARENA + [field.BALL_DRAG])
_FIRST, _SECOND = np.triu_indices(AGENTS_PER_ARENA + 1, k=1)  # the 10 pairs of bodies
_PAIR_RESTITUTION = np.maximum(_RESTITUTION[_FIRST], _RESTITUTION[_SECOND])
_PAIR_REACH = _RADIUS[_FIRST] + _RADIUS[_SECOND]
_PAIR_MASS = 1 / (_INVERSE_MASS[_FIRST] + _INVERSE_MASS[_SECOND])
_INCIDENCE = np.zeros((len(_FIRST), AGENTS_PER_ARENA + 1))  # pair impulse -> body, by sign
_INCIDENCE[np.arange(len(_FIRST)), _FIRST] = -1.0
_INCIDENCE[np.arange(len(_FIRST)), _SECOND] = 1.0
_NX, _NZ = field.WALL_NORMAL.T
_UX, _UZ = field.WALL_DIRECTION.T
_WALL_REACH = field.WALL_HALF_THICKNESS + _RADIUS[:, None]  # (bodies, pieces)
_NORMAL_OFFSET = np.einsum("pd,pd->p", field.WALL_CENTRE, field.WALL_NORMAL) + _WALL_REACH
_ALONG_OFFSET = np.einsum("pd,pd->p", field.WALL_CENTRE, field.WALL_DIRECTION)
_WALL_EXTENT = field.WALL_HALF_LENGTH + _RADIUS[:, None]
"""(bodies, pieces): how far along a face its hold on a body reaches: its length plus the body's
radius, so that corners are closed (square)."""
_KICK = field.KICK_FORCE * field.DT / field.BALL_MASS
"""The ball's velocity change from one kick (m/s)."""
# Tag index of each static piece and body for an agent of team 0 / team 1.
_PIECE_TAG = np.array([[rays.WALL, rays.OWN_GOAL, rays.OPPOSING_GOAL],
                       [rays.WALL, rays.OPPOSING_GOAL, rays.OWN_GOAL]])[:, field.WALL_KIND]
_BODY_TAG = np.array([[rays.TEAMMATE, rays.TEAMMATE, rays.OPPONENT, rays.OPPONENT, rays.BALL],
                      [rays.OPPONENT, rays.OPPONENT, rays.TEAMMATE, rays.TEAMMATE, rays.BALL]])
_RAY_RADIUS = np.array([field.RAY_AGENT_RADIUS] * AGENTS_PER_ARENA + [field.RAY_BALL_RADIUS])


@dataclass
class SoccerConfig:
    """What the EnvironmentParameters side channel can set (applied at the next reset)."""

    num_arenas: int = 32
    """Fields in the process, each with four agents (ML-Agents' scene holds 8; 32 share the
    simulation's fixed cost per step well, see bench/bench_soccer.py)."""
    max_environment_steps: int = field.MAX_ENVIRONMENT_STEPS
    """Physics steps (5 per decision) after which an arena's episode is interrupted, and the
    denominator of the goal reward's time penalty."""
    ball_touch: float = 0.0
    """Individual reward coefficient for touching the ball (the scene's `ball_touch`
    environment parameter; each touch gives 0.2 times it)."""

    def validated(self) -> SoccerConfig:
        """This configuration, checked, with whole numbers where fields count.

        Returns:
            A new configuration.

        Raises:
            ValueError: `num_arenas` or `max_environment_steps` below 1, or `ball_touch` not finite.
        """
        if int(self.num_arenas) < 1:
            raise ValueError(f"num_arenas must be >= 1, got {self.num_arenas}")
        if int(self.max_environment_steps) < 1:
            raise ValueError(f"max_environment_steps must be >= 1, got "
                             f"{self.max_environment_steps}")
        if not np.isfinite(self.ball_touch):
            raise ValueError(f"ball_touch must be finite, got {self.ball_touch}")
        return SoccerConfig(int(self.num_arenas), int(self.max_environment_steps),
                            float(self.ball_touch))


@dataclass
class SoccerReport:
    """The agents one exchange reports, one row each: first those whose episode ended since
    the last report (`done`), then, on a decision step, every agent asking for a decision.
    Slots are `arena * 4 + agent` (agents 0-1 blue, 2-3 purple)."""

    slot: np.ndarray  # (m,) int64
    agent_id: np.ndarray  # (m,) int64
    reward: np.ndarray  # (m,) float32, individual
    group_id: np.ndarray  # (m,) int64
    group_reward: np.ndarray  # (m,) float32
    done: np.ndarray  # (m,) bool
    interrupted: np.ndarray  # (m,) bool: done at the step limit
    obs: np.ndarray  # (m, 336) float32: obs_0 (264) then obs_1 (72)

    @property
    def team(self) -> np.ndarray:
        """(m,) team of each row."""
        return AGENT_TEAM[self.slot % AGENTS_PER_ARENA]


def _target(gap: np.ndarray, closing: np.ndarray, restitution: np.ndarray) -> np.ndarray:
    """The least separating normal velocity each contact allows after the solve: bodies already
    touching bounce with `restitution`, bodies that would meet within the step stop where they
    meet (speculative contacts: nothing passes through anything), and overlapping ones move
    apart within the step."""
    speculative = -gap / field.DT
    return np.where(gap <= CONTACT_DISTANCE, np.maximum(-restitution * closing, speculative),
                    speculative)


def _concat(reports: list[SoccerReport]) -> SoccerReport:
    return SoccerReport(*(np.concatenate([getattr(r, name) for r in reports])
                          for name in SoccerReport.__dataclass_fields__))


class SoccerSim(SeededSim):
    """`num_arenas` SoccerTwos fields; `reset()` then `step(actions)` once per exchange.

    State (arenas first; bodies 0-3 are the agents, 4 the ball): `pos` and `vel` (2, arenas, 5)
    x and z components of positions and velocities, `yaw` (arenas, 4) headings, `timer`
    (arenas,) physics steps since each arena's reset, `awaiting` (slots,) the agents the last
    report asked for a decision.

    Random: each arena's start positions at each of its resets, from a stream of its own: each
    agent's start x offset U(-5, 5), then each agent's heading U(80, 100) degrees (mirrored for
    purple), then the ball's x and z offsets U(-2.5, 2.5). The arenas' streams are drawn from the
    simulation's seed at every reset of the whole simulation; `seed_next_episode(arena, seed)`
    replaces an arena's stream for its next episode (a tournament's match seed). Nothing else is
    random, and arenas never affect each other: the same seeds and the same actions give the same
    episodes, and an arena's episodes depend only on its own stream and actions.

    Args:
        config: the scene's settings; None: the defaults.
        seed: the simulation's seed.
        arena_seeds: {arena: seed} for the first episodes of some arenas (as
            `seed_next_episode`).

    Raises:
        ValueError: a configuration `SoccerConfig.validated` refuses.
    """

    def __init__(self, config: SoccerConfig | None = None, seed: int = 0,
                 arena_seeds: dict[int, int] | None = None) -> None:
        self.next_seeds = dict(arena_seeds or {})
        super().__init__(config or SoccerConfig(), seed)

    def seed_next_episode(self, arena: int, seed: int) -> None:
        """Start the next episode of an arena from a seed of its own (at its next restart, or the next
        reset): its start positions then depend on `seed` alone.

        Args:
            arena: the arena.
            seed: the episode's seed.
        """
        self.next_seeds[arena] = seed

    @property
    def num_agents(self) -> int:
        return AGENTS_PER_ARENA * self.config.num_arenas

    def reset(self, config: SoccerConfig | None = None) -> SoccerReport:
        """New episodes in every arena (new agent ids); every agent asks for a decision. The report is
        also kept as `opening` (the constructor resets once).

        Args:
            config: a new configuration to apply first, or None.

        Returns:
            The report: every agent asking for its first decision.

        Raises:
            ValueError: a configuration `SoccerConfig.validated` refuses.
        """
        if config is not None:
            self.config = config.validated()
        a = self.config.num_arenas
        self.pos = np.zeros((2, a, AGENTS_PER_ARENA + 1))
        self.vel = np.zeros((2, a, AGENTS_PER_ARENA + 1))
        self.yaw = np.zeros((a, AGENTS_PER_ARENA))
        self.actions = np.zeros((a, AGENTS_PER_ARENA, len(BRANCHES)), dtype=np.int64)
        self.touching = np.zeros((a, AGENTS_PER_ARENA), dtype=bool)
        self.kick = np.zeros((2, a))
        self.timer = np.zeros(a, dtype=np.int64)
        self.agent_id = np.zeros((a, AGENTS_PER_ARENA), dtype=np.int64)
        self.reward = np.zeros((a, AGENTS_PER_ARENA))
        self.group_id = 1 + 2 * np.arange(a)[:, None] + AGENT_TEAM[None, :]
        self.stack = rays.FrameStack(a * AGENTS_PER_ARENA)
        self.academy_step = 0
        # One stream per arena, so that an arena's episodes depend on its stream alone.
        self.arena_rng = [np.random.default_rng(seed)
                          for seed in self.rng.integers(2**63, size=a).tolist()]
        self._restart(np.arange(a))
        self.awaiting = np.arange(self.num_agents)
        self.opening = self._decisions()
        return self.opening

    def _restart(self, arenas: np.ndarray) -> None:
        """Start new episodes in `arenas` (sorted): ResetScene's placement, new agent ids, no
        stored actions, empty frame stacks, the step counter at 0."""
        k = len(arenas)
        slots = (arenas[:, None] * AGENTS_PER_ARENA + np.arange(AGENTS_PER_ARENA)).ravel()
        offsets, headings, ball = (np.empty((k, AGENTS_PER_ARENA)), np.empty((k, AGENTS_PER_ARENA)),
                                   np.empty((k, 2)))
        for row, arena in enumerate(arenas.tolist()):
            if arena in self.next_seeds:
                self.arena_rng[arena] = np.random.default_rng(self.next_seeds.pop(arena))
            rng = self.arena_rng[arena]
            offsets[row] = rng.uniform(-field.START_SPREAD_X, field.START_SPREAD_X,
                                       AGENTS_PER_ARENA)
            headings[row] = rng.uniform(*field.START_YAW, AGENTS_PER_ARENA)
            ball[row] = rng.uniform(-field.BALL_SPREAD, field.BALL_SPREAD, 2)
        side = np.where(AGENT_TEAM == 0, -1.0, 1.0)  # blue starts at -x facing +x
        self.pos[0, arenas, :AGENTS_PER_ARENA] = side * field.AGENT_START_X + offsets
        self.pos[1, arenas, :AGENTS_PER_ARENA] = np.tile(field.AGENT_START_Z, 2)
        self.pos[:, arenas, BALL] = ball.T
        self.yaw[arenas] = -side * headings
        self.vel[:, arenas] = 0.0
        self._set_actions(slots, np.zeros((len(slots), len(BRANCHES)), dtype=np.int64))
        self.touching[arenas] = False
        self.kick[:, arenas] = 0.0
        self.timer[arenas] = 0
        self.reward[arenas] = 0.0
        self.agent_id[arenas] = self._next_id + np.arange(k * AGENTS_PER_ARENA).reshape(k, -1)
        self._next_id += k * AGENTS_PER_ARENA
        self.stack.clear(slots)

    def step(self, actions: np.ndarray) -> SoccerReport:
        """Apply the deciding agents' actions and run physics steps until the next report.

        Rewards (`SoccerEnvController.GoalTouched`, `AgentSoccer`): a goal gives the scoring team's
        group 1 - t / max_environment_steps (t: physics steps since the arena's reset) and the other
        group -1, as group rewards, and ends both groups' episodes (terminal); at the step limit both
        are interrupted (group reward 0). The only individual reward is `ball_touch * 0.2` each time
        an agent starts touching the ball (0 by default, as in the scene).

        Args:
            actions: (slots, 3) integers; only the rows of `awaiting` agents are read, the others
                keep their stored actions; a value outside its branch means no move there.

        Returns:
            The report: the agents whose episode ended since the last one, then, on a decision step,
                every agent asking for a decision.

        Raises:
            ValueError: actions of another shape.
        """
        actions = np.asarray(actions)
        if actions.shape != (self.num_agents, len(BRANCHES)):
            raise ValueError(f"expected actions of shape {(self.num_agents, len(BRANCHES))}, "
                             f"got {actions.shape}")
        if len(self.awaiting):
            chosen = actions[self.awaiting].astype(np.int64)
            # Unity's `switch` ignores a value outside a branch: no move on that branch.
            self._set_actions(self.awaiting, np.where(
                (chosen >= 0) & (chosen < np.array(BRANCHES)), chosen, 0))
        finished: list[SoccerReport] = []
        while True:
            self.academy_step += 1
            self._act()
            self.timer += 1
            over = np.flatnonzero(self.timer >= self.config.max_environment_steps)
            if len(over):
                finished.append(self._end(over, np.zeros((len(over), 2)), interrupted=True))
            scored = self._physics()  # (arenas,) -1, or the team that scored
            goals = np.flatnonzero(scored >= 0)
            if len(goals):
                penalty = self.timer[goals] / self.config.max_environment_steps
                winner = scored[goals]
                group_reward = np.where(np.arange(2)[None, :] == winner[:, None],
                                        1.0 - penalty[:, None], -1.0)
                finished.append(self._end(goals, group_reward, interrupted=False))
            if finished or self.academy_step % field.DECISION_PERIOD == 0:
                break
        if self.academy_step % field.DECISION_PERIOD:
            self.awaiting = np.zeros(0, dtype=np.int64)
            return _concat(finished)
        self.awaiting = np.arange(self.num_agents)
        return _concat([*finished, self._decisions()])

    def _set_actions(self, rows: np.ndarray, chosen: np.ndarray) -> None:
        """Store actions (len(rows), 3) for agent slots `rows`, and their move factors."""
        self.actions.reshape(-1, len(BRANCHES))[rows] = chosen
        forward_axis, right_axis, turn = (self.actions[..., k] for k in range(3))
        self._forward = ((forward_axis == 1) * 1.0 - (forward_axis == 2)) * field.FORWARD_SPEED
        self._lateral = ((right_axis == 1) * 1.0 - (right_axis == 2)) * field.LATERAL_SPEED
        self._sideways = right_axis > 0
        self._turn = ((turn == 2) * 1.0 - (turn == 1)) * field.TURN_PER_STEP

    def _act(self) -> None:
        """MoveAgent for every agent with its stored action: a velocity change (a sideways
        move replaces the forward one, as in AgentSoccer), then the turn."""
        sin, cos = np.sin(self.yaw), np.cos(self.yaw)
        # forward = (sin yaw, cos yaw), right = (cos yaw, -sin yaw)
        self.vel[0, :, :BALL] += np.where(self._sideways, self._lateral * cos,
                                          self._forward * sin) * field.RUN_SPEED
        self.vel[1, :, :BALL] += np.where(self._sideways, -self._lateral * sin,
                                          self._forward * cos) * field.RUN_SPEED
        self.yaw += self._turn

    def _physics(self) -> np.ndarray:
        """One physics step of every arena; (arenas,) the team whose goal the ball reached this
        step (0: blue scored at +x, 1: purple scored at -x), else -1."""
        self.vel[:, :, BALL] += self.kick
        self.kick[:] = 0.0
        self.vel *= _DAMPING
        self._solve_contacts()
        self.pos += self.vel * field.DT
        # OnCollisionEnter between an agent and the ball: a kick when the agent moves forward
        # (AgentSoccer's kick power), applied on the next step, and the ball-touch reward.
        x, z = self.pos
        ox, oz = x[:, BALL:] - x[:, :BALL], z[:, BALL:] - z[:, :BALL]
        distance = np.sqrt(ox * ox + oz * oz)
        touching = distance <= field.AGENT_RADIUS + field.BALL_RADIUS + CONTACT_DISTANCE
        started = touching & ~self.touching
        self.touching = touching
        if started.any():
            power = (started & (self.actions[..., 0] == 1)) * _KICK / np.maximum(distance, 1e-9)
            self.kick[0] += (power * ox).sum(axis=1)
            self.kick[1] += (power * oz).sum(axis=1)
            self.reward += field.BALL_TOUCH_REWARD * self.config.ball_touch * started
        ball_x = x[:, BALL]
        return np.where(ball_x >= field.GOAL_LINE, 0, np.where(ball_x <= -field.GOAL_LINE, 1, -1))

    def _solve_contacts(self) -> None:
        """Velocity-level contacts (see `_target`): between bodies, every pair at once from the
        same velocities; then against the static pieces' faces, from the velocities the pairs
        left, so that no push between bodies takes one into a wall."""
        (x, z), (vx, vz) = self.pos, self.vel
        # pairs of bodies
        nx, nz = x[:, _SECOND] - x[:, _FIRST], z[:, _SECOND] - z[:, _FIRST]
        distance = np.sqrt(nx * nx + nz * nz)
        inverse = 1 / np.maximum(distance, 1e-9)
        nx *= inverse
        nz *= inverse
        closing = (vx[:, _SECOND] - vx[:, _FIRST]) * nx + (vz[:, _SECOND] - vz[:, _FIRST]) * nz
        gap = distance - _PAIR_REACH
        target = _target(gap, closing, _PAIR_RESTITUTION)
        impulse = np.maximum(target - closing, 0.0) * _PAIR_MASS  # to the second body
        # Summed, not multiplied through BLAS: an arena's result then never depends on how many
        # arenas the arrays hold.
        vx += (impulse[..., None] * nx[..., None] * _INCIDENCE).sum(axis=1) * _INVERSE_MASS
        vz += (impulse[..., None] * nz[..., None] * _INCIDENCE).sum(axis=1) * _INVERSE_MASS
        # static pieces: their play-area faces
        x3, z3 = x[..., None], z[..., None]
        height = x3 * _NX + z3 * _NZ - _NORMAL_OFFSET  # (A, bodies, pieces)
        along = x3 * _UX + z3 * _UZ - _ALONG_OFFSET
        closing = vx[..., None] * _NX + vz[..., None] * _NZ
        target = _target(height, closing, _RESTITUTION[:, None])
        # A face holds bodies in front of it, along its length, and those it has let in by
        # less than their radius; not those far behind its plane (beside a post, say).
        held = (np.abs(along) <= _WALL_EXTENT) & (height > -_RADIUS[:, None])
        push = np.where(held, np.maximum(target - closing, 0.0), 0.0)
        vx += (push * _NX).sum(axis=2)
        vz += (push * _NZ).sum(axis=2)

    def _observe(self, slots: np.ndarray) -> np.ndarray:
        """Cast the rays of agents `slots` and push the frames onto their stacks; their stacked
        observations (len(slots), 336)."""
        arena, agent = np.divmod(slots, AGENTS_PER_ARENA)
        team = AGENT_TEAM[agent]
        x, z = self.pos
        distance, tag = rays.cast(x[arena, agent], z[arena, agent], self.yaw[arena, agent],
                                  x[arena], z[arena], _RAY_RADIUS, _BODY_TAG[team],
                                  _PIECE_TAG[team])
        return self.stack.push(slots, rays.encode(distance, tag))

    def _report(self, slots: np.ndarray, group_reward: np.ndarray, done: bool,
                interrupted: bool) -> SoccerReport:
        arena, agent = np.divmod(slots, AGENTS_PER_ARENA)
        report = SoccerReport(slots, self.agent_id[arena, agent].copy(),
                              self.reward[arena, agent].astype(np.float32),
                              self.group_id[arena, agent], group_reward.astype(np.float32),
                              np.full(len(slots), done), np.full(len(slots), interrupted),
                              self._observe(slots))
        self.reward[arena, agent] = 0.0
        return report

    def _decisions(self) -> SoccerReport:
        slots = np.arange(self.num_agents)
        return self._report(slots, np.zeros(len(slots)), done=False, interrupted=False)

    def _end(self, arenas: np.ndarray, team_reward: np.ndarray, interrupted: bool
             ) -> SoccerReport:
        """End the episodes of `arenas` ((k, 2) group reward per team) and restart them."""
        slots = (arenas[:, None] * AGENTS_PER_ARENA + np.arange(AGENTS_PER_ARENA)).ravel()
        report = self._report(slots, team_reward[:, AGENT_TEAM].ravel(), done=True,
                              interrupted=interrupted)
        self._restart(arenas)
        return report
