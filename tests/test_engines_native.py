"""The `native` engine and the compiled kernels: single observations through the agent's direct
path against onnxruntime and float64, deterministic and seeded stochastic, on every fixture run
and kernel; its validation; the policies it takes and refuses; the compiled noise against
numpy's, bit for bit; fresh noise streams against numpy's own `Generator.integers`."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

from huggy_agent import HuggyAgent, noise
from huggy_agent.engines import native_fits
from huggy_agent.engines.native import NativeEngine, usable_cpus
from huggy_agent.native import KERNELS, mlp_kernels, noise_kernels
from huggy_agent.noise import (
    _numpy_gaussian_noise,
    _numpy_uniform_noise,
    gaussian_noise,
    uniform_noise,
)
from huggy_agent.numerics import FP32_ACTION_ATOL, fp32_action_tolerance
from huggy_agent.reference import canonical_observations, float64_actions
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir, mlagents_policy_files

pytestmark = [pytest.mark.numerics,  # rerun by .ci/run under other CPU kernel paths
              pytest.mark.skipif(KERNELS is None, reason="the compiled kernels were not built "
                                 "(no C compiler at install): the native engine is absent")]

ROWS = 64


@pytest.fixture(scope="module", params=[(run, kernel) for run in FIXTURE_RUNS
                                        for kernel in mlp_kernels()], ids="-".join)
def native(request: pytest.FixtureRequest) -> tuple[HuggyAgent, np.ndarray, np.ndarray]:
    """(an agent on the native engine with one kernel, on-scale observations with 16 scaled by
    1e3, onnxruntime's deterministic actions on the run's ML-Agents export) per fixture run."""
    run, kernel = request.param
    path = fixtures_dir() / run / "Huggy.onnx"
    agent = HuggyAgent(path, device="cpu", engine="native")
    agent._engine = NativeEngine(agent.net, ((agent.obs_size,),), agent.device, agent.head,
                                 kernel=kernel)
    agent._row_act = agent._engine.act_row
    obs = canonical_observations(agent.loaded, ROWS, seed=8)
    obs[:16] *= 1e3  # far beyond the training scale: the normalizer clips them
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (reference,) = session.run(["deterministic_continuous_actions"], {"obs_0": obs})
    return agent, obs, reference


def test_single_observations_match_onnxruntime_and_float64(native: tuple) -> None:
    """Within the contract's tolerance (scaled for off-scale rows of a policy without a
    normalizer: `fp32_action_tolerance`)."""
    agent, obs, reference = native
    noise = gaussian_noise(17, ROWS, 21, row_offset=5)
    sampled_reference = float64_actions(agent.loaded, obs, noise)
    for row in range(ROWS):
        tolerance = fp32_action_tolerance(obs[row], agent.arch.inputs[0].normalize)
        actions = agent.compute_action(obs[row])
        assert actions.shape == (21,) and actions.dtype == np.float32
        assert np.abs(actions - reference[row]).max() <= tolerance, row
        sampled = agent.compute_action(obs[row], deterministic=False, seed=17, row_offset=5 + row)
        assert np.abs(sampled - sampled_reference[row]).max() <= tolerance, row


def test_a_row_gets_the_same_noise_alone_as_in_a_batch(native: tuple) -> None:
    """Row i of a seeded batch and the row alone with row_offset i: the same host noise, so the
    same action within the contract (the batch runs through onnxruntime)."""
    agent, obs, _ = native
    batch = agent.compute_action(obs, deterministic=False, seed=2**64 - 1)
    alone = np.stack([agent.compute_action(obs[row], deterministic=False, seed=2**64 - 1,
                                           row_offset=row) for row in range(ROWS)])
    tolerance = fp32_action_tolerance(obs, agent.arch.inputs[0].normalize)
    assert np.abs(alone - batch).max() <= tolerance
    assert np.abs(alone - agent.compute_action(obs)).max() > 1e-2  # the noise is there


def test_rows_that_take_the_validating_path_agree(native: tuple) -> None:
    """float64 rows, lists, tensors, strided views and (1, n) batches are converted and validated
    first; they answer as a float32 row does."""
    agent, obs, reference = native
    strided = np.repeat(obs[3], 2)[::2]
    assert not strided.flags.c_contiguous
    for given in (obs[3].astype(np.float64), obs[3].tolist(), torch.from_numpy(obs[3].copy()),
                  strided):
        assert np.abs(agent.compute_action(given) - reference[3]).max() <= FP32_ACTION_ATOL
    one_row = agent.compute_action(obs[3:4])
    assert one_row.shape == (1, 21)
    assert np.abs(one_row[0] - reference[3]).max() <= FP32_ACTION_ATOL


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_is_refused_with_its_place(native: tuple, bad: float) -> None:
    agent, obs, _ = native
    row = obs[0].copy()
    row[7] = bad
    message = f"observation must be finite: received {bad} at row 0, column 7"
    for deterministic in (True, False):
        with pytest.raises(ValueError, match=re.escape(message)):
            agent.compute_action(row, deterministic=deterministic)


def test_distribution_of_one_row_matches_onnxruntime(native: tuple) -> None:
    agent, obs, _ = native
    expected = HuggyAgent(agent.loaded.origin, device="cpu", engine="onnxruntime").distribution(
        obs[20:21])  # an on-scale row: raw outputs, not bounded actions, are compared
    outputs = agent.distribution(obs[20])
    assert outputs.mu is not None and outputs.log_sigma is not None
    assert outputs.mu.shape == (1, 21) and outputs.log_sigma.shape == (1, 21)
    assert float((outputs.mu - expected.mu).abs().max()) <= FP32_ACTION_ATOL
    torch.testing.assert_close(outputs.log_sigma, expected.log_sigma, rtol=0, atol=0)


def test_threads_calling_at_once_get_their_own_answers(native: tuple) -> None:
    """The kernel releases the GIL and keeps no state between calls."""
    agent, obs, reference = native
    answers: dict[int, np.ndarray] = {}

    def worker(first: int) -> None:
        for row in range(first, ROWS, 4):
            answers[row] = agent.compute_action(obs[row])

    threads = [threading.Thread(target=worker, args=(first,)) for first in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(answers) == list(range(ROWS))
    assert np.abs(np.stack([answers[row] for row in range(ROWS)]) - reference).max() <= (
        fp32_action_tolerance(obs, agent.arch.inputs[0].normalize))


# --- the row helper -----------------------------------------------------------------------------

SEVERAL_CPUS = usable_cpus() > 1
"""Where the row helper and the caller can run at once, and so the helper joins passes."""


def _helper_asleep() -> None:
    """Wait until the row helper sleeps, as it does at most 200 us after its latest arm, so that
    the passes that follow run on one core."""
    while KERNELS.row_helper_state()[0]:
        time.sleep(1e-4)


def _shared(run: Callable[..., np.ndarray], *args: Any, **kwargs: Any) -> np.ndarray:
    """`run(*args, **kwargs)` right after waking the row helper; where there are CPUs for both,
    once it is awake, so that it takes part in the pass (at once or midway: both answer the
    same)."""
    KERNELS.row_helper_arm()
    while SEVERAL_CPUS and not KERNELS.row_helper_state()[0]:
        KERNELS.row_helper_arm()
    return run(*args, **kwargs)


JOIN_TRIES = 1000
"""Shared passes a test runs at most for the helper to take part in one: on a loaded machine
the helper may be off its CPU for many passes in a row."""


def _joined_since(joined: int, run: Callable[..., np.ndarray], expected: bytes, *args: Any
                  ) -> bool:
    """Whether the helper has computed part of a pass since its count was `joined`, running
    shared passes of `run(*args)` (each must answer `expected`, bit for bit) until it has, at
    most `JOIN_TRIES`."""
    for _ in range(JOIN_TRIES):
        if KERNELS.row_helper_state()[1] > joined:
            return True
        assert _shared(run, *args).tobytes() == expected
    return KERNELS.row_helper_state()[1] > joined


def test_a_pass_shared_with_the_row_helper_is_the_one_core_pass_bit_for_bit(native: tuple
                                                                            ) -> None:
    """Exact by construction: each value of a shared pass is computed by the same code as on one
    core, blocks of 32 rows of a hidden layer in either thread, the layers in order. So the
    actions are the same bits, deterministic and stochastic; and where there are CPUs for both,
    the helper computes part of the passes."""
    agent, obs, _ = native
    _helper_asleep()
    alone = [(agent.compute_action(row), agent.compute_action(row, deterministic=False, seed=3))
             for row in obs]
    joined = KERNELS.row_helper_state()[1]
    for index, (deterministic, sampled) in enumerate(alone):
        row = obs[index]
        assert _shared(agent.compute_action, row).tobytes() == deterministic.tobytes()
        assert _shared(agent.compute_action, row, deterministic=False, seed=3
                       ).tobytes() == sampled.tobytes()
    assert not SEVERAL_CPUS or _joined_since(joined, agent.compute_action,
                                             alone[0][0].tobytes(), obs[0])


ODD_SIZES = [59, 300, 301, 5]
"""A network whose hidden layers end in partial blocks (300 = 9 x 32 + 12, 301 = 9 x 32 + 13),
large enough to be shared (from 64K weights)."""


def _float64_forward_and_bound(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray
                               ) -> tuple[np.ndarray, np.ndarray]:
    """The network's outputs in float64, and a bound on a float32 evaluation's error, derived
    layer by layer: a sum of n products and a bias in any order errs by at most
    (n + 2) 2**-24 (|W| |x| + |b|) (Higham's gamma_n), plus |W| times the input's error; SiLU
    (slope at most 1.1) carries that error and adds its own, bounded by 8 units in the last
    place (the kernel's exp is within 2; the division, addition and rounding add 3)."""
    error = np.zeros_like(x)
    for index, (weight, bias) in enumerate(layers):
        weight, bias = weight.astype(np.float64), bias.astype(np.float64)
        pre = weight @ x + bias
        pre_error = np.abs(weight) @ error + (weight.shape[1] + 2) * 2.0**-24 * (
            np.abs(weight) @ np.abs(x) + np.abs(bias))
        if index == len(layers) - 1:
            return pre, pre_error
        x = pre / (1 + np.exp(-pre))
        error = 1.1 * pre_error + 8 * 2.0**-24 * np.abs(x)
    raise AssertionError("no layers")


@pytest.mark.parametrize("kernel", mlp_kernels())
def test_hidden_layers_in_partial_blocks_share_the_pass_bit_for_bit(kernel: str) -> None:
    """Blocks that end a layer short and the padding after them, on one core and shared: the
    same bits, within the derived float32 bound of float64."""
    rng = np.random.default_rng(5)
    layers = [((rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in)).astype(np.float32),
               (0.1 * rng.standard_normal(fan_out)).astype(np.float32))
              for fan_in, fan_out in zip(ODD_SIZES, ODD_SIZES[1:], strict=False)]
    plan = KERNELS.mlp_plan(None, None, [(w, b, len(b), w.shape[1]) for w, b in layers],
                            np.zeros(ODD_SIZES[-1], dtype=np.float32), False, kernel)
    obs = (2 * rng.standard_normal((16, ODD_SIZES[0]))).astype(np.float32)

    def forward(row: np.ndarray) -> np.ndarray:
        mu = np.empty((1, ODD_SIZES[-1]), dtype=np.float32)
        assert KERNELS.mlp_forward(plan, row, mu, None, 1)
        return mu[0]

    _helper_asleep()
    alone = [forward(row) for row in obs]
    joined = KERNELS.row_helper_state()[1]
    for row, expected in zip(obs, alone, strict=True):
        assert _shared(forward, row).tobytes() == expected.tobytes()
        reference, bound = _float64_forward_and_bound(layers, row.astype(np.float64))
        assert (np.abs(expected - reference) <= bound).all()
    assert not SEVERAL_CPUS or _joined_since(joined, forward, alone[0].tobytes(), obs[0])


def _shared_passes_in_a_fork(agent: HuggyAgent, row: np.ndarray, expected: bytes) -> None:
    """Shared passes until the child's own helper takes part in one (`_joined_since`)."""
    joined = KERNELS.row_helper_state()[1]
    assert _shared(agent.compute_action, row).tobytes() == expected
    assert not SEVERAL_CPUS or _joined_since(joined, agent.compute_action, expected, row)


def test_a_forked_child_starts_its_own_row_helper() -> None:
    """A fork keeps no thread but the caller: the child's first arm starts a helper of its own
    (the parent's lock, perhaps held at the fork, is made anew), which shares its passes."""
    agent = HuggyAgent(device="cpu", engine="native")
    row = canonical_observations(agent.loaded, 1, seed=2)[0]
    expected = agent.compute_action(row).tobytes()
    _shared(agent.compute_action, row)  # the parent's helper runs
    child = multiprocessing.get_context("fork").Process(
        target=_shared_passes_in_a_fork, args=(agent, row, expected))
    child.start()
    child.join()
    assert child.exitcode == 0


def test_unseeded_calls_draw_the_streams_of_generator_integers() -> None:
    """A fresh stream per unseeded call is numpy's own `Generator(seed).integers(2**63)`: the
    native engine's single rows and the onnxruntime engine's batches follow one sequence."""
    obs = canonical_observations(HuggyAgent(device="cpu", engine="torch").loaded, 3, seed=4)
    native_agent = HuggyAgent(device="cpu", engine="native", seed=99)
    reference_agent = HuggyAgent(device="cpu", engine="onnxruntime", seed=99)
    streams = np.random.default_rng(99).integers(2**63, size=6)
    for call, stream in enumerate(streams):
        row = obs[call % 3]
        expected = reference_agent.compute_action(row, deterministic=False, seed=int(stream))
        got = native_agent.compute_action(row, deterministic=False)
        assert np.abs(got - expected).max() <= FP32_ACTION_ATOL, call


# --- the policies it takes ----------------------------------------------------------------------

def _is_mlp_policy(agent: HuggyAgent) -> bool:
    spec = agent.spec
    return (len(spec.inputs) == 1 and spec.inputs[0].kind == "vector" and spec.kind == "continuous"
            and not spec.memory_size)


@pytest.mark.parametrize("path", mlagents_policy_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_auto_runs_native_exactly_for_mlp_policies(path: Path) -> None:
    """Every ML-Agents kind: `native` (with AVX2) for one vector input and continuous actions
    only, against onnxruntime's engine at one row and a batch; `onnxruntime` for the rest, and
    `native` by name refused naming the policy's interface."""
    reference = HuggyAgent(path, device="cpu", engine="onnxruntime")
    if not _is_mlp_policy(reference):
        assert not native_fits(reference.net) and HuggyAgent(path, device="cpu").engine == (
            "onnxruntime")
        with pytest.raises(ValueError, match=re.escape(
                "an MLP policy has one vector input and continuous actions only, not "
                f"{reference.spec.describe()}")):
            HuggyAgent(path, device="cpu", engine="native")
        return
    assert native_fits(reference.net) == ("avx2" in mlp_kernels())
    agent = HuggyAgent(path, device="cpu", engine="native")
    rng = np.random.default_rng(3)
    obs = (rng.standard_normal((ROWS, reference.obs_size)) * 2).astype(np.float32)
    for kwargs in ({}, {"deterministic": False, "seed": 12, "row_offset": 7}):
        expected = reference.compute_action(obs, **kwargs)
        assert np.abs(agent.compute_action(obs, **kwargs) - expected).max() <= FP32_ACTION_ATOL
        row = 9
        offset = {"row_offset": 7 + row} if kwargs else {}
        single = agent.compute_action(obs[row], **{**kwargs, **offset})
        assert np.abs(single - expected[row]).max() <= FP32_ACTION_ATOL


def test_networks_that_are_not_actors_are_refused() -> None:
    net = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="expected an ML-Agents actor, got Linear"):
        NativeEngine(net, ((4,),), torch.device("cpu"), HuggyAgent(device="cpu").head)
    assert not native_fits(net) and not native_fits(None)


def test_a_kernel_this_cpu_lacks_is_refused() -> None:
    agent = HuggyAgent(device="cpu", engine="torch")
    with pytest.raises(ValueError, match="kernel avx512 does not run on this CPU"):
        NativeEngine(agent.net, ((agent.obs_size,),), agent.device, agent.head, kernel="avx512")


# --- the compiled noise -------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", noise_kernels())
def test_compiled_noise_is_numpys_bit_for_bit(kernel: str) -> None:
    """Random seeds, offsets near 2**64 (rows wrap around), shapes from one value to thousands
    (the kernel works in blocks of 256 values: whole blocks and a last partial one), each noise
    kernel this CPU runs called itself (`gaussian_noise` would fall back to numpy if the probe
    at import failed)."""
    assert noise._COMPILED is KERNELS  # the probe at import found the kernel exact
    rng = np.random.default_rng(21)
    shapes = [(1, 1), (1, 21), (3, 7), (17, 5), (200, 21), (1, 4096), (1, 256), (257, 1)]
    for index in range(64):
        seed = int(rng.integers(2**64, dtype=np.uint64))
        row_offset = int(rng.integers(2**64, dtype=np.uint64)) if index % 2 else index
        rows, cols = shapes[index % len(shapes)]
        compiled = np.empty((rows, cols), dtype=np.float32)
        KERNELS.gaussian_noise(seed, row_offset, rows, cols, noise._CONSTANTS, compiled, kernel)
        np.testing.assert_array_equal(compiled.view(np.uint32),
                                      _numpy_gaussian_noise(seed, rows, cols, row_offset)
                                      .view(np.uint32))
        np.testing.assert_array_equal(uniform_noise(seed, rows, cols, row_offset).view(np.uint64),
                                      _numpy_uniform_noise(seed, rows, cols, row_offset)
                                      .view(np.uint64))


def test_numpy_noise_keeps_the_recorded_bits() -> None:
    """The numpy definition itself, which the compiled kernel replaces where built."""
    from tests.support.engines import RECORDED_NOISE_BITS

    for (seed, row), bits in RECORDED_NOISE_BITS.items():
        assert _numpy_gaussian_noise(seed, 1, 4, row).view(np.uint32)[0].tolist() == bits


def _linux_cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them on x86 ("flags"); on Arm the "Features"
    line names none of the x86 kernels' features."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from (not Linux)")
    lines = [line for line in text.splitlines() if line.startswith(("flags", "Features"))]
    return set(lines[0].split(":", 1)[1].split()) if lines else set()


def test_the_kernel_lists_follow_the_cpus_flags() -> None:
    """The noise's avx2 kernel needs AVX2 only; the MLP's needs AVX2 and FMA."""
    flags = _linux_cpu_flags()
    assert noise_kernels() == (("avx2", "generic") if "avx2" in flags else ("generic",))
    assert mlp_kernels() == (("avx2", "generic") if {"avx2", "fma"} <= flags else ("generic",))


def test_a_noise_kernel_this_cpu_lacks_is_refused() -> None:
    out = np.empty((1, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="noise kernel 'avx512' does not run on this CPU; "
                       "expected 'generic'"):
        KERNELS.gaussian_noise(1, 0, 1, 4, noise._CONSTANTS, out, "avx512")


def test_compiled_noise_takes_numpy_integers_and_refuses_negative_offsets() -> None:
    np.testing.assert_array_equal(gaussian_noise(np.uint64(5), 2, 3, np.int64(9)),
                                  _numpy_gaussian_noise(5, 2, 3, 9))
    with pytest.raises(OverflowError):
        gaussian_noise(5, 1, 3, row_offset=-1)


def test_compiled_noise_names_the_arguments_it_takes() -> None:
    out = np.empty((1, 4), dtype=np.float32)
    for args in [(1, 0, 1, 4, noise._CONSTANTS), (1, 0, 1, 4, noise._CONSTANTS, out, "generic", 0)]:
        with pytest.raises(TypeError, match=re.escape(
                f"gaussian_noise takes 6 or 7 arguments, got {len(args)}")):
            KERNELS.gaussian_noise(*args)
    with pytest.raises(TypeError, match=re.escape("uniform_noise takes 5 arguments, got 6")):
        KERNELS.uniform_noise(1, 0, 1, 4, out.astype(np.float64), 0)
