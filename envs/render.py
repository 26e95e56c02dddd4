"""Frames of Unity agents for people: drawn from the stand-in's Huggy poses, or taken from a
camera observation.

- `huggy_frame(pose, trail, overlay)`: one dog from its pose (`envs.standin.poses`), 640x480 RGB.
  Left, the arena from above: the floor with a 1 m grid, the stick and the reach that ends the
  episode, the trail of the dog's recent positions, the dog (body foreshortened by its pitch,
  head, legs swung fore and aft, feet dark where they touch the ground). Right, a panel: the
  overlay text (behavior, policy, step, return) and the dog in profile, body pitched, each leg's
  upper and lower part in its joint angles, near legs dark and far legs pale.
- `visual_frame(image)`: a (C, H, W) observation in [0, 1] with 1 or 3 channels as (H, W, 3)
  uint8, scaled up to at least 256 pixels high.
- `SlotTracks`: what a frame needs beyond one step: each slot's episode return, length, trail,
  and the same for the episode that just ended.

Everything is a pure function of the state handed in: nothing here steps or reads an env.
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from envs.standin import poses as pose

WIDTH, HEIGHT = 640, 480  # even sizes: H.264 in yuv420p needs them
ARENA_PX = 480  # the square arena view on the left; the panel takes the rest
TRAIL_LENGTH = 240
"""Positions kept per slot for the trail (about 19 s of Huggy's decisions)."""
STICK_REACH = 1.5  # metres: the stand-in ends an episode within this distance of the stick
_MARGIN_M = 0.8  # floor shown around the arena

_GRASS = (118, 160, 92)
_FLOOR = (214, 198, 160)
_GRID = (198, 180, 140)
_WALL = (92, 74, 52)
_PANEL = (34, 38, 46)
_TEXT = (236, 236, 236)
_MUTED = (160, 166, 176)
_FUR = (196, 124, 58)
_FUR_DARK = (120, 70, 30)
_FAR_LEG = (222, 176, 128)
_NEAR_LEG = (110, 62, 24)
_STICK = (112, 72, 30)
_REACH = (170, 132, 80)
_TRAIL = ((232, 222, 196), (196, 176, 214), (150, 120, 200), (96, 60, 180))  # old to new
_GROUND = (150, 132, 96)

# Legs: 0 front left, 1 front right, 2 back left, 3 back right (as the simulation's).
_FRONT = np.array([1.0, 1.0, -1.0, -1.0])
_LEFT = np.array([1.0, -1.0, 1.0, -1.0])
_MIRROR = np.array([1.0, -1.0, 1.0, -1.0])  # upper leg Y -> fore-aft swing (+ = foot forward)
_BODY_HALF_LENGTH, _BODY_HALF_WIDTH = 0.55, 0.26
_HIP_FORE, _HIP_SIDE = 0.42, 0.2
_SWING_RAD = 1.1  # leg angle from vertical per unit of swing


@dataclass(frozen=True)
class Overlay:
    """The text of a frame: which agent and policy, where in its episode, and how it ended."""

    behavior: str = "Huggy"
    label: str | None = None
    """The policy's name (a file, a run, hf://...)."""
    step: int = 0
    """Decisions so far in the episode."""
    episode_return: float = 0.0
    slot: int | None = None
    ended: str | None = None
    """How the episode ended, on its last frame ("reached the stick", "max steps"), else None."""


@functools.lru_cache(maxsize=4)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


@functools.lru_cache(maxsize=4096)
def _text_stamp(text: str, size: int, color: tuple[int, int, int]) -> Image.Image:
    """`text` drawn once onto a transparent image, to paste: far cheaper than drawing it again
    (step numbers and returns repeat from frame to frame)."""
    font = _font(size)
    left, top, right, bottom = font.getbbox(text)
    stamp = Image.new("RGBA", (max(1, int(right)), max(1, int(bottom))), (0, 0, 0, 0))
    ImageDraw.Draw(stamp).text((0, 0), text, fill=color, font=font)
    return stamp


def _stamp(image: Image.Image, xy: tuple[int, int], text: str, size: int,
           color: tuple[int, int, int] = _TEXT) -> None:
    stamp = _text_stamp(text, size, color)
    image.paste(stamp, xy, stamp)


@functools.lru_cache(maxsize=16)
def _background(half_width: float, behavior: str, label: str | None, slot: int | None
                ) -> Image.Image:
    """The static part of a frame: floor, grid, walls and scale bar for an arena of
    `half_width` metres, and the panel's fixed text (drawn once per arena, name and slot)."""
    image = _arena_background(half_width).copy()
    draw = ImageDraw.Draw(image)
    left, y = ARENA_PX + 10, 10
    draw.text((left, y), behavior, fill=_TEXT, font=_font(18))
    y += 26
    if label:
        for line in _wrap(label, 19)[:3]:
            draw.text((left, y), line, fill=_MUTED, font=_font(12))
            y += 15
    y += 8
    for name in ("step", "return", "to stick"):
        draw.text((left, y), name, fill=_MUTED, font=_font(13))
        y += 24
    if slot is not None:
        draw.text((left, y), f"agent slot {slot}", fill=_MUTED, font=_font(13))
    draw.text((left, _STRENGTH_TOP - 20), "joint strength", fill=_MUTED, font=_font(12))
    for leg, name in enumerate(("FL", "FR", "BL", "BR")):
        draw.text((left + 36 * leg + 4, _STRENGTH_TOP + _STRENGTH_HEIGHT + 3), name,
                  fill=_MUTED, font=_font(11))
    return image


_STRENGTH_TOP, _STRENGTH_HEIGHT = 210, 44  # the joint strength bars in the panel


def _draw_strength(draw: ImageDraw.ImageDraw, strength: np.ndarray) -> None:
    """Eight bars, upper and lower part of each leg, as high as the joint's strength."""
    left = ARENA_PX + 10
    bottom = _STRENGTH_TOP + _STRENGTH_HEIGHT
    for joint, value in enumerate(np.clip(strength, 0.0, 1.0).tolist()):
        x = left + 36 * (joint // 2) + 15 * (joint % 2)
        draw.rectangle((x, _STRENGTH_TOP, x + 11, bottom), outline=(70, 76, 88))
        draw.rectangle((x, bottom - value * _STRENGTH_HEIGHT, x + 11, bottom),
                       fill=_FAR_LEG if joint % 2 else _FUR)


def _value_rows(label: str | None) -> int:
    """The y of the first value row in the panel (below the name and the label's lines)."""
    return 44 + (15 * len(_wrap(label, 19)[:3]) if label else 0)


@functools.lru_cache(maxsize=8)
def _arena_background(half_width: float) -> Image.Image:
    """The arena part of a frame for an arena of `half_width` metres: floor, grid, walls,
    scale bar, empty panel (drawn once per arena size)."""
    image = Image.new("RGB", (WIDTH, HEIGHT), _PANEL)
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, ARENA_PX - 1, HEIGHT - 1), fill=_GRASS)
    view = _ArenaView(half_width)
    low, high = view.point(-half_width, half_width), view.point(half_width, -half_width)
    draw.rectangle((*low, *high), fill=_FLOOR)
    for metre in range(-int(half_width), int(half_width) + 1):
        x0, y0 = view.point(metre, half_width)
        x1, y1 = view.point(metre, -half_width)
        draw.line((x0, y0, x1, y1), fill=_GRID)
        x0, y0 = view.point(-half_width, metre)
        x1, y1 = view.point(half_width, metre)
        draw.line((x0, y0, x1, y1), fill=_GRID)
    draw.rectangle((*low, *high), outline=_WALL, width=3)
    bar = view.scale  # one metre
    draw.line((12, HEIGHT - 14, 12 + bar, HEIGHT - 14), fill=_TEXT, width=3)
    draw.text((16 + bar, HEIGHT - 22), "1 m", fill=_TEXT, font=_font(12))
    panel = ARENA_PX
    draw.line((panel, 0, panel, HEIGHT), fill=(18, 20, 24), width=2)
    draw.text((panel + 10, 286), "side view", fill=_MUTED, font=_font(12))
    return image


