"""Verdicts, the markdown table and the header line of the hostile-load probe."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

MEMORY_BUDGET_MIB = 32.0
LATENCY_BUDGET_MS = 100.0
CHECK_NAMES = {
    "mem-peak": f"peak RSS at most +{MEMORY_BUDGET_MIB:.0f} MiB over the start",
    "mem-after": f"RSS after within {MEMORY_BUDGET_MIB:.0f} MiB of the start",
    "rfc-ending": "the attacker's connection ends with the code RFC 9113 names",
    "grpc-during": f"gRPC probes during: no failure, p99 < {LATENCY_BUDGET_MS:.0f} ms",
    "http-during": f"HTTP probes during: no failure, p99 < {LATENCY_BUDGET_MS:.0f} ms",
    "grpc-after": f"gRPC probes after: no failure, p99 < {LATENCY_BUDGET_MS:.0f} ms",
    "http-after": f"HTTP probes after: no failure, p99 < {LATENCY_BUDGET_MS:.0f} ms",
    "no-crash": "the target process neither gone, replaced nor silent",
}


def header() -> dict[str, Any]:
    """When and where: the date (UTC), CPUs, CPU model, load and package versions."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for package in ("ray", "grpcio", "h2", "hyperframe", "hpack"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "nproc": len(os.sched_getaffinity(0)), "cpu": model,
            "python": platform.python_version(), "loadavg_start": os.getloadavg(),
            "versions": versions}


def header_line(info: dict[str, Any]) -> str:
    versions = ", ".join(f"{name} {version}" for name, version in info["versions"].items())
    load = " ".join(f"{value:.1f}" for value in info["loadavg_start"])
    return (f"hostile_load {info['date_utc']} UTC; nproc {info['nproc']}; {info['cpu']}; "
            f"Python {info['python']}; {versions}; load average at start {load}")


def verdict(checks: dict[str, bool]) -> str:
    failed = [name for name, passed in checks.items() if not passed]
    return "pass" if not failed else "FAIL: " + ", ".join(failed)


def _latency(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("n"):
        return "-"
    if summary["p50_ms"] is None:
        return f"all {summary['n']} failed"
    text = f"{summary['p50_ms']:.0f}/{summary['p99_ms']:.0f}"
    if summary["failures"]:
        text += f" ({summary['failures']}/{summary['n']} fail)"
    elif summary["n"] < 20:
        text += f" (n={summary['n']})"
    return text


def _memory(memory: dict[str, Any]) -> str:
    if memory.get("before") is None:
        return "-"
    peak, after = memory.get("peak"), memory.get("after")
    parts = [f"{memory['before']:.0f}", "-" if peak is None else f"{peak:.0f}",
             "-" if after is None else f"{after:.0f}"]
    growth = []
    if peak is not None:
        growth.append(f"{peak - memory['before']:+.0f}")
    if after is not None:
        growth.append(f"{after - memory['before']:+.0f}")
    return "/".join(parts) + (f" ({'/'.join(growth)})" if growth else "")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table: one row per attack and target."""
    head = ("| attack | target | sent | attacker's connection(s) ended | RSS MiB before/peak/after "
            "(growth) | target CPU s | HAProxy RSS MiB, CPU s | gRPC during p50/p99 ms | "
            "HTTP during | gRPC after | HTTP after | crash | notes | verdict |")
    lines = [head, "|" + "---|" * 14]
    for row in rows:
        probes = row.get("probes", {})
        cpu = row.get("cpu_s")
        cpu_text = "-" if cpu is None else f"{cpu:.1f} ({row['cpu_share']:.0%})"
        haproxy = "-"
        if row.get("haproxy_memory"):
            haproxy = f"{_memory(row['haproxy_memory'])}, {row.get('haproxy_cpu_s', '-')}"
        cells = [row["attack"], row["target"], row.get("sent", "-"), row.get("ending", "-"),
                 _memory(row.get("memory", {})), cpu_text, haproxy,
                 _latency(probes.get("during", {}).get("grpc")),
                 _latency(probes.get("during", {}).get("http")),
                 _latency(probes.get("after", {}).get("grpc")),
                 _latency(probes.get("after", {}).get("http")),
                 row.get("crash") or "no", row.get("notes") or "", row["verdict"]]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)
