"""HuggyAgent: the one inference boundary, `compute_action(obs, deterministic, seed, ...)`.

    agent = HuggyAgent.from_checkpoint("results/Pyramids")
    agent.spec           # observation inputs, continuous size, discrete branches, memory size
    actions = agent.compute_action(obs, deterministic=True, seed=None, action_mask=None)

`obs` is one array for a single-input policy; a list or tuple in `obs_0, obs_1, ...` order
otherwise (see `huggy_agent_client.inputs`). Continuous-only policies return float32 (N, c),
discrete-only int64 (N, branches), hybrid `Actions(continuous, discrete)`; a single row comes back
without N. Recurrent policies take `memory=` (None: zeros, an episode's start) and return
(actions, memory). The types, `PolicyActions` and `ActionResult`, and `split_memory`, which takes
a result apart, are in `huggy_agent_client.actions`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from huggy_agent.actor import Actor, expected_keys
from huggy_agent.devices import resolve_device, resolve_precision
from huggy_agent.engines import (
    Engine,
    EngineFailure,
    NativeEngine,
    TorchEngine,
    choose_engine,
    create_engine,
)
from huggy_agent.formats import LoadedPolicy, load_policy
from huggy_agent.formats.sources import hub_provenance
from huggy_agent.heads import ContinuousHead, discrete_actions
from huggy_agent.noise import gaussian_noise, uniform_noise
from huggy_agent_client.actions import ActionResult, Actions, PolicyActions
from huggy_agent_client.inputs import as_input_batches, as_mask_batch, as_memory_batch
from huggy_agent_client.spec import ActorSpec

logger = logging.getLogger(__name__)

WARMUP_PATHS = ("deterministic", "stochastic", "distribution")
_FLOAT32 = np.dtype(np.float32)

_Result = TypeVar("_Result")


def bundled_policy_path() -> Path:
    """The default policy shipped with the package (see assets/ORIGIN.md).

    Returns:
        The path of the bundled `Huggy.onnx`.
    """
    return Path(str(resources.files("huggy_agent") / "assets" / "Huggy.onnx"))


class RowsPart(Protocol):
    """One caller's consecutive rows of a shared forward pass and how to act on them (see
    `HuggyAgent.actions_of_parts`); the serving layer's validated requests are such parts."""

    @property
    def rows(self) -> int: ...

    @property
    def deterministic(self) -> bool: ...

    @property
    def seed(self) -> int | None: ...

    @property
    def row_offset(self) -> int: ...

    @property
    def action_mask(self) -> Any: ...


@dataclass(frozen=True)
class PolicyOutputs:
    """The actor's outputs for a batch, float32: `mu` (N, c) and `log_sigma` ((N, c), or PPO's
    state-independent (1, c) that broadcasts over rows) when there are continuous actions,
    `logits` (N, sum of branches) when there are discrete ones, `memory` (N, m) when recurrent."""

    mu: torch.Tensor | None
    log_sigma: torch.Tensor | None
    logits: torch.Tensor | None
    memory: torch.Tensor | None
    rows: int

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, rows: slice) -> PolicyOutputs:
        def part(tensor: torch.Tensor | None) -> torch.Tensor | None:
            if tensor is None or (tensor.shape[0] == 1 and self.rows != 1):
                return tensor  # absent, or shared by every row
            return tensor[rows]

        count = len(range(*rows.indices(self.rows)))
        return PolicyOutputs(part(self.mu), part(self.log_sigma), part(self.logits),
                             part(self.memory), count)


