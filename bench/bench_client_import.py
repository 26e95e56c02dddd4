"""The client's import time: each statement in fresh interpreters, rounds interleaved, medians,
against importing the policy package's agent (torch) in the same run.

    .venv/bin/python bench/bench_client_import.py --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

STATEMENTS = {
    "client, HTTP": "from huggy_agent_client import RemoteAgent",
    "client, gRPC": "from huggy_agent_client import GrpcRemoteAgent",
    "huggy_agent.remote": "from huggy_agent.remote import RemoteAgent",
    "policy (baseline)": "from huggy_agent.agent import HuggyAgent",
}
"""What is timed; the last is the baseline each ratio is against."""


def seconds(statement: str) -> float:
    """Wall time of a fresh interpreter that runs `statement` and exits."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="fresh interpreters per statement")
    rounds = parser.parse_args().rounds
    times: dict[str, list[float]] = {name: [] for name in STATEMENTS}
    seconds("pass")  # warm the file cache once
    for _ in range(rounds):
        for name, statement in STATEMENTS.items():
            times[name].append(seconds(statement))
    floor = statistics.median(seconds("pass") for _ in range(rounds))
    baseline = statistics.median(times["policy (baseline)"])
    print(f"a bare interpreter: {floor * 1000:.0f} ms (median of {rounds})")
    for name, measured in times.items():
        median = statistics.median(measured)
        print(f"{name:20s} {median * 1000:6.0f} ms  {median / baseline:5.2f}x the baseline")


if __name__ == "__main__":
    main()
