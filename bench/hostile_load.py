"""A bounded hostile-load probe of `huggy serve`'s HTTP and gRPC ingress, with a stock grpcio
server and the Unity link's server (`envs.http2.UnaryServer`) as references: one table row per
attack and target.

    .venv/bin/python bench/hostile_load.py                       # everything (~30 minutes)
    .venv/bin/python bench/hostile_load.py --quick               # smaller counts, a smoke run
    .venv/bin/python bench/hostile_load.py --list                # the attacks and their targets
    .venv/bin/python bench/hostile_load.py --attacks ping_flood_unread,bad_preface \\
        --targets grpcio,envs --out out/hostile.json --markdown out/hostile.md

Targets (`--targets`, default all):

    huggy   `huggy serve --accelerator cpu --num-cpus 1 --port P --grpc-port G` started here on
            free ports (the bundled policy), and for the rows that need one a second instance
            with `--api-key-file` (target `huggy+key`); each is stopped with SIGTERM, waited
            for, and checked for leftover processes (Ray's, HAProxy) of its own
    grpcio  a stock `grpc.server(ThreadPoolExecutor(...))` in a subprocess answering
            /huggy.v1.Policy/Act with a constant, max receive 1 MiB (huggy's --max-body-bytes)
    envs    the Unity link's server in a subprocess, answering every call in a loop of its own

The server is driven only through its CLI, the network and /proc, so the probe works across
rewrites of the server. Every attack is bounded in count and time (none longer than 60 s); its
frames are built with hyperframe and hpack and written on raw sockets (`bench/hostile/`).

Per row: what the attacker sent and how its connection(s) ended (GOAWAY and its code,
RST_STREAM codes, closed by the peer, or still open at the bound); the target process's VmRSS
before, at its peak during (sampled every 100 ms, and the kernel's exact high-water mark after a
reset through /proc/PID/clear_refs) and a few seconds after (MiB); its CPU seconds; 20 normal
gRPC calls (and, for huggy, 20 `POST /v1/act` through HAProxy) spread over the attack and 20 + 20
after it, from a process of their own: p50/p99 ms and failures; whether the target crashed (gone,
replaced or no longer answering). For huggy the process measured is the Serve replica (the Ray
worker titled `ServeReplica` whose open files name this instance's RAY_TMPDIR).

The verdict checks: peak and after RSS within +32 MiB of the start; the ending RFC 9113 names
where it names one; probes' p99 under 100 ms and no failure during (not for the rows of
concurrent valid requests, where the probes are more of the same load) and after; no crash; and
the rows' own targets (1,000 concurrent requests all 200; 3,000 all 200 or JSON 503 with
Retry-After and the replica never out of HAProxy's rotation; a new request within 1 s during the
slowloris; a 4xx within 50 ms for 40,000 JSON keys; at most 64 KiB of a request without a valid
key read before its refusal).

Rows run one after another: per attack huggy, grpcio, envs back to back, then the keyed
instance's rows. The grpcio and envs servers start afresh before each row; huggy's replica
serves every row, so a row's memory growth is counted from what earlier rows left (a lower
bound where its allocator kept freed memory). A row waits (up to 180 s) for its target to
answer; where the replica at a row's start is not the one the previous row ended with, the
previous row is blamed for its replacement; a target that never answers again skips the row.

Output: a header line (date UTC, nproc, CPU model, versions of ray, grpcio, h2, hyperframe,
hpack), the markdown table on stdout (and `--markdown FILE`), every measurement as JSON
(`--out FILE`; then each huggy instance's output and Serve's logs are kept in FILE's folder,
under `<stem>-logs/`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hostile.attacks import ATTACKS, KEYED, Attack, Context, Outcome
from hostile.probes import ProbeClients, summary, worker_main
from hostile.report import (
    LATENCY_BUDGET_MS,
    MEMORY_BUDGET_MIB,
    header,
    header_line,
    table,
    verdict,
)
from hostile.targets import (
    NOT_ANSWERING,
    HuggyTarget,
    Sampler,
    SubprocessTarget,
    Target,
    cpu_seconds,
    start_ticks,
)

FAMILIES = ("huggy", "grpcio", "envs")
SETTLE_S = 3.0
"""Seconds between the attack's end (its connections closed) and the `after` RSS."""
READY_TIMEOUT_S = 180.0
"""The longest a row waits for its target to answer (a Serve replica replaced after a stall
took 30-60 s here)."""