class _ArenaView:
    """World floor coordinates (x, z) in metres -> pixels of the arena view (z up)."""

    def __init__(self, half_width: float) -> None:
        self.half = half_width + _MARGIN_M
        self.scale = ARENA_PX / (2 * self.half)

    def point(self, x: float, z: float) -> tuple[float, float]:
        return (x + self.half) * self.scale, (self.half - z) * self.scale

    def points(self, xz: np.ndarray) -> list[tuple[float, float]]:
        """(k, 2) world points -> pixel tuples."""
        px = (xz[:, 0] + self.half) * self.scale
        py = (self.half - xz[:, 1]) * self.scale
        return list(zip(px.tolist(), py.tolist(), strict=True))


def huggy_frame(state: np.ndarray, trail: np.ndarray, overlay: Overlay) -> np.ndarray:
    """The frame of one dog.

    Args:
        state: its pose row (`envs.standin.poses.POSE_SIZE` values).
        trail: its recent floor positions (k, 2), oldest first.
        overlay: the text drawn over the frame.

    Returns:
        A (480, 640, 3) uint8 frame.

    Raises:
        ValueError: `state` is not one pose row.
    """
    state = np.asarray(state, dtype=np.float64)
    if state.shape != (pose.POSE_SIZE,):
        raise ValueError(f"expected a pose of {pose.POSE_SIZE} values, got shape {state.shape}")
    half_width = float(state[pose.ARENA])
    image = _canvas()
    image.paste(_background(half_width, overlay.behavior, overlay.label, overlay.slot))
    draw = ImageDraw.Draw(image)
    view = _ArenaView(half_width)
    _draw_stick(draw, view, state[pose.STICK])
    _draw_trail(draw, view, np.asarray(trail, dtype=np.float64).reshape(-1, 2))
    _draw_dog_from_above(draw, view, state)
    y = _value_rows(overlay.label)
    _stamp(image, (ARENA_PX + 70, y - 2), f"{overlay.step}", 16)
    _stamp(image, (ARENA_PX + 70, y + 22), f"{overlay.episode_return:+.3f}", 16)
    to_stick = np.hypot(*(state[pose.STICK] - state[pose.POSITION][[0, 2]]))
    _stamp(image, (ARENA_PX + 70, y + 46), f"{to_stick:.1f} m", 16)
    _draw_strength(draw, state[pose.STRENGTH])
    _draw_profile(draw, image, state)
    if overlay.ended:
        _banner(draw, image, overlay.ended)
    return np.asarray(image)


