"""The kernel-path matrix behind the numerical contract: how far fp32 actions move between batch
splits, thread counts and CPU code paths, measured, so the stated tolerance is derived.

Each configuration runs in its own process (the kernel-selection knobs are read at start-up):

    default                    whatever torch, MKL and oneDNN pick on this CPU
    OMP_NUM_THREADS=1          one thread
    avx2                       ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
    default-isa                ATEN_CPU_CAPABILITY=default (torch's scalar kernels)

In each, every Huggy fixture (.pt and .onnx), run by each CPU engine (`torch` and
`onnxruntime`), computes deterministic and seeded stochastic actions for 1,025 observations from
the normalizer's statistics plus 64 rows scaled by 1e3, as one batch, row by row, split
1,024 + 1, and in 17-row pieces. Printed: the worst difference of each
configuration from the float64 reference and between its own splits, and the worst difference
between any two configurations. The contract's tolerance (`huggy_agent.numerics`) must exceed the
worst of these with a margin.

    .venv/bin/python bench/numerics_matrix.py [--fixtures tests/fixtures/huggy]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default-isa": {"ATEN_CPU_CAPABILITY": "default"},
}
SPLITS = ("batch", "rows", "1024+1", "17s")
ENGINES = ("torch", "onnxruntime")


def _policies(fixtures: Path) -> list[Path]:
    return sorted([*fixtures.glob("*/Huggy.onnx"), *fixtures.glob("*/Huggy/Huggy-*.pt")])


def _pieces(rows: int, split: str) -> list[tuple[int, int]]:
    size = {"batch": rows, "rows": 1, "1024+1": 1024, "17s": 17}[split]
    return [(start, min(start + size, rows)) for start in range(0, rows, size)]


def child(fixtures: Path, out: Path) -> None:
    """Compute every policy's actions under every split; save them with the float64 reference."""
    from huggy_agent import HuggyAgent
    from huggy_agent.noise import gaussian_noise
    from huggy_agent.reference import canonical_observations, float64_actions

    arrays = {}
    for index, path in enumerate(_policies(fixtures)):
        for engine in ENGINES:
            agent = HuggyAgent(path, device="cpu", engine=engine)
            obs = canonical_observations(agent.loaded, 1025)
            obs = np.concatenate([obs, obs[1:65] * 1e3])
            noise = gaussian_noise(5, len(obs), agent.act_size)
            arrays[f"{index}/f64/det"] = float64_actions(agent.loaded, obs)
            arrays[f"{index}/f64/sto"] = float64_actions(agent.loaded, obs, noise)
            for split in SPLITS:
                det, sto = [], []
                for start, stop in _pieces(len(obs), split):
                    det.append(agent.compute_action(obs[start:stop]))
                    sto.append(agent.compute_action(obs[start:stop], False, seed=5,
                                                    row_offset=start))
                arrays[f"{index}/{engine}:{split}/det"] = np.concatenate(det)
                arrays[f"{index}/{engine}:{split}/sto"] = np.concatenate(sto)
    np.savez(out, **arrays)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=REPO / "tests" / "fixtures" / "huggy")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.fixtures, args.child)
        return 0
    from huggy_agent.tables import format_table

    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, extra in CONFIGS.items():
            out = Path(folder) / f"{len(results)}.npz"
            subprocess.run([sys.executable, __file__, "--fixtures", str(args.fixtures), "--child",
                            str(out)], env={**os.environ, **extra}, check=True)
            results[name] = dict(np.load(out))
    rows = []
    policies = len(_policies(args.fixtures))
    paths = [f"{e}:{s}" for e in ENGINES for s in SPLITS]
    for name, arrays in results.items():
        row = [name]
        for part in (slice(0, 1025), slice(1025, None)):  # on scale; scaled by 1e3
            vs_f64 = max(np.abs(arrays[f"{i}/{s}/{m}"][part] - arrays[f"{i}/f64/{m}"][part]).max()
                         for i in range(policies) for s in paths for m in ("det", "sto"))
            between = max(np.abs(arrays[f"{i}/{a}/{m}"][part] - arrays[f"{i}/{b}/{m}"][part]).max()
                          for i in range(policies) for a, b in itertools.combinations(paths, 2)
                          for m in ("det", "sto"))
            row += [f"{vs_f64:.3e}", f"{between:.3e}"]
        rows.append(tuple(row))
    across = max(np.abs(results[a][key] - results[b][key]).max()
                 for a, b in itertools.combinations(results, 2) for key in results[a]
                 if "/f64/" not in key)
    print(format_table(["configuration", "vs float64", "between paths",
                        "x1e3: vs float64", "x1e3: between paths"], rows))
    print("(paths: each engine x each split; x1e3: the 64 rows scaled by 1e3, where a policy "
          "without a normalizer sees inputs far off its training scale)")
    print(f"\nmax between configurations (same split): {across:.3e}")
    print(f"policies: {policies}, rows each: 1,089 (1,025 + 64 scaled by 1e3), "
          "deterministic and seeded stochastic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