def family(target_name: str) -> str:
    return "huggy" if target_name.startswith("huggy") else target_name


def crash_of(target: Target, pid: int, ticks: int | None, after: dict[str, Any]) -> str | None:
    """What went wrong with the target process during the row, or None."""
    if start_ticks(pid) != ticks:
        now = target.pid()
        if isinstance(target, HuggyTarget):
            return f"replica {pid} gone" + (f", replaced by {now}" if now else "")
        return f"process {pid} exited"
    silent = [kind for kind, results in after.items() if isinstance(results, list) and results
              and not any(result["ok"] for result in results)]
    if "error" in after or silent:
        return "not answering (" + ", ".join(silent or ["probe worker"]) + ")"
    return None


def judge(attack: Attack, outcome: Outcome, row: dict[str, Any],
          during: dict[str, Any]) -> dict[str, bool]:
    """Every target of the row: name -> met."""
    checks: dict[str, bool] = {}
    memory = row["memory"]
    if memory.get("before") is not None and memory.get("peak") is not None:
        checks["mem-peak"] = memory["peak"] - memory["before"] <= MEMORY_BUDGET_MIB
    if memory.get("before") is not None and memory.get("after") is not None:
        checks["mem-after"] = memory["after"] - memory["before"] <= MEMORY_BUDGET_MIB
    if outcome.ending_ok is not None:
        checks["rfc-ending"] = outcome.ending_ok
    for phase in ("during", "after"):
        if phase == "during" and not attack.latency_during:
            continue
        for kind in ("grpc", "http"):
            stats = row["probes"][phase].get(kind)
            if stats and stats["n"]:
                checks[f"{kind}-{phase}"] = (stats["failures"] == 0
                                             and stats["p99_ms"] < LATENCY_BUDGET_MS)
    checks["no-crash"] = row["crash"] is None
    checks.update(outcome.checks)
    if outcome.judge is not None:
        checks.update(outcome.judge(during))
    return checks


