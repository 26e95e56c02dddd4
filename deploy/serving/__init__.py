"""Serving policies over HTTP and gRPC with Ray Serve, one room per concern:

    catalogue.py      the served policies (read once per process), default and A/B split
    settings.py       batch settings (live through `user_config`) and the app builder's arguments
    limits.py         what one client may make `huggy serve` hold: HAProxy's caps
    routes.py         routes and the API key
    parsing.py        parsing and validating act requests (columnar and row forms)
    responses.py      response bodies and the JSON error format
    openapi.py        the OpenAPI 3.1 document
    held.py           the table of policies a replica holds (LRU)
    batching.py       a replica's batch queue
    runner.py         a replica's policies, batches and forward passes: act bodies to answers
    metrics.py        a replica's counters, and Ray's metrics of them
    service.py        the one service every ingress calls: a request's head, then its body
    http_server.py    the replica's own HTTP/1.1 listener for HAProxy (HTTP and gRPC calls)
    grpc_ingress.py   the gRPC method, its status codes and framing, Serve's gRPC servicer
    replica.py        the Serve deployment: the runner, the service and its ingresses
    app.py            the application builder (`serve run deploy.serving.app:app ...`)
    haproxy.py        Ray's HAProxy with huggy's changes (the wrapper at each reload)
    haproxy_admin.py  a running HAProxy: its admin socket, draining it
    processes.py      what /proc shows: an ended child, the processes of a configuration
    server.py         `huggy serve`: start Serve with an ingress, deploy, run until a signal, stop

The HTTP contract itself (paths, headers, limits, keys) is `huggy_agent_client.http_api`, and the
client `huggy_agent_client.remote.RemoteAgent`: neither needs Ray, torch or this package.
"""