_canvases = threading.local()


def _canvas() -> Image.Image:
    """This thread's image to draw frames on: reused, since a fresh one per frame costs more
    (memory from the system each time) than drawing it."""
    canvas = getattr(_canvases, "image", None)
    if canvas is None:
        canvas = _canvases.image = Image.new("RGB", (WIDTH, HEIGHT))
    return canvas


def _draw_stick(draw: ImageDraw.ImageDraw, view: _ArenaView, stick: np.ndarray) -> None:
    x, z = float(stick[0]), float(stick[1])
    cx, cy = view.point(x, z)
    reach = STICK_REACH * view.scale
    draw.ellipse((cx - reach, cy - reach, cx + reach, cy + reach), outline=_REACH, width=1)
    half = 0.45 * view.scale
    draw.line((cx - half, cy + 0.35 * half, cx + half, cy - 0.35 * half), fill=_STICK,
              width=max(4, int(0.12 * view.scale)))


def _draw_trail(draw: ImageDraw.ImageDraw, view: _ArenaView, trail: np.ndarray) -> None:
    """The trail in four shades, older parts paler (one line call per shade)."""
    if len(trail) < 2:
        return
    points = view.points(trail)
    chunks = np.array_split(np.arange(len(points)), len(_TRAIL))
    for color, chunk in zip(_TRAIL, chunks, strict=True):
        if len(chunk):
            segment = points[chunk[0] : chunk[-1] + 2]  # overlap one point: no gaps
            if len(segment) >= 2:
                draw.line(segment, fill=color, width=3, joint="curve")


def _draw_dog_from_above(draw: ImageDraw.ImageDraw, view: _ArenaView, state: np.ndarray) -> None:
    x, _, z = state[pose.POSITION]
    yaw, pitch = float(state[pose.YAW]), float(state[pose.PITCH])
    forward = np.array([np.sin(yaw), np.cos(yaw)])
    right = np.array([np.cos(yaw), -np.sin(yaw)])
    centre = np.array([x, z])
    joints = state[pose.JOINTS]
    swing = (joints[4:8] - 0.5) * _MIRROR
    feet_down = state[pose.FEET_DOWN] > 0.5
    scale = view.scale
    for leg in range(4):
        hip = centre + forward * _FRONT[leg] * _HIP_FORE - right * _LEFT[leg] * _HIP_SIDE
        reach = 0.55 * np.sin(_SWING_RAD * swing[leg])
        foot = hip + forward * reach - right * _LEFT[leg] * 0.08
        (hx, hy), (fx, fy) = view.points(np.stack([hip, foot]))
        draw.line((hx, hy, fx, fy), fill=_NEAR_LEG, width=max(2, int(0.1 * scale)))
        r = max(2.0, 0.07 * scale)
        draw.ellipse((fx - r, fy - r, fx + r, fy + r),
                     fill=_NEAR_LEG if feet_down[leg] else _FAR_LEG, outline=_NEAR_LEG)
    half_length = _BODY_HALF_LENGTH * max(0.35, np.cos(pitch))  # seen from above, pitched
    angles = np.linspace(0, 2 * np.pi, 20, endpoint=False)
    outline = (centre[None] + np.outer(np.cos(angles) * half_length, forward)
               + np.outer(np.sin(angles) * _BODY_HALF_WIDTH, right))
    draw.polygon(view.points(outline), fill=_FUR, outline=_FUR_DARK)
    head = centre + forward * (half_length + 0.12)
    hx, hy = view.point(*head)
    r = 0.2 * scale
    draw.ellipse((hx - r, hy - r, hx + r, hy + r), fill=_FUR, outline=_FUR_DARK)
    nose = head + forward * 0.2
    nx, ny = view.point(*nose)
    r = max(1.5, 0.06 * scale)
    draw.ellipse((nx - r, ny - r, nx + r, ny + r), fill=(30, 20, 16))