def run_row(attack: Attack, targets: Targets, name: str, quick: bool) -> dict[str, Any]:
    """One attack on the target `name`, measured (module docstring)."""
    target, probes, note = targets.ready(name)
    row: dict[str, Any] = {"attack": attack.name, "target": target.name,
                           "summary": attack.summary}
    if note:
        row["target_note"] = note
    pid = target.pid()
    targets.blame_previous(name, pid)
    if pid is None or note == NOT_ANSWERING:
        row.update(verdict=f"skipped: the target did not answer within {READY_TIMEOUT_S:.0f} s",
                   crash=NOT_ANSWERING, checks={})
        return row
    ticks = start_ticks(pid)
    haproxy = target.listening_haproxy() if isinstance(target, HuggyTarget) else None
    time.sleep(0.5)
    sampler = Sampler(pid)
    haproxy_sampler = Sampler(haproxy) if haproxy else None  # the front door
    haproxy_cpu_before = cpu_seconds(haproxy) if haproxy else None
    cpu_before = cpu_seconds(pid)
    probes.start_during(attack.window[1 if quick else 0])
    started = time.monotonic()
    try:
        outcome = attack.run(Context(target, quick))
    except Exception:  # noqa: BLE001 - the row records the probe's own failure and goes on
        outcome = Outcome(sent="(the attack itself failed)", ending="-",
                          details={"error": traceback.format_exc()})
    duration = time.monotonic() - started
    during = probes.stop_during()
    time.sleep(SETTLE_S)
    trace = sampler.finish()
    haproxy_trace = haproxy_sampler.finish() if haproxy_sampler else None
    haproxy_cpu_after = cpu_seconds(haproxy) if haproxy else None
    cpu_after = cpu_seconds(pid)
    after = probes.after()
    row.update(
        sent=outcome.sent, ending=outcome.ending, ending_ok=outcome.ending_ok,
        notes=outcome.notes, pid=pid, duration_s=round(duration, 2),
        memory={"before": trace.before, "peak": trace.peak, "peak_sampled": trace.peak_sampled,
                "peak_hwm": trace.peak_hwm, "after": trace.after, "samples": trace.samples,
                "fds_before": trace.fds_before, "fds_peak": trace.fds_peak,
                "fds_after": trace.fds_after},
        probes={phase: {kind: summary(results[kind]) for kind in ("grpc", "http")
                        if isinstance(results.get(kind), list)}
                for phase, results in (("during", during), ("after", after))},
        probe_results={"during": during, "after": after},
        details=outcome.details)
    if cpu_before is not None and cpu_after is not None:
        row["cpu_s"] = round(cpu_after - cpu_before, 2)
        row["cpu_share"] = row["cpu_s"] / max(duration + SETTLE_S, 1e-3)
    if haproxy_trace is not None:
        row["haproxy_memory"] = {"before": haproxy_trace.before, "peak": haproxy_trace.peak,
                                 "after": haproxy_trace.after}
        if haproxy_cpu_before is not None and haproxy_cpu_after is not None:
            row["haproxy_cpu_s"] = round(haproxy_cpu_after - haproxy_cpu_before, 2)
    if trace.fds_peak is not None and trace.fds_before is not None \
            and trace.fds_peak - trace.fds_before >= 100:
        row["notes"] = "; ".join(filter(None, [row["notes"], f"target descriptors "
                                               f"{trace.fds_before} -> {trace.fds_peak} at peak"]))
    row["crash"] = crash_of(target, pid, ticks, after)
    checks = judge(attack, outcome, row, during)
    row["checks"] = checks
    row["verdict"] = verdict(checks)
    return row


class Targets:
    """The targets of this run, started when first needed and stopped at the end."""

    def __init__(self, logs_dir: Path | None) -> None:
        self.running: dict[str, tuple[Target, ProbeClients]] = {}
        self.reports: dict[str, dict[str, object]] = {}
        self.last_rows: dict[str, dict[str, Any]] = {}
        self._logs_dir = logs_dir

    def get(self, name: str) -> tuple[Target, ProbeClients]:
        if name not in self.running:
            print(f"# starting {name} ...", file=sys.stderr, flush=True)
            target: Target
            if family(name) == "huggy":
                target = HuggyTarget(with_key=name == KEYED)
                target.logs_dir = self._logs_dir
            else:
                target = SubprocessTarget(name)
            target.start()
            self.running[name] = (target, ProbeClients(target.probe_config()))
        return self.running[name]

    def ready(self, name: str) -> tuple[Target, ProbeClients, str | None]:
        """The target `name` once it answers (the subprocess servers started afresh), its
        probe clients (new ones if it moved to another port) and a note if it did not answer
        at first."""
        target, probes = self.get(name)
        config = target.probe_config()
        note = target.ensure_ready(READY_TIMEOUT_S)
        if target.probe_config() != config:
            probes.close()
            probes = ProbeClients(target.probe_config())
            self.running[name] = (target, probes)
        return target, probes, note

    def blame_previous(self, name: str, pid: int | None) -> None:
        """Where `huggy serve`'s replica at the start of a row is not the one that the previous
        row left answering or silent, the previous row caused its replacement: say so there."""
        previous = self.last_rows.get(name)
        target = self.running[name][0]
        if (previous is None or not isinstance(target, HuggyTarget) or "pid" not in previous
                or pid == previous["pid"] or "gone" in (previous.get("crash") or "")):
            return
        previous["crash"] = "; ".join(filter(None, [
            previous.get("crash"), f"replica {previous['pid']} replaced before the next row"
                                   + (f" (by {pid})" if pid else "")]))
        previous["checks"]["no-crash"] = False
        previous["verdict"] = verdict(previous["checks"])

    def stop(self, name: str) -> None:
        target, probes = self.running.pop(name)
        probes.close()
        print(f"# stopping {name} ...", file=sys.stderr, flush=True)
        report = target.stop()
        if isinstance(target, SubprocessTarget):
            report["fresh_starts"] = target.restarts
            target.forget_empty_log()
        self.reports[name] = report

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name)


