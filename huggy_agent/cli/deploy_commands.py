"""`huggy serve`: parser only; the work is imported from `deploy` when the command runs."""

from __future__ import annotations

import argparse


def add_parsers(subparsers: argparse._SubParsersAction) -> None:
    """Register `huggy serve`."""
    parser = subparsers.add_parser(
        "serve", help="serve a policy over HTTP with Ray Serve until Ctrl-C or SIGTERM",
        description="Serve a policy over HTTP (POST /v1/act, GET /v1/healthz, /v1/info, "
                    "/v1/openapi.json) with Ray Serve and dynamic batching, until Ctrl-C or "
                    "SIGTERM.")
    parser.add_argument("--policy", default=None,
                        help="a .onnx, an ML-Agents .pt or a results folder (default: bundled)")
    parser.add_argument("--accelerator", choices=("auto", "cpu", "gpu", "npu"), default="auto",
                        help="what each replica is pinned to; auto: NPU, then GPU, then CPU, "
                             "whichever the cluster has (default: auto)")
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    scaling = parser.add_mutually_exclusive_group()
    scaling.add_argument("--replicas", type=int, default=1, help="fixed number of replicas")
    scaling.add_argument("--autoscale", action="store_true",
                         help="scale between 1 and --max-replicas replicas on load")
    parser.add_argument("--max-replicas", type=int, default=4)
    parser.add_argument("--num-cpus", type=float, default=1.0, help="CPUs each replica holds")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: 8000)")
    parser.add_argument("--grpc-port", type=int, default=None,
                        help="also serve the gRPC ingress (/huggy.v1.Policy/Act) on this port")
    parser.add_argument("--address", default=None,
                        help="join this Ray cluster (e.g. 127.0.0.1:6379) instead of starting one")
    parser.add_argument("--ingress", choices=("haproxy", "proxy", "direct"), default="haproxy",
                        help="HTTP path into the replicas: haproxy (fastest, default), proxy "
                             "(Serve's Python proxy), or direct (each replica also listens on its "
                             "own port from 30000; --port stays Serve's proxy)")
    parser.add_argument("--max-batch-size", type=int, default=256,
                        help="most observations in one forward pass (default: 256)")
    parser.add_argument("--batch-wait-ms", type=float, default=0.0,
                        help="how long a batch waits for more requests (default: 0, take what "
                             "is queued)")
    parser.add_argument("--max-rows", type=int, default=256,
                        help="most observations in one request (default: 256)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--start-timeout", type=float, default=180.0,
                        help="seconds to wait for the replicas to start (default: 180)")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from deploy.runner import serve_forever
    from deploy.serve import AppArgs

    app_args = AppArgs(
        policy=args.policy, accelerator=args.accelerator, precision=args.precision,
        replicas=args.replicas, autoscale=args.autoscale, max_replicas=args.max_replicas,
        num_cpus=args.num_cpus, max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_ms / 1000, max_rows=args.max_rows,
        max_body_bytes=args.max_body_bytes)
    return serve_forever(app_args, host=args.host, port=args.port, ingress=args.ingress,
                         address=args.address, start_timeout_s=args.start_timeout,
                         grpc_port=args.grpc_port)