def _draw_profile(draw: ImageDraw.ImageDraw, image: Image.Image, state: np.ndarray) -> None:
    """The dog seen from its left side, facing right, standing on the ground line."""
    scale = 70.0  # pixels per metre
    ground_y, centre_x = 440.0, ARENA_PX + 80.0
    height, pitch = float(state[pose.POSITION][1]), float(state[pose.PITCH])
    joints = state[pose.JOINTS]
    feet_down = state[pose.FEET_DOWN] > 0.5
    axis = np.array([np.cos(pitch), np.sin(pitch)])  # along the body, nose first (x right, y up)
    normal = np.array([-axis[1], axis[0]])
    body = np.array([0.0, height])

    def px(point: np.ndarray) -> tuple[float, float]:
        return centre_x + point[0] * scale, ground_y - point[1] * scale

    draw.line((ARENA_PX + 6, ground_y, WIDTH - 6, ground_y), fill=_GROUND, width=2)
    swing = (joints[4:8] - 0.5) * _MIRROR
    extension = 0.6 * joints[8:12] + 0.4 * joints[0:4]

    def leg(index: int, color: tuple[int, int, int]) -> None:
        hip = body + axis * _FRONT[index] * _HIP_FORE - normal * 0.12
        # As long as the simulation's standing height says (0.3 m + extension) less the hip's
        # offset, so a standing dog's feet meet the ground.
        length = 0.2 + extension[index]
        upper_angle = _SWING_RAD * swing[index]  # from straight down, + = forward
        bend = 0.8 * (1.0 - joints[8 + index]) * -_FRONT[index]  # front knees bend back
        knee = hip + length / 2 * np.array([np.sin(upper_angle), -np.cos(upper_angle)])
        lower_angle = upper_angle + bend
        foot = knee + length / 2 * np.array([np.sin(lower_angle), -np.cos(lower_angle)])
        draw.line((*px(hip), *px(knee), *px(foot)), fill=color, width=7, joint="curve")
        fx, fy = px(foot)
        r = 4
        draw.ellipse((fx - r, fy - r, fx + r, fy + r),
                     fill=_NEAR_LEG if feet_down[index] else _FAR_LEG, outline=color)

    for index in (1, 3):  # the far (right) legs, behind the body
        leg(index, _FAR_LEG)
    corners = [body + axis * a * _BODY_HALF_LENGTH + normal * b * 0.17
               for a, b in ((-1, -1), (1, -1), (1, 1), (-1, 1))]
    draw.polygon([px(c) for c in corners], fill=_FUR, outline=_FUR_DARK)
    head = body + axis * (_BODY_HALF_LENGTH + 0.12) + normal * 0.22
    hx, hy = px(head)
    r = 0.19 * scale
    draw.ellipse((hx - r, hy - r, hx + r, hy + r), fill=_FUR, outline=_FUR_DARK)
    snout = head + axis * 0.2 - normal * 0.04
    sx, sy = px(snout)
    draw.ellipse((sx - 5, sy - 5, sx + 5, sy + 5), fill=(30, 20, 16))
    tail = body - axis * _BODY_HALF_LENGTH
    tail_tip = tail - axis * 0.25 + normal * 0.25
    draw.line((*px(tail), *px(tail_tip)), fill=_FUR_DARK, width=5)
    for index in (0, 2):  # the near (left) legs, in front
        leg(index, _NEAR_LEG)
    if state[pose.BODY_CONTACT] > 0.5:
        _stamp(image, (ARENA_PX + 10, int(ground_y) + 12), "body touches the ground", 11,
               (240, 150, 120))


def _banner(draw: ImageDraw.ImageDraw, image: Image.Image, text: str) -> None:
    width = _text_stamp(text, 22, (250, 226, 120)).width
    left = (ARENA_PX - width) // 2
    draw.rectangle((left - 14, 12, left + width + 14, 48), fill=(20, 24, 30))
    _stamp(image, (left, 16), text, 22, (250, 226, 120))


