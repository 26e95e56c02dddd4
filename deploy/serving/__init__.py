"""Serving policies over HTTP and gRPC with Ray Serve: `huggy serve` (`server`), or
`serve run deploy.serving.app:app ...` (`app`). One module per concern:

- what is served: `catalogue` (the policies, read once per process, the default and the A/B
  split), `settings` (batch settings, live through `user_config`, and the app builder's
  arguments), `limits` (what one client may make `huggy serve` hold: HAProxy's caps);
- a request: `routes` (routes and the API key), `parsing` (act requests, columnar and row
  forms), `responses` (bodies and the JSON error format), `openapi` (the OpenAPI 3.1 document);
- a replica: `held` (the policies it holds, LRU), `batching` (its batch queue), `runner` (act
  bodies to answers), `metrics` (its counters), `service` (what every ingress calls),
  `http_server` (its HTTP/1.1 listener for HAProxy), `grpc_ingress` (the gRPC method),
  `replica` (the Serve deployment);
- around them: `haproxy` and `haproxy_admin` (Ray's HAProxy with huggy's changes, its admin
  socket), `processes` (what /proc shows), `server` (start, deploy, run until a signal, stop).

The HTTP contract itself (paths, headers, limits, keys) is `huggy_agent_client.http_api`, and the
client `huggy_agent_client.remote.RemoteAgent`: neither needs Ray, torch or this package.
"""
