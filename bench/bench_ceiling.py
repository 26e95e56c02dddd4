"""The ceiling under batch throughput: this machine's float32 multiply-add peak, measured now,
against what the policy's large batches reach.

A batch of observations costs `huggy_agent.benchmark.flops_per_observation` floating-point
operations per row (~1.13 MFLOP for Huggy: the Linear layers' multiply-adds), so no float32
implementation can pass more than peak / flops observations per second. The peak is measured,
not looked up: a small C loop of independent fused multiply-adds on the widest vectors the
compiler targets here (`cc -O3 -march=native`, GCC vector extensions, so it builds on x86-64 and
Arm alike), one process per core, all at once, best of `--repeats`. Then `huggy benchmark`'s
batch figures (our `compute_action` through `auto`, and onnxruntime on the policy's ML-Agents
file) in the same run, each as a share of that ceiling, and what a given multiple of
onnxruntime's throughput (`--target`, default 1.5x) would need.

Needs a C compiler (`cc`). Not a test: figures depend on the machine and its load.

    .venv/bin/python bench/bench_ceiling.py [--batch 4096] [--threads N] [--target 1.5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from huggy_agent.benchmark import run_benchmark  # noqa: E402
from huggy_agent.tables import format_table  # noqa: E402

FMA_LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__AVX512F__)
#define VECTOR_BYTES 64
#elif defined(__AVX__)
#define VECTOR_BYTES 32
#else
#define VECTOR_BYTES 16
#endif
typedef float vec __attribute__((vector_size(VECTOR_BYTES)));  /* one register */
enum { ACCUMULATORS = 12, LANES = VECTOR_BYTES / 4 };
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 100000000L;
    vec acc[ACCUMULATORS], x, y;
    for (int k = 0; k < LANES; k++) { x[k] = 1.0000001f; y[k] = 0.9999999f; }
    for (int i = 0; i < ACCUMULATORS; i++) for (int k = 0; k < LANES; k++) acc[i][k] = (float)i;
    double start = now();
    for (long n = 0; n < rounds; n++) {
#pragma GCC unroll 12
        for (int i = 0; i < ACCUMULATORS; i++) acc[i] = acc[i] * x + y;
    }
    double seconds = now() - start;
    float sum = 0.0f;
    for (int i = 0; i < ACCUMULATORS; i++) for (int k = 0; k < LANES; k++) sum += acc[i][k];
    printf("%.6f %g\n", 2.0 * LANES * ACCUMULATORS * rounds / seconds / 1e9, sum);
    return 0;
}
"""
"""Twelve independent accumulator chains, each one register of the widest vectors the target
has (AVX-512, AVX or 128-bit): enough to cover the multiply-add latency of every current core (4
to 5 cycles x 2 pipes on Zen 2 to Zen 4 and Golden Cove, fewer on Arm's), and with `x` and `y`
within the 16 registers of AVX2 (a 64-byte vector there takes two registers a chain, and the
chains spill to memory: a tenth of the peak). The sum is printed so that the loop cannot be
optimized away."""


def build_fma_loop(folder: Path) -> Path:
    """The peak loop compiled for this machine (`cc -O3 -march=native -ffp-contract=fast`)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SystemExit("bench_ceiling needs a C compiler (cc or gcc) on PATH")
    source, binary = folder / "fma_peak.c", folder / "fma_peak"
    source.write_text(FMA_LOOP)
    subprocess.run([compiler, "-O3", "-march=native", "-ffp-contract=fast", str(source), "-o",
                    str(binary)], check=True)
    return binary


def fma_peak_gflops(binary: Path, processes: int, repeats: int) -> float:
    """The summed GFLOP/s of `processes` copies of the loop run at once, best of `repeats`."""
    best = 0.0
    for _ in range(repeats):
        running = [subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
                   for _ in range(processes)]
        best = max(best, sum(float(run.communicate()[0].split()[0]) for run in running))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096, help="rows per call (default 4096)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for the policy, onnxruntime and the peak loop's processes "
                             "(default: torch's default, one per core)")
    parser.add_argument("--target", type=float, default=1.5,
                        help="a multiple of onnxruntime's throughput to set against the ceiling")
    parser.add_argument("--repeats", type=int, default=3, help="peak-loop runs (best counts)")
    args = parser.parse_args()
    figures = run_benchmark(threads=args.threads, rounds=3, calls=50, batch_size=args.batch,
                            engines=("auto",))
    threads = figures["threads"]
    with tempfile.TemporaryDirectory() as folder:
        peak = fma_peak_gflops(build_fma_loop(Path(folder)), threads, args.repeats)
    flops = figures["flops_per_obs"]
    ceiling = peak * 1e9 / flops
    by_name = {result["name"]: result["batch_obs_per_s"] for result in figures["results"]}
    onnxruntime = by_name["onnxruntime"]
    rows = [(name, rate, f"{rate / ceiling:.0%}", f"{rate / onnxruntime:.2f}x")
            for name, rate in by_name.items()]
    wanted = args.target * onnxruntime
    rows.append((f"{args.target:g}x onnxruntime (the target)", wanted, f"{wanted / ceiling:.0%}",
                 f"{args.target:.2f}x"))
    print(f"{os.cpu_count()} cores, {threads} threads; multiply-add peak {peak:.1f} GFLOP/s "
          f"(the loop on {threads} processes at once); {flops / 1e6:.3f} MFLOP per observation: "
          f"ceiling {ceiling:,.0f} obs/s")
    print(format_table([f"batch {args.batch}", "obs/s", "of the ceiling", "vs onnxruntime"],
                       rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
