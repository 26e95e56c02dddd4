"""Counter-based noise on the host: the same bits on every machine, device, split and engine.

Entry (i, j) of `gaussian_noise(seed, rows, cols, row_offset)` (and of `uniform_noise`, a second
stream) depends only on (seed, row_offset + i, j): a batch split into pieces, each given its row
offset, gets bit-identical noise, and so does the same request whether a server batches it alone
or with others. SplitMix64 hashes the counter; Box-Muller turns two 53-bit uniforms into one
normal.

Bit-identical across machines by construction: libm's and numpy's SIMD `log` and `cos` differ by
an ulp between CPUs (numpy picks AVX-512 versions where it can), so the logarithm and the cosine
here are polynomials evaluated with float64 `+ - * /` only, each correctly rounded by IEEE 754 and
never fused by numpy, after exact range reductions (frexp, powers of two, floor). They are
accurate to a few float64 ulps, far below the float32 that the noise is returned in.

The package's compiled kernels (`huggy_agent.native`), where built, run the same operations in
the same order in C without fused multiply-adds: the same bits, far faster (docs/benchmarks.md,
"The policy"). A probe at import compares the two, and numpy draws the noise if they ever differ.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from huggy_agent.native import KERNELS

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
SEED_RANGE = 2**63
_UNIFORM_DOMAIN = 0x5DEECE66D5A17C3B  # keys the uniform stream apart from the Gaussian one

_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that e * _LN2_HI is exact for |e| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_SQRT_HALF = 0.7071067811865476
# Truncated series, accurate to ~1e-13 relative: plenty for noise returned in float32, whose
# bits only have to be the same everywhere, not correctly rounded.
# 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...): coefficients of s^(2k), k = 0..8, for |s| <= 0.172.
_ATANH = [2.0 / (2 * k + 1) for k in range(9)]
# cos(y) and sin(y) / y Taylor coefficients (in y^2) for |y| <= pi/4.
_COS = [(-1.0) ** k / float(np.prod(np.arange(1, 2 * k + 1, dtype=np.float64))) for k in range(9)]
_SIN = [(-1.0) ** k / float(np.prod(np.arange(1, 2 * k + 2, dtype=np.float64))) for k in range(9)]
_HALF_PI = 1.5707963267948966


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    mixed: np.ndarray = z ^ (z >> np.uint64(31))
    return mixed


_POLYNOMIALS = np.array([_ATANH, _COS, _SIN])[:, ::-1, None].copy()  # (3, terms, 1), highest first


def _three_polynomials(s2: np.ndarray, y2: np.ndarray) -> np.ndarray:
    """(3, n) for (n,) arguments: the atanh series at s2, the cos and sin / y series at y2, by
    Horner's rule in one pass over the stacked arguments (few numpy calls for small n), with
    separate, never fused, multiplies and adds."""
    x = np.stack([s2, y2, y2])
    result: np.ndarray = x * _POLYNOMIALS[:, 0]
    for coefficient in _POLYNOMIALS[:, 1:-1].transpose(1, 0, 2):
        result += coefficient
        result *= x
    result += _POLYNOMIALS[:, -1]
    return result


def _box_muller(uniform_a: np.ndarray, uniform_b: np.ndarray) -> np.ndarray:
    """sqrt(-2 log a) cos(2 pi b) for (n,) float64 a in (0, 1] and b in [0, 1).

    log a: a = m 2**e with m in [sqrt(1/2), sqrt(2)), log a = e ln 2 + 2 atanh((m - 1) / (m + 1)).
    cos 2 pi b: 4b = q + f (the quadrant q and f in [0, 1), both exact), cos(2 pi b) =
    cos(q pi/2 + x) with x = f pi/2, taken through y = f pi/2 or (1 - f) pi/2 (exact for
    f >= 1/2) in [0, pi/4], where the series converge fast.
    """
    m, e = np.frexp(uniform_a)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = (e - low).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    t = uniform_b * 4.0
    quadrant = np.floor(t)
    f = t - quadrant
    upper = f > 0.5
    y = np.where(upper, 1.0 - f, f) * _HALF_PI
    atanh2, cos_y, sin_y = _three_polynomials(s * s, y * y)
    log_a = e * _LN2_HI + (e * _LN2_LO + s * atanh2)
    sin_y *= y
    cos_x = np.where(upper, sin_y, cos_y)
    sin_x = np.where(upper, cos_y, sin_y)
    cos_b = np.choose(quadrant.astype(np.int64), [cos_x, -sin_x, -cos_x, sin_x])
    normal: np.ndarray = np.sqrt(-2.0 * log_a) * cos_b
    return normal


def _rows(row_offset: int, rows: int) -> np.ndarray:
    """Row indices `row_offset + i` as uint64, counted modulo 2**64 as the counters are."""
    indices: np.ndarray = np.arange(rows, dtype=np.uint64) + np.uint64(row_offset)
    return indices


def _check_seed(seed: int) -> None:
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed}")


def gaussian_noise(seed: int, rows: int, cols: int, row_offset: int = 0) -> np.ndarray:
    """Standard-normal noise for rows `row_offset, row_offset + 1, ...` of stream `seed`.

    Args:
        seed: the stream, in [0, 2**64).
        rows: how many rows.
        cols: values per row.
        row_offset: the index of the first row in the stream (counted modulo 2**64).

    Returns:
        A (rows, cols) float32 array whose entry (i, j) depends only on (seed, row_offset + i, j).

    Raises:
        ValueError: `seed` is outside [0, 2**64).
    """
    _check_seed(seed)
    if _COMPILED is None:
        return _numpy_gaussian_noise(seed, rows, cols, row_offset)
    noise = np.empty((rows, cols), dtype=np.float32)
    _COMPILED.gaussian_noise(seed, row_offset, rows, cols, _CONSTANTS, noise)
    return noise


def uniform_noise(seed: int, rows: int, cols: int, row_offset: int = 0) -> np.ndarray:
    """Uniforms in [0, 1) for rows `row_offset, row_offset + 1, ...` of stream `seed`.

    A stream of its own (another key), exact on every machine (integer hashing and one exact
    scaling). Discrete actions draw one per (row, branch).

    Args:
        seed: the stream, in [0, 2**64).
        rows: how many rows.
        cols: values per row.
        row_offset: the index of the first row in the stream (counted modulo 2**64).

    Returns:
        A (rows, cols) float64 array whose entry (i, j) depends only on (seed, row_offset + i, j).

    Raises:
        ValueError: `seed` is outside [0, 2**64).
    """
    _check_seed(seed)
    if _COMPILED is None:
        return _numpy_uniform_noise(seed, rows, cols, row_offset)
    uniform = np.empty((rows, cols), dtype=np.float64)
    _COMPILED.uniform_noise(seed, row_offset, rows, cols, uniform)
    return uniform


def _numpy_gaussian_noise(seed: int, rows: int, cols: int, row_offset: int = 0) -> np.ndarray:
    """`gaussian_noise` in numpy: the definition the compiled kernel follows."""
    key = _splitmix64(np.array([seed], dtype=np.uint64))
    row = _rows(row_offset, rows)[:, None, None]
    col = np.arange(cols, dtype=np.uint64)[None, :, None]
    pair = np.arange(2, dtype=np.uint64)[None, None, :]
    counter = (row * np.uint64(cols) + col) * np.uint64(2) + pair  # two uniforms per entry
    with np.errstate(over="ignore"):
        bits = _splitmix64(key ^ _splitmix64(counter)) >> np.uint64(11)  # (rows, cols, 2)
    scale = 2.0**-53
    uniform_a = (bits[..., 0].ravel().astype(np.float64) + 1.0) * scale  # (0, 1]
    uniform_b = bits[..., 1].ravel().astype(np.float64) * scale  # [0, 1)
    return _box_muller(uniform_a, uniform_b).astype(np.float32).reshape(rows, cols)


def _numpy_uniform_noise(seed: int, rows: int, cols: int, row_offset: int = 0) -> np.ndarray:
    """`uniform_noise` in numpy: the definition the compiled kernel follows."""
    key = _splitmix64(np.array([seed ^ _UNIFORM_DOMAIN], dtype=np.uint64))
    row = _rows(row_offset, rows)[:, None]
    col = np.arange(cols, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        bits = _splitmix64(key ^ _splitmix64(row * np.uint64(cols) + col)) >> np.uint64(11)
    uniform: np.ndarray = bits.astype(np.float64) * 2.0**-53
    return uniform


_CONSTANTS = np.concatenate([[_LN2_HI, _LN2_LO, _SQRT_HALF, _HALF_PI], _POLYNOMIALS.ravel()])
"""The float64 constants of the compiled kernel, in its order (see `_native.c`)."""

_PROBE = ((0, 0, 3, 7), (2**64 - 1, 2**64 - 2, 4, 5), (0x9E3779B97F4A7C15, 10**12, 2, 21))
"""(seed, row_offset, rows, cols) streams on which the compiled noise must give numpy's bits."""


def _compiled_noise() -> ModuleType | None:
    """The compiled kernels if they give numpy's bits on `_PROBE`, else None."""
    if KERNELS is None:
        return None
    for seed, row_offset, rows, cols in _PROBE:
        gaussian = np.empty((rows, cols), dtype=np.float32)
        uniform = np.empty((rows, cols), dtype=np.float64)
        KERNELS.gaussian_noise(seed, row_offset, rows, cols, _CONSTANTS, gaussian)
        KERNELS.uniform_noise(seed, row_offset, rows, cols, uniform)
        if not (np.array_equal(gaussian.view(np.uint32), _numpy_gaussian_noise(
                seed, rows, cols, row_offset).view(np.uint32)) and np.array_equal(
                uniform.view(np.uint64), _numpy_uniform_noise(
                seed, rows, cols, row_offset).view(np.uint64))):
            return None
    return KERNELS


_COMPILED = _compiled_noise()
"""The kernels that draw the noise: the compiled ones where built and exact, else None (numpy)."""