class HuggyAgent:
    """A loaded policy on a device, in a precision, run by an engine, with a seeded noise
    generator.

    Args:
        policy: a `.onnx`, a `.pt`, a results folder, or None for the bundled default policy.
        device: `auto` (NPU, then CUDA, then CPU), `cpu`, `cuda[:N]` or `npu[:N]`.
        precision: `fp32`, `fp16` or `bf16` for the layers; the normalizers stay float32.
        seed: seeds the generator used by stochastic calls that pass no seed of their own.
        engine: `auto` (the fastest correct engine for the device and precision, by a fixed rule:
            see `huggy_agent.engines.auto_engine`), `torch`, `onnxruntime` (CPU, fp32),
            `native` (CPU, fp32, MLP policies), `cuda-graph` or `npu-graph`. Every engine meets
            the numerical contract. A graph engine checks each graph it captures against eager
            torch; on a mismatch or an error in capture or replay the agent runs `torch` from then
            on, logs one warning, and says why in `engine_reason`.

    Raises:
        FileNotFoundError: the policy does not exist.
        PolicyLoadError: the policy cannot be loaded or run (see `huggy_agent.formats.load_policy`).
        ValueError: an unknown device, precision or engine, or an engine that cannot run on that
            device in that precision.
        RuntimeError: the device is not here.
    """

    def __init__(self, policy: str | Path | None = None, *, device: str = "auto",
                 precision: str = "fp32", seed: int | None = None, engine: str = "auto") -> None:
        self.loaded: LoadedPolicy = load_policy(policy if policy is not None else bundled_policy_path())
        self.device = resolve_device(device)
        self.precision = precision
        dtype = resolve_precision(precision)
        self.net: Actor = self.loaded.build().to(device=self.device, dtype=dtype)
        self.arch = self.loaded.arch
        self.spec: ActorSpec = self.arch.spec
        self.head = ContinuousHead(self.arch.head)
        shapes = tuple(i.shape for i in self.spec.inputs) + (
            ((self.spec.memory_size,),) if self.spec.memory_size else ())
        self.engine: str
        """The engine in use: `torch`, `onnxruntime`, `cuda-graph` or `npu-graph`."""
        self.engine_reason: str
        """Why that engine runs: the rule or request that chose it, or why a graph engine was
        given up for `torch`."""
        self.engine, self.engine_reason = choose_engine(engine, self.device, precision, self.net)
        self._engine: Engine = create_engine(self.engine, self.net, shapes, self.device,
                                             precision, self.head)
        self._engine_lock = threading.Lock()
        # Continuous actions only, no memory: the engine runs the head too (in graph engines,
        # captured with the network).
        self._fused = self.spec.kind == "continuous" and not self.spec.memory_size
        # One float32 observation row straight into the native engine, which checks it is finite.
        self._row_act = self._engine.act_row if isinstance(self._engine, NativeEngine) else None
        self._row_shape = self.spec.inputs[0].shape
        self._rng = np.random.default_rng(seed)
        self._raw_draw = self._rng.bit_generator.random_raw
        self.fingerprint = weights_fingerprint(self.loaded)

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto", precision: str = "fp32",
                        seed: int | None = None, engine: str = "auto") -> HuggyAgent:
        """Load a policy; the same as `HuggyAgent(path, ...)`.

        Args:
            path: a `.onnx`, a `.pt` or a results folder.
            device: see `HuggyAgent`.
            precision: see `HuggyAgent`.
            seed: see `HuggyAgent`.
            engine: see `HuggyAgent`.

        Returns:
            The agent.

        Raises:
            FileNotFoundError: see `HuggyAgent`.
            PolicyLoadError: see `HuggyAgent`.
            ValueError: see `HuggyAgent`.
            RuntimeError: see `HuggyAgent`.
        """
        return cls(path, device=device, precision=precision, seed=seed, engine=engine)

    @property
    def obs_size(self) -> int:
        """Values per observation row, all inputs together."""
        return sum(observation.size for observation in self.spec.inputs)

    @property
    def act_size(self) -> int:
        """Continuous actions per row."""
        return self.spec.continuous_size

    # -- the forward pass -------------------------------------------------------------------------

    def _run(self, call: Callable[[Engine], _Result]) -> _Result:
        """`call(engine)`; when the engine fails (`EngineFailure`), the agent switches to the
        `torch` engine for good, logs one warning, and answers `call` with it."""
        engine = self._engine
        try:
            return call(engine)
        except EngineFailure as failure:
            return call(self._fall_back(engine, failure))

    def _fall_back(self, failed: Engine, failure: EngineFailure) -> Engine:
        """The `torch` engine in place of `failed` (once, whichever thread sees it first)."""
        with self._engine_lock:
            if self._engine is failed:
                self._engine = TorchEngine(self.net, failed.input_shapes, self.device, self.head)
                self._row_act = None
                self.engine = self._engine.name
                self.engine_reason = f"{failure}; running the torch engine instead"
                logger.warning("%s", self.engine_reason)
            return self._engine

    def _stream(self, seed: int | None) -> int:
        """`seed`, or a fresh stream from the agent's generator where it is None."""
        return self._new_stream() if seed is None else seed

    def _new_stream(self) -> int:
        """A fresh noise stream from the agent's generator: what `Generator.integers(2**63)`
        draws (one raw 64-bit word, halved: Lemire's method with a power-of-two range never
        rejects), without its few microseconds of argument handling."""
        return int(self._raw_draw()) >> 1

    def _forward(self, inputs: list[np.ndarray]) -> PolicyOutputs:
        """The engine's pass over (N, ...) float32 inputs (the memory last, if any)."""
        outputs = list(self._run(lambda engine: engine.forward(inputs)))
        spec = self.spec
        mu = log_sigma = logits = memory = None
        if spec.continuous_size:
            mu, log_sigma = outputs.pop(0), outputs.pop(0)
        if spec.discrete_branches:
            logits = outputs.pop(0)
        if spec.memory_size:
            memory = outputs.pop(0)
        return PolicyOutputs(mu, log_sigma, logits, memory, len(inputs[0]))

    def distribution(self, obs: Any, memory: Any = None) -> PolicyOutputs:
        """One forward pass over every row of `obs`, without the action heads.

        Args:
            obs: as for `compute_action`.
            memory: a recurrent policy's memory, as for `compute_action`.

        Returns:
            The actor's float32 outputs for every row (a single row comes back as a batch of one).

        Raises:
            ValueError: as `compute_action` raises for `obs` and `memory`.
        """
        inputs, _ = as_input_batches(obs, self.spec)
        if self.spec.memory_size:
            inputs.append(as_memory_batch(memory, self.spec, len(inputs[0])))
        elif memory is not None:
            as_memory_batch(memory, self.spec, len(inputs[0]))  # raises: no memory here
        return self._forward(inputs)

    # -- the heads --------------------------------------------------------------------------------

    def actions_from(self, outputs: PolicyOutputs, deterministic: bool = True,
                     seed: int | None = None, row_offset: int = 0,
                     action_mask: Any = None) -> PolicyActions:
        """Apply the action heads to outputs of `distribution` (see `huggy_agent.heads`).

        Stochastic noise is drawn on the host: row i gets the noise of row `row_offset + i` of
        stream `seed`, Gaussian for continuous actions and uniform for discrete ones, on every device
        alike.

        Args:
            outputs: the actor's outputs for N rows.
            deterministic: the mean action (True) or a draw from the policy's distribution.
            seed: the noise stream of a stochastic call; None: a fresh stream from the agent's
                generator.
            row_offset: the row of the stream that the first row takes.
            action_mask: for discrete actions, as for `compute_action`.

        Returns:
            (N, c) float32, (N, branches) int64, or `Actions` for a hybrid policy.

        Raises:
            ValueError: an action mask that `compute_action` would refuse.
        """
        spec = self.spec
        rows = len(outputs)
        mask = as_mask_batch(action_mask, spec, rows)
        stream = None
        if not deterministic:
            stream = self._new_stream() if seed is None else seed
        continuous = discrete = None
        with torch.inference_mode():
            if spec.continuous_size:
                assert outputs.mu is not None and outputs.log_sigma is not None
                noise = (None if stream is None
                         else gaussian_noise(stream, rows, spec.continuous_size, row_offset))
                continuous = self.head.apply(outputs.mu, outputs.log_sigma, noise)
            if spec.discrete_branches:
                assert outputs.logits is not None
                uniforms = (None if stream is None else
                            uniform_noise(stream, rows, len(spec.discrete_branches), row_offset))
                discrete = discrete_actions(outputs.logits, spec.discrete_branches,
                                            None if mask is None else torch.from_numpy(mask),
                                            uniforms)
        if continuous is not None and discrete is not None:
            return Actions(continuous, discrete)
        actions = continuous if continuous is not None else discrete
        assert actions is not None  # every spec has continuous or discrete actions
        return actions

    def actions_of_parts(self, outputs: PolicyOutputs, parts: Sequence[RowsPart]
                         ) -> list[PolicyActions]:
        """The actions of consecutive parts of `outputs`, one part per caller of a shared forward pass.

        Part k gets what `actions_from(outputs[its rows], part.deterministic, part.seed,
        part.row_offset, part.action_mask)` gives; streams for `seed=None` are drawn in the order of
        `parts`. A continuous-only policy's head runs once over all the deterministic rows and once
        over all the stochastic ones (each stochastic part with its own noise), not once per part: the
        same element-wise operations on the same values. Other policies take `actions_from` part by
        part.

        Args:
            outputs: the actor's outputs for every part's rows, in order.
            parts: the callers' parts, covering `outputs` exactly.

        Returns:
            One `PolicyActions` per part, in order.

        Raises:
            ValueError: the parts do not cover `outputs`, or a part's action mask is refused.
        """
        total = sum(part.rows for part in parts)
        if total != len(outputs):
            raise ValueError(f"the parts cover {total} rows, the outputs have {len(outputs)}")
        if self.spec.kind != "continuous":
            answers: list[PolicyActions] = []
            start = 0
            for part in parts:
                answers.append(self.actions_from(outputs[start:start + part.rows],
                                                 part.deterministic, part.seed, part.row_offset,
                                                 part.action_mask))
                start += part.rows
            return answers
        for part in parts:
            as_mask_batch(part.action_mask, self.spec, part.rows)  # raises: no masks here
        assert outputs.mu is not None and outputs.log_sigma is not None
        mu, log_sigma = outputs.mu, outputs.log_sigma
        starts = np.cumsum([0, *(part.rows for part in parts)])
        stochastic = [k for k, part in enumerate(parts) if not part.deterministic]
        noise = [gaussian_noise(self._stream(parts[k].seed), parts[k].rows,
                                self.spec.continuous_size, parts[k].row_offset)
                 for k in stochastic]
        with torch.inference_mode():
            if len(stochastic) == len(parts):
                actions = self.head.apply(mu, log_sigma, np.concatenate(noise))
            else:
                actions = self.head.apply(mu, log_sigma, None)
                if stochastic:
                    rows = torch.from_numpy(np.concatenate(
                        [np.arange(starts[k], starts[k + 1]) for k in stochastic]))
                    shared = log_sigma.shape[0] != len(outputs)  # PPO's one row for all
                    actions[rows.numpy()] = self.head.apply(
                        mu[rows.to(mu.device)],
                        log_sigma if shared else log_sigma[rows.to(log_sigma.device)],
                        np.concatenate(noise))
        return [actions[starts[k]:starts[k + 1]] for k in range(len(parts))]

    def compute_action(self, obs: Any, deterministic: bool = True, seed: int | None = None,
                       row_offset: int = 0, action_mask: Any = None, memory: Any = None
                       ) -> ActionResult:
        """Actions for `obs`, one row or a batch.

        Args:
            obs: one array for a single-input policy; a list or tuple in `obs_0, obs_1, ...` order
                otherwise; a single row or a batch (N, ...) of lists, numpy arrays or torch tensors.
            deterministic: the mean action (True) or a draw from the policy's distribution.
            seed: the noise stream of a stochastic call: row i gets the noise of row
                `row_offset + i`, so a split batch gets the same actions. None: a fresh stream from the
                agent's generator.
            row_offset: the row of the stream that the first row of `obs` takes.
            action_mask: None (all allowed), or bools or 0/1, (sum of branches,) or
                (N, sum of branches), True where allowed.
            memory: a recurrent policy's memory: None for zeros (an episode's start), (m,) or (N, m).

        Returns:
            `PolicyActions` by the policy's kind: float32 (N, c), int64 (N, branches) or `Actions`;
                for a recurrent policy the pair (actions, next memory). A single row comes back without
                N.

        Raises:
            ValueError: a wrong shape, a non-finite value, a mask or memory the policy does not take,
                or a branch with no allowed action.
        """
        row_act = self._row_act
        if (row_act is not None and type(obs) is np.ndarray and obs.shape == self._row_shape
                and obs.dtype is _FLOAT32 and action_mask is None and memory is None
                and obs.flags.c_contiguous):
            noise = None if deterministic else gaussian_noise(
                self._new_stream() if seed is None else seed, 1, self.spec.continuous_size,
                row_offset)
            row_actions = row_act(obs, noise)
            if row_actions is not None:
                return row_actions
            # A value is not finite: validation below raises, naming it.
        inputs, single = as_input_batches(obs, self.spec)
        rows = len(inputs[0])
        if self._fused and action_mask is None and memory is None:
            if deterministic:
                noise = None
            else:
                if seed is None:
                    seed = self._new_stream()
                noise = gaussian_noise(seed, rows, self.spec.continuous_size, row_offset)
            fused = self._run(lambda engine: engine.act(inputs, noise))
            return fused[0] if single else fused
        if self.spec.memory_size:
            inputs.append(as_memory_batch(memory, self.spec, rows))
        elif memory is not None:
            as_memory_batch(memory, self.spec, rows)  # raises: no memory here
        outputs = self._forward(inputs)
        actions = self.actions_from(outputs, deterministic, seed, row_offset, action_mask)
        if single:
            actions = (Actions(actions.continuous[0], actions.discrete[0])
                       if isinstance(actions, Actions) else actions[0])
        if not self.spec.memory_size:
            return actions
        assert outputs.memory is not None
        new_memory = outputs.memory.cpu().numpy()
        return actions, new_memory[0] if single else new_memory

    def expect_row(self) -> None:
        """A hint that a one-observation `compute_action` comes soon (a server calls it when a request
        reaches it idle).

        The native engine wakes a second core to share that pass (see `NativeEngine.expect_row`); other
        engines ignore it. The actions are the same.
        """
        self._engine.expect_row()

    def warmup(self, batch_sizes: Iterable[int], paths: Collection[str] = WARMUP_PATHS) -> None:
        """Run each path once per batch size on zero observations, so that later calls are ready.

        Graph engines capture and check their graphs here (a failing one is replaced by `torch`); the
        CPU engines set up their buffers. The observations are zeros, all actions allowed, the memory
        zero; the agent's noise generator is left untouched.

        Args:
            batch_sizes: the row counts to prepare.
            paths: some of `deterministic` and `stochastic` (`compute_action`) and `distribution`.

        Raises:
            ValueError: an unknown path.
        """
        unknown = sorted(set(paths) - set(WARMUP_PATHS))
        if unknown:
            raise ValueError(f"unknown warm-up path(s) {unknown}; expected some of "
                             f"{list(WARMUP_PATHS)}")
        for rows in batch_sizes:
            zeros = [np.zeros((rows, *i.shape), dtype=np.float32) for i in self.spec.inputs]
            obs = zeros[0] if len(zeros) == 1 else zeros
            if "deterministic" in paths:
                self.compute_action(obs)
            if "stochastic" in paths:
                self.compute_action(obs, deterministic=False, seed=0)
            if "distribution" in paths:
                self.distribution(obs)

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable summary of the agent.

        Returns:
            The spec, architecture, parameter counts, source (and Hub source), format, step,
                fingerprint, device, precision, engine, why that engine runs, and the engine's own
                details.
        """
        return {
            "spec": self.spec.as_dict(),
            "architecture": self.arch.as_dict(),
            "summary": self.arch.describe(),
            "parameters": self.net.parameter_counts(),
            "source": str(self.loaded.origin),
            "hub_source": _hub_source(self.loaded.origin),
            "format": self.loaded.file_format,
            "step": self.loaded.step,
            "fingerprint": self.fingerprint,
            "device": str(self.device),
            "precision": self.precision,
            "engine": self.engine,
            "engine_reason": self.engine_reason,
            "engine_detail": self._engine.describe(),
        }


def _hub_source(origin: str | Path) -> str | None:
    """`hf://owner/repo@commit/path` for a file from the Hugging Face Hub cache, else None."""
    found = hub_provenance(origin)
    return None if found is None else found.describe()


STD_FINGERPRINT_BITS = 8
"""Significant bits of each normalizer std value in the weights fingerprint (see below)."""


def weights_fingerprint(loaded: LoadedPolicy) -> str:
    """A hash of the architecture and the weights, the same for one run's `.pt` and `.onnx` on any
    machine: it hashes only values that no machine's arithmetic touched.

    Stored tensors (every layer, the normalizers' means, log-sigma) enter bit for bit. A
    normalizer's std is derived: a `.pt` stores a running variance and a step count (the loader
    takes `sqrt(variance / steps)` in float64, rounded once to float32), while an ONNX export
    holds the std that its exporter folded in float32, which can be 1 ulp off the correctly
    rounded value. So std enters rounded to `STD_FINGERPRINT_BITS` significant bits, far coarser
    than that ulp and exact to compute (frexp, a power of two, rint).

    Args:
        loaded: the policy.

    Returns:
        16 hex digits.
    """
    digest = hashlib.sha256(json.dumps(loaded.arch.as_dict(), sort_keys=True).encode())
    for key in expected_keys(loaded.arch):
        values = loaded.tensors[key].detach().float().contiguous().numpy()
        if key.endswith(".std"):
            mantissa, exponent = np.frexp(values.astype(np.float64))
            values = np.stack([np.rint(mantissa * 2.0**STD_FINGERPRINT_BITS), exponent]).astype(
                np.int64)
        digest.update(key.encode())
        digest.update(values.tobytes())
    return digest.hexdigest()[:16]
