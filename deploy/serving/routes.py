"""Routing and access control of the policy server: which route a path names
(`check_route`), and the API key (`ApiKey`). No Ray and no web framework here."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from deploy.serving.responses import ApiError
from huggy_agent_client.http_api import MODEL_ACT_ROUTE, MODELS_PATH, OPEN_PATHS, ROUTES


def check_route(path: str, method: str) -> tuple[str, str | None]:
    """The route a request names. HEAD is taken wherever GET is: the replica answers it as GET and
    the HTTP server leaves the body out (same status and headers, as HTTP has it).

    Args:
        path: the request's path.
        method: its method.

    Returns:
        The route (a key of ROUTES) and the policy id it names (None but for
            `/v1/models/{policy}/act`).

    Raises:
        ApiError: 404 for an unknown path, 405 (with `Allow`) for a known path with the wrong
            method.
    """
    route, policy_id = path.rstrip("/") or "/", None
    prefix = f"{MODELS_PATH}/"
    if route.startswith(prefix) and route.endswith("/act") and len(route) > len(prefix) + 4:
        route, policy_id = MODEL_ACT_ROUTE, route[len(prefix):-len("/act")]
    expected = ROUTES.get(route)
    if expected is None:
        raise ApiError(404, "not_found", f"no route {path!r}; routes: "
                       + ", ".join(f"{m} {p}" for p, m in ROUTES.items()))
    allowed = (expected, "HEAD") if expected == "GET" else (expected,)
    if method not in allowed:
        raise ApiError(405, "method_not_allowed",
                       f"{path} expects {' or '.join(allowed)}, received {method}",
                       {"Allow": ", ".join(allowed)})
    return route, policy_id


@dataclass(frozen=True)
class ApiKey:
    """The key a server requires, kept as its SHA-256 digest only (so no copy of the key sits
    in Serve's configuration); `repr` shows nothing of it."""

    digest: bytes = field(repr=False)

    @classmethod
    def of(cls, key: str) -> ApiKey:
        """The key a server requires.

        Args:
            key: the key.

        Returns:
            Its digest, held.
        """
        return cls(hashlib.sha256(key.encode()).digest())

    def authorize(self, path: str, authorization: str | None) -> None:
        """Let a request through if its path is open or it carries the key; constant time in the key.

        Args:
            path: the request's path.
            authorization: its Authorization header's value, or None.

        Raises:
            ApiError: 401 (with `WWW-Authenticate`) when it is neither.
        """
        if (path.rstrip("/") or "/") in OPEN_PATHS:
            return
        scheme, _, token = (authorization or "").strip().partition(" ")
        if not authorization:
            problem = "no Authorization header"
        elif scheme.lower() != "bearer" or not token.strip():
            problem = f"an Authorization header of scheme {scheme[:20]!r}"
        else:
            given = hashlib.sha256(token.strip().encode()).digest()
            if hmac.compare_digest(given, self.digest):
                return
            problem = "a wrong API key"
        raise ApiError(401, "unauthorized", "this server requires its API key as "
                       f"'Authorization: Bearer <key>', received {problem}",
                       {"WWW-Authenticate": 'Bearer realm="huggy"'})
