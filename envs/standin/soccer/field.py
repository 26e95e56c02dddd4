"""The SoccerTwos field, seen from above: its constants and static geometry, taken from ML-Agents'
scene (`Project/Assets/ML-Agents/Examples/Soccer`: `Prefabs/SoccerFieldTwos.prefab`,
`Scenes/SoccerTwos.unity`, `Scripts/*.cs`, `ProjectSettings/TimeManager.asset`).

Coordinates are Unity's, in the ground plane: (x, z) in metres, x along the field (blue's goal at
-x, purple's at +x), z across it. A heading `yaw` (radians) is Unity's rotation about +Y: forward
= (sin yaw, cos yaw), right = (cos yaw, -sin yaw); a positive yaw change turns right. Every body
moves at one height (the scene freezes the agents' and the ball's Y position), so contacts,
kicks and ray hits are planar; the rays' height only sets how wide an agent or the ball looks
to them (`RAY_AGENT_RADIUS`, `RAY_BALL_RADIUS`).

Static pieces (`WALL_*`) are the faces of the scene's boxes seen from above: a centre, a unit
direction along the face, a half-length, the half-thickness of the box behind it, the unit
normal toward the play area, and what it is (a wall, or blue's or purple's goal net). Bodies
only ever meet a face from its play-area side (the corners are closed), so each acts on that
side, along its length. The goal posts, where a corner wall ends at a goal mouth, are that
wall's end faces; the other ends lie behind other pieces or in a net's corner, where its two
faces already hold bodies in.
"""

from __future__ import annotations

import math

import numpy as np

# -- time (ProjectSettings/TimeManager.asset; the agents' DecisionRequester) ----------------------
DT = 0.02
"""Seconds per physics step (Fixed Timestep)."""
DECISION_PERIOD = 5
"""Physics steps per decision (DecisionRequester.DecisionPeriod; actions are repeated between
decisions: TakeActionsBetweenDecisions)."""
MAX_ENVIRONMENT_STEPS = 5000
"""Physics steps after which both groups' episodes are interrupted
(SoccerEnvController.MaxEnvironmentSteps in the field prefab): 1,000 decisions."""

# -- agents (AgentSoccer.cs, position Generic; the prefab's Rigidbody and SphereCollider) --------
AGENT_RADIUS = 0.5
AGENT_MASS = 50.0
AGENT_DRAG = 3.0
RUN_SPEED = 2.0
"""SoccerSettings.agentRunSpeed in SoccerTwos.unity: the velocity change (m/s) per physics step
of a forward move, times the move's speed factor."""
FORWARD_SPEED = 1.0
"""AgentSoccer's m_ForwardSpeed for position Generic (the SoccerTwos agents)."""
LATERAL_SPEED = 0.3
"""AgentSoccer's m_LateralSpeed for position Generic."""
TURN_PER_STEP = math.radians(100.0 * DT)
"""`transform.Rotate(up, Time.deltaTime * 100f)`: 2 degrees per physics step."""
KICK_FORCE = 2000.0
"""AgentSoccer.k_Power: the force (N) put on the ball, for one physics step, when an agent
moving forward starts touching it (OnCollisionEnter)."""
BALL_TOUCH_REWARD = 0.2
"""The individual reward for touching the ball, times the `ball_touch` parameter (default 0)."""

# -- ball (the field prefab's Soccer Ball, Bouncy.physicMaterial) ----------------------------------
BALL_RADIUS = 0.015 * 41.61146
"""Its SphereCollider radius times the object's scale: 0.624 m."""
BALL_MASS = 3.0
BALL_DRAG = 1.0
BOUNCINESS = 0.8
"""The ball's material (bounce combine: maximum), so every contact of the ball bounces with it;
agents and walls have the default material (0: no bounce between them)."""
BODY_HEIGHT = 0.5
"""Height of the agents' and the ball's centres (their Y position is frozen at 0.5)."""

# -- rays (RayPerceptionSensorComponent3D settings on the agents) ---------------------------------
RAY_LENGTH = 20.0
RAY_CAST_RADIUS = 0.5
"""Sphere-cast radius; casts start 0.5 above the agent's centre (start and end offsets 0.5)."""
RAY_HEIGHT = BODY_HEIGHT + 0.5
RAY_AGENT_RADIUS = math.sqrt((AGENT_RADIUS + RAY_CAST_RADIUS) ** 2 - (RAY_HEIGHT - BODY_HEIGHT) ** 2)
"""How far from an agent's centre, in the plane, a cast sphere first touches it: 0.866 m."""
RAY_BALL_RADIUS = math.sqrt((BALL_RADIUS + RAY_CAST_RADIUS) ** 2 - (RAY_HEIGHT - BODY_HEIGHT) ** 2)
"""The same for the ball: 1.007 m."""

