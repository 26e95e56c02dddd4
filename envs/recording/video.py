"""Videos of episodes: `VideoWriter` (MP4, H.264 in yuv420p, as browsers play it, through
imageio-ffmpeg's own ffmpeg binary: no system ffmpeg), and `VideoRecorder`, a recorder of the
rollout loop that writes the first episodes of one agent slot, one file per episode.

Frames come from the env (`UnityVectorEnv(render_mode="rgb_array").render_frame`). ffmpeg runs
as its own process and encodes while the rollout goes on. The files start with their index
(`-movflags +faststart`), so a page can play them before they are fully loaded.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from envs.recording.base import RecordingContext, StepRecord

ENCODER_PRESET = "ultrafast"
"""x264 preset: encoding runs beside the rollout on the same cores, so its CPU time is what a
video costs; ultrafast takes less CPU per frame than slower presets, for larger files
(docs/benchmarks.md, "Recording")."""
FFMPEG_TIMEOUT_S = 60.0
"""How long `close()` waits for ffmpeg to finish a file."""


class VideoWriter:
    """One MP4 file written frame by frame: `write(frame)`, then `close()` to finish it (also as a
    context manager).

    ffmpeg (imageio-ffmpeg's binary) is started with `posix_spawn` where Python can (no fork of a
    process that holds gRPC threads), on the first frame.

    Args:
        path: the MP4 file; its folder is made if missing.
        fps: frames per second, possibly fractional (Huggy's frame rate is 12.5).
        crf: x264's quality (lower: better, larger).
    """

    def __init__(self, path: str | Path, fps: float, crf: int = 20) -> None:
        self.path = Path(path)
        self.fps = float(fps)
        self.crf = crf
        self.frames = 0
        self._process: subprocess.Popen | None = None
        self._log: Any = None
        self._size: tuple[int, int] | None = None

    def _start(self, width: int, height: int) -> None:
        import imageio_ffmpeg  # the optional video extra

        self.path.parent.mkdir(parents=True, exist_ok=True)
        command = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error",
            "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}",
            "-r", f"{self.fps:g}", "-i", "-", "-an",
            "-c:v", "libx264", "-preset", ENCODER_PRESET, "-crf", str(self.crf),
            "-pix_fmt", "yuv420p", "-movflags", "+faststart", str(self.path)]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, stderr=self._log,
                                         close_fds=False)  # lets Python use posix_spawn
        self._size = (width, height)

    def write(self, frame: np.ndarray) -> None:
        """Add a frame.

        Args:
            frame: (H, W, 3) uint8 with even sides, the size of the first frame.

        Raises:
            ValueError: another shape or dtype, odd sides, or another size than the first frame's.
        """
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"expected an (H, W, 3) uint8 frame, got {frame.shape} "
                             f"{frame.dtype}")
        height, width = frame.shape[:2]
        if height % 2 or width % 2:
            raise ValueError(f"frames need even sides for yuv420p, got {width}x{height}")
        if self._process is None:
            self._start(width, height)
        elif (width, height) != self._size:
            raise ValueError(f"every frame must be {'x'.join(map(str, self._size or ()))}, "
                             f"got {width}x{height}")
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(np.ascontiguousarray(frame).data)
        self.frames += 1

    def close(self) -> None:
        """Finish the file, waiting for ffmpeg. Idempotent; a writer that got no frame writes no file.

        Raises:
            RuntimeError: ffmpeg failed (with its message).
        """
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        process.stdin.close()
        code = process.wait(timeout=FFMPEG_TIMEOUT_S)
        self._log.seek(0)
        message = self._log.read().decode(errors="replace").strip()
        self._log.close()
        if code != 0:
            raise RuntimeError(f"ffmpeg failed ({code}) writing {self.path}: {message}")

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def write_video(path: str | Path, frames: Any, fps: float) -> Path:
    """Write frames to an MP4 file.

    Args:
        path: the MP4 file.
        frames: an iterable of (H, W, 3) uint8 frames.
        fps: frames per second.

    Returns:
        The path.

    Raises:
        ValueError: a frame `VideoWriter.write` refuses.
        RuntimeError: ffmpeg failed.
    """
    with VideoWriter(path, fps) as writer:
        for frame in frames:
            writer.write(frame)
    return writer.path


class VideoRecorder:
    """Records some episodes of one agent slot to MP4, one file per episode.

    Each frame is the env's `render_frame` with `label` as the policy's name: the first
    observation, then one per step; the last shows how the episode ended. An episode still running
    when the rollout ends is not written. `written` lists the files, in episode order. The env
    must be made with `render_mode="rgb_array"`. Frames are drawn only while a chosen episode
    runs; the rollout's numbers do not change (rendering only reads).

    Args:
        folder: where the files go, as `{prefix}-slot{slot}-episode{index}.mp4`.
        slot: the agent slot (of the recorder's slots).
        episodes: a count of first episodes, or the indices (since the reset) to record.
        label: the policy's name drawn on the frames.
        path: for one episode, exactly this file instead of one in `folder`.
        prefix: the files' prefix.
        fps: frames per second; None: the env's `render_fps`.

    Raises:
        ValueError: neither `folder` nor `path`, `path` with other than one episode, or no episode
            (or a negative index).
    """

    def __init__(self, folder: str | Path | None = None, slot: int = 0,
                 episodes: int | set[int] = 1, label: str | None = None,
                 path: str | Path | None = None, prefix: str = "rollout",
                 fps: float | None = None) -> None:
        wanted = set(range(episodes)) if isinstance(episodes, int) else set(episodes)
        if path is None and folder is None:
            raise ValueError("give a folder for the videos, or a path for one episode")
        if path is not None and len(wanted) != 1:
            raise ValueError(f"path= names one file: record one episode, not {sorted(wanted)}")
        if not wanted or min(wanted) < 0:
            raise ValueError(f"episodes must be a count >= 1 or indices >= 0, got {episodes!r}")
        self.folder = None if folder is None else Path(folder)
        self.path = None if path is None else Path(path)
        self.slot, self.wanted, self.label, self.prefix = slot, wanted, label, prefix
        self.fps = fps
        self.written: list[Path] = []
        self._env: Any = None
        self._env_slot = slot
        self._writer: VideoWriter | None = None
        self._index = 0

    def start(self, context: RecordingContext, obs: Any, infos: dict[str, Any]) -> None:
        """See `Recorder.start`: opens the first episode's file when it is wanted.

        Args:
            context: where the slots are, their quotas and the reset's seed.
            obs: the first observations.
            infos: the reset's infos.

        Raises:
            ValueError: the env was not made with `render_mode="rgb_array"`, or `slot` is not one of
                the recorder's slots.
        """
        env = context.env
        if getattr(env, "render_mode", None) != "rgb_array":
            raise ValueError("VideoRecorder needs an environment made with "
                             "render_mode='rgb_array'")
        if not 0 <= self.slot < len(context.quotas):
            raise ValueError(f"slot must be in [0, {len(context.quotas)}), got {self.slot}")
        self._env, self._env_slot = env, context.env_slot(self.slot)
        self.fps = self.fps or float(env.metadata["render_fps"])
        self.written, self._index = [], 0
        self._open_if_wanted()

    def step(self, record: StepRecord) -> None:
        """See `Recorder.step`: adds the frame of a recorded episode, and finishes its file when it
        ends.

        Args:
            record: the step of the recorder's slots.
        """
        if self._writer is None and self._index > max(self.wanted):
            return
        ended = bool(record.terminated[self.slot] or record.truncated[self.slot])
        if self._writer is not None:
            self._writer.write(self._frame(final=ended))
            if ended:
                self._writer.close()
                self.written.append(self._writer.path)
                self._writer = None
        if ended:
            self._index += 1
            self._open_if_wanted()

    def end(self, result: Any) -> None:
        """Drops an unfinished episode's file.

        Args:
            result: the rollout's result, or None when it was interrupted.
        """
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()
            writer.path.unlink(missing_ok=True)

    def _open_if_wanted(self) -> None:
        if self._index not in self.wanted:
            return
        path = self.path or self.folder / (   # type: ignore[operator]
            f"{self.prefix}-slot{self.slot}-episode{self._index}.mp4")
        self._writer = VideoWriter(path, self.fps or 0.0)
        self._writer.write(self._frame(final=False))

    def _frame(self, final: bool) -> np.ndarray:
        return self._env.render_frame(self._env_slot, final=final, label=self.label)