def _wrap(text: str, width: int) -> list[str]:
    """`text` cut into lines of at most `width` characters, at slashes and spaces if it can."""
    lines: list[str] = []
    while len(text) > width:
        cut = max(text.rfind("/", 0, width), text.rfind(" ", 0, width))
        cut = cut + 1 if cut > width // 3 else width
        lines.append(text[:cut])
        text = text[cut:]
    return [*lines, text] if text else lines


def visual_frame(image: np.ndarray, min_height: int = 256) -> np.ndarray:
    """A camera observation as a video frame.

    Args:
        image: (C, H, W) in [0, 1], with 1 or 3 channels.
        min_height: the frame's least height: the image is scaled up by a whole factor (nearest
            neighbour) to reach it.

    Returns:
        An (H', W', 3) uint8 frame of even sizes (H.264 in yuv420p needs them).

    Raises:
        ValueError: `image` is not (C, H, W) with 1 or 3 channels.
    """
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"expected a (C, H, W) image with 1 or 3 channels, got shape "
                         f"{image.shape}")
    pixels = np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    if pixels.shape[2] == 1:
        pixels = np.repeat(pixels, 3, axis=2)
    factor = max(1, -(-min_height // pixels.shape[0]))
    if factor > 1:
        pixels = pixels.repeat(factor, axis=0).repeat(factor, axis=1)
    height, width = pixels.shape[0] // 2 * 2, pixels.shape[1] // 2 * 2
    return np.ascontiguousarray(pixels[:height, :width])


class SlotTracks:
    """Per slot: the running episode's return, length and trail (floor positions), and the same
    for the episode that ended at the last step (`final_*`), with how it ended. Fed by the
    vector env after each reset and step.

    Args:
        slots: the agent slots.
        trail_length: the most positions kept per trail.
    """

    def __init__(self, slots: int, trail_length: int = TRAIL_LENGTH) -> None:
        self.returns = np.zeros(slots)
        self.lengths = np.zeros(slots, dtype=np.int64)
        self.final_returns = np.zeros(slots)
        self.final_lengths = np.zeros(slots, dtype=np.int64)
        self.final_terminated = np.zeros(slots, dtype=bool)
        self.trail_length = trail_length
        self.trails: list[deque[tuple[float, float]]] = [deque(maxlen=trail_length)
                                                          for _ in range(slots)]
        self.final_trails: list[list[tuple[float, float]]] = [[] for _ in range(slots)]

    def reset(self, positions: np.ndarray | None) -> None:
        """Every slot starts an episode.

        Args:
            positions: (slots, 2) floor positions, or None without poses.
        """
        self.returns[:] = 0.0
        self.lengths[:] = 0
        for slot, trail in enumerate(self.trails):
            trail.clear()
            if positions is not None:
                trail.append(tuple(positions[slot].tolist()))

    def step(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
             positions: np.ndarray | None = None, final_positions: np.ndarray | None = None
             ) -> None:
        """Add one step.

        Args:
            rewards: (slots,) the step's rewards.
            terminated: (slots,) episodes that reached their end.
            truncated: (slots,) episodes cut at their max step.
            positions: (slots, 2) where each slot is now (a successor's first where an episode
                ended), or None.
            final_positions: (slots, 2) where the ended episodes ended, or None.
        """
        self.returns += rewards
        self.lengths += 1
        ended = terminated | truncated
        if positions is not None:
            for slot, point in enumerate(positions.tolist()):
                if not ended[slot]:
                    self.trails[slot].append(tuple(point))
        for slot in np.flatnonzero(ended).tolist():
            self.final_returns[slot] = self.returns[slot]
            self.final_lengths[slot] = self.lengths[slot]
            self.final_terminated[slot] = terminated[slot]
            self.returns[slot], self.lengths[slot] = 0.0, 0
            if positions is not None and final_positions is not None:
                trail = self.trails[slot]
                self.final_trails[slot] = [*trail, tuple(final_positions[slot].tolist())]
                trail.clear()
                trail.append(tuple(positions[slot].tolist()))

    def trail(self, slot: int, final: bool = False) -> np.ndarray:
        """The floor positions of a slot's episode.

        Args:
            slot: the slot.
            final: the episode that just ended, rather than the running one.

        Returns:
            (k, 2) positions, oldest first.
        """
        points: Sequence[tuple[float, float]] = (self.final_trails[slot][-self.trail_length:]
                                                 if final else self.trails[slot])
        return np.asarray(points, dtype=np.float64).reshape(-1, 2)
