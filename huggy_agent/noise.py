"""Counter-based Gaussian noise on the host.

Entry (i, j) of `gaussian_noise(seed, rows, cols, row_offset)` depends only on
(seed, row_offset + i, j): a batch split into pieces, each given its row offset, gets bit-identical
noise, and so does the same request whether a server batches it alone or with others. SplitMix64
hashes the counter; Box-Muller turns two 53-bit uniforms into one normal. Pure numpy, so the
stream is the same on every machine, whatever device the policy runs on.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
SEED_RANGE = 2**63


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def gaussian_noise(seed: int, rows: int, cols: int, row_offset: int = 0) -> np.ndarray:
    """(rows, cols) float32 standard-normal noise for rows `row_offset ..` of stream `seed`."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed}")
    key = _splitmix64(np.array([seed], dtype=np.uint64))
    row = np.arange(row_offset, row_offset + rows, dtype=np.uint64)[:, None]
    col = np.arange(cols, dtype=np.uint64)[None, :]
    counter = (row * np.uint64(cols) + col) * np.uint64(2)  # two uniforms per entry
    with np.errstate(over="ignore"):
        bits_a = _splitmix64(key ^ _splitmix64(counter))
        bits_b = _splitmix64(key ^ _splitmix64(counter + np.uint64(1)))
    scale = 2.0**-53
    uniform_a = ((bits_a >> np.uint64(11)).astype(np.float64) + 1.0) * scale  # (0, 1]
    uniform_b = (bits_b >> np.uint64(11)).astype(np.float64) * scale  # [0, 1)
    return (np.sqrt(-2.0 * np.log(uniform_a)) * np.cos(2.0 * np.pi * uniform_b)).astype(np.float32)