# -- field (SoccerFieldTwos.prefab: the Field object is scaled 0.01) -------------------------------
HALF_LENGTH = 15.5
"""The pitch's floor collider spans x in [-15.5, 15.5] (3100 units)."""
GOAL_HALF_WIDTH = 4.25
"""The goal floor boxes (tagged blueGoal / purpleGoal) span |z| <= 4.25, x from 15.5 to 17.5."""
GOAL_LINE = HALF_LENGTH - math.sqrt(BALL_RADIUS**2 - BODY_HEIGHT**2)
"""|x| of the ball's centre at which it touches a goal's floor box (its top is at ground level,
and the ball's centre sits 0.5 above it): 15.13 m. That contact is the goal."""
AGENT_START_X = 3.19 + 5.0
"""AgentSoccer.initialPos: 5 m behind the prefab position (x = -3.19 blue, +3.19 purple); each
reset adds U(-5, 5) to x."""
AGENT_START_Z = (1.2, -1.2)
"""z of a team's first and second agent."""
START_SPREAD_X = 5.0
START_YAW = (math.radians(80.0), math.radians(100.0))
"""Blue starts facing +x with yaw U(80, 100) degrees, purple facing -x with yaw -U(80, 100)."""
BALL_SPREAD = 2.5
"""SoccerEnvController.ResetBall: the ball starts at the centre plus U(-2.5, 2.5) in x and z."""

WALL, BLUE_GOAL, PURPLE_GOAL = 0, 1, 2
"""What a static piece is."""

_WALL_HALF_THICKNESS = 0.4607078 / 2
_SIDE_WALL_Z = 7.75 - 0.011573717  # the Side wall objects at z = 775 units, box centre offset
_CHAMFER_CENTRE = (14.46, 6.41)  # the Wall Angle objects, yaw +-60 degrees, 4.8 m long
_SIN60 = math.sin(math.radians(60.0))


def _pieces() -> list[tuple[float, ...]]:
    """(centre x, centre z, direction x, direction z, half-length, half-thickness, kind, and a
    point of the play area beside the piece, x and z)."""
    pieces: list[tuple[float, ...]] = [
        (0.0, side * _SIDE_WALL_Z, 1.0, 0.0, HALF_LENGTH, _WALL_HALF_THICKNESS, WALL, 0.0, 0.0)
        for side in (1.0, -1.0)]
    for sx in (1.0, -1.0):
        for sz in (1.0, -1.0):
            centre_x, centre_z = sx * _CHAMFER_CENTRE[0], sz * _CHAMFER_CENTRE[1]
            along_x, along_z = 0.5, -_SIN60 * sx * sz
            pieces.append((centre_x, centre_z, along_x, along_z, 2.4, _WALL_HALF_THICKNESS,
                           WALL, 0.0, 0.0))
            # its end at the goal mouth (the post): a face across the wall, facing the mouth
            end = 1.0 if along_z * sz < 0 else -1.0  # the end nearer z = 0
            post_x, post_z = centre_x + end * 2.4 * along_x, centre_z + end * 2.4 * along_z
            pieces.append((post_x, post_z, -along_z, along_x, _WALL_HALF_THICKNESS, 0.0, WALL,
                           post_x + end * along_x, post_z + end * along_z))
    # Goal nets (GoalNetBlue / GoalNetPurple, tagged as their goal): the back box 0.936 m behind
    # the net's centre, and two side boxes at z = +-4.2, each 2 m long and 0.1 m thick.
    for net_x, back_offset, back_half, kind in ((-16.5, -0.9363, 0.0637, BLUE_GOAL),
                                                (16.47, 0.936, 0.05, PURPLE_GOAL)):
        pieces.append((net_x + back_offset, 0.0, 0.0, 1.0, 4.15, back_half, kind, 0.0, 0.0))
        pieces += [(net_x, side * 4.2, 1.0, 0.0, 1.0, 0.05, kind, net_x, 0.0)
                   for side in (1.0, -1.0)]
    return pieces


_TABLE = np.array(_pieces())
WALL_CENTRE = _TABLE[:, 0:2].copy()
"""(pieces, 2) centres of the faces' boxes (of the posts: the corner walls' ends)."""
WALL_DIRECTION = _TABLE[:, 2:4] / np.linalg.norm(_TABLE[:, 2:4], axis=1, keepdims=True)
"""(pieces, 2) unit vectors along each face."""
WALL_HALF_LENGTH = _TABLE[:, 4].copy()
WALL_HALF_THICKNESS = _TABLE[:, 5].copy()
"""How far each face stands in front of its centre line (0 for the posts' end faces)."""
WALL_KIND = _TABLE[:, 6].astype(np.int64)
_PERPENDICULAR = np.stack([-WALL_DIRECTION[:, 1], WALL_DIRECTION[:, 0]], axis=1)
_FACING = np.einsum("ij,ij->i", _TABLE[:, 7:9] - WALL_CENTRE, _PERPENDICULAR)
WALL_NORMAL = _PERPENDICULAR * np.sign(_FACING)[:, None]
"""(pieces, 2) unit normals toward the play area."""
