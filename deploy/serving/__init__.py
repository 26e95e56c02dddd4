"""Serving policies over HTTP (and gRPC) with Ray Serve, one room per concern:

    catalogue.py     the served policies (read once per process), default and A/B split
    settings.py      batch settings (live through `user_config`) and the app builder's arguments
    routes.py        routes and the API key
    parsing.py       parsing and validating act requests (columnar and row forms)
    responses.py     response bodies and the JSON error format
    openapi.py       the OpenAPI 3.1 document
    held.py          the table of policies a replica holds (LRU)
    replica.py       the Serve deployment: batching, forward passes, health, counters
    grpc_ingress.py  the gRPC method, the same JSON documents
    grpc_server.py   the replicas' own gRPC server: HTTP/2 on the replica's event loop
    app.py           the application builder (`serve run deploy.serving.app:app ...`)
    server.py        `huggy serve`: start Serve with an ingress, deploy, run until a signal, stop
    haproxy.py       Ray's HAProxy with huggy's changes: a JSON 503 at once while no replica answers

The HTTP contract itself (paths, headers, limits, keys) is `huggy_agent.http_api`, and the
client `huggy_agent.remote.RemoteAgent`: neither needs Ray or this package.
"""