def plan(attacks: list[Attack], families: set[str]) -> list[tuple[Attack, str]]:
    """The rows to run, in running order: every row of the instance without a key first (per
    attack huggy, grpcio, envs back to back), then the keyed instance's."""
    rows = [(attack, name) for attack in attacks for name in attack.targets
            if family(name) in families]
    return ([row for row in rows if row[1] != KEYED] + [row for row in rows if row[1] == KEYED])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attacks", help="comma-separated attack names (see --list); default all")
    parser.add_argument("--targets", default=",".join(FAMILIES),
                        help="comma-separated: huggy, grpcio, envs (default all)")
    parser.add_argument("--quick", action="store_true", help="smaller counts, a smoke run")
    parser.add_argument("--list", action="store_true", help="list the attacks and exit")
    parser.add_argument("--out", type=Path, help="write every measurement here (JSON)")
    parser.add_argument("--markdown", type=Path, help="write the table here too")
    parser.add_argument("--serve", choices=("grpcio", "envs"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--probe-worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.serve:
        from hostile.targets import serve_main

        serve_main(args.serve, args.port)
        return 0
    if args.probe_worker:
        worker_main()
        return 0
    if args.list:
        for attack in ATTACKS:
            print(f"{attack.name:24} {', '.join(attack.targets):24} {attack.summary}")
        return 0
    known = {attack.name: attack for attack in ATTACKS}
    names = args.attacks.split(",") if args.attacks else list(known)
    unknown = [name for name in names if name not in known]
    families = set(args.targets.split(","))
    if unknown or not families <= set(FAMILIES):
        print(f"unknown attacks {unknown} or targets {sorted(families - set(FAMILIES))}; "
              f"see --list", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    info = header()
    print(header_line(info), flush=True)
    rows: list[dict[str, Any]] = []
    targets = Targets(args.out.with_name(args.out.stem + "-logs") if args.out else None)
    started = time.monotonic()
    try:
        for attack, name in plan([known[name] for name in names], families):
            if name == KEYED and "huggy" in targets.running:
                targets.stop("huggy")
            print(f"# {attack.name} on {name} ...", file=sys.stderr, flush=True)
            row = run_row(attack, targets, name, args.quick)
            print(f"#   {row['verdict']}", file=sys.stderr, flush=True)
            rows.append(row)
            targets.last_rows[name] = row
    finally:
        targets.stop_all()
    order = {attack.name: index for index, attack in enumerate(ATTACKS)}
    rows.sort(key=lambda row: order[row["attack"]])
    markdown = header_line(info) + "\n\n" + table(rows) + "\n"
    print()
    print(table(rows))
    left = {name: report.get("left_after_exit") for name, report in targets.reports.items()
            if report.get("left_after_exit")}
    print(f"\nrun time {time.monotonic() - started:.0f} s; leftover processes: {left or 'none'}")
    document = {"header": info, "quick": args.quick, "run_s": time.monotonic() - started,
                "loadavg_end": os.getloadavg(),
                "targets": targets.reports, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1, default=str))
        print(f"JSON: {args.out}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
