"""RemoteAgent: `compute_action` of a policy served over HTTP (`huggy serve`), by the contract
of `huggy_agent_client.http_api`.

    agent = RemoteAgent("http://127.0.0.1:8000")               # API key: $HUGGY_API_KEY, if set
    agent = RemoteAgent("http://127.0.0.1:8000", api_key=key)  # or given
    agent = RemoteAgent("http://127.0.0.1:8000", policy="run@2000343")  # one of many served
    agent = RemoteAgent("http://127.0.0.1:8000", session="user-17")     # one policy of a split
    actions = agent.compute_action(obs, deterministic=True)    # same contract as HuggyAgent

An agent always answers with one policy, `agent.policy_id`: the one named, else the one the
server's A/B split assigns to its session (a random session key of its own when none is given),
else the server's default. An answer from any other policy (the split was changed under it)
raises RemoteServerError instead of mixing policies.

Observations are validated here with `HuggyAgent`'s rules and messages before they are sent;
float32 values cross JSON exactly both ways. Connection errors, timeouts and 502/503/504 are
retried with a short backoff (at least the server's `Retry-After`), other 4xx/5xx raise at once.
Needs numpy and requests only; orjson, where installed (`huggy-agent-client[orjson]`), writes
and reads the JSON faster, and the standard library's json does it otherwise (see `json_body`).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import numpy as np
import requests

from huggy_agent_client.actions import ActionResult, Actions
from huggy_agent_client.http_api import (
    ACT_PATH,
    HEALTH_PATH,
    INFO_PATH,
    MODELS_PATH,
    POLICIES_PATH,
    POLICY_ID_HEADER,
    SEED_LIMIT,
    Split,
    load_api_key,
    model_act_path,
    unknown_policy_message,
)
from huggy_agent_client.inputs import as_input_batches, as_mask_batch, as_memory_batch
from huggy_agent_client.spec import ActorSpec

try:
    import orjson
except ImportError:
    ORJSON = False
else:
    ORJSON = True

RETRIED_STATUS = (502, 503, 504)


class RemoteRequestError(ValueError):
    """The server refused the request (4xx).

    Args:
        status: the HTTP status.
        kind: the API's error kind (such as `invalid_request` or `unknown_policy`).
        message: the server's message.
    """

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"server refused the request ({status} {kind}): {message}")
        self.status = status
        self.kind = kind


class RemoteServerError(RuntimeError):
    """The server failed (5xx) or could not be reached after the retries."""


class RemoteAgent:
    """A served policy with the `compute_action` of `HuggyAgent`.

    Args:
        url: the server's base URL, e.g. `http://127.0.0.1:8000`.
        timeout: seconds for connecting and for each answer.
        retries: extra attempts after a connection error, a timeout or a 502/503/504.
        backoff: seconds before the first retry; doubles after each (at least the server's
            `Retry-After`).
        api_key: the server's API key, sent as `Authorization: Bearer <key>`; None:
            `$HUGGY_API_KEY` if set, else no key.
        policy: the id of one of the served policies (`GET /v1/models`), asked at
            `/v1/models/{policy}/act` with the `serve_multiplexed_model_id` header (which routes
            it to a replica holding it); None: the server's split, else its default.
        session: the key that keeps this agent on one policy of the server's A/B split (sent
            as the request's `"session"`); None: a random key of this agent's own, so that an
            agent never switches policies between calls.

    Raises:
        ValueError: `retries` is negative or `timeout` is not positive.
        RemoteServerError: the server cannot be reached.
        RemoteRequestError: the server requires a key this client does not have (401), or does not
            serve `policy` (404, listing the served ids).
    """

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3,
                 backoff: float = 0.1, api_key: str | None = None,
                 policy: str | None = None, session: str | None = None) -> None:
        if retries < 0 or timeout <= 0:
            raise ValueError(f"need retries >= 0 and timeout > 0, received retries={retries}, "
                             f"timeout={timeout}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._session = requests.Session()
        api_key = api_key if api_key is not None else load_api_key()
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"
        served = self.policies()
        ids = [model["id"] for model in served["models"]]
        self._act_path = ACT_PATH
        self.session: str | None = None
        if policy is not None:
            if policy not in ids:
                raise RemoteRequestError(404, "unknown_policy",
                                         unknown_policy_message(policy, ids))
            self._act_path = model_act_path(policy)
            self._session.headers[POLICY_ID_HEADER] = policy
        elif served.get("split"):
            self.session = session if session is not None else f"remote-{uuid.uuid4().hex}"
            policy = Split.from_weights(served["split"], ids).assign(self.session)
        else:
            self.session = session
            policy = served["default"]
        self.policy_id: str = policy
        """The id of the policy that answers this agent."""
        info = served["models"][ids.index(policy)]
        self.spec: ActorSpec = ActorSpec.from_dict(info["spec"])
        self.fingerprint: str = info["fingerprint"]

    def compute_action(self, obs: Any, deterministic: bool = True, seed: int | None = None,
                       row_offset: int = 0, action_mask: Any = None, memory: Any = None
                       ) -> ActionResult:
        """Actions for `obs`, with the contract and return types of `HuggyAgent.compute_action`.

        Observations, mask and memory are validated here, with `HuggyAgent`'s rules and messages,
        before anything is sent.

        Args:
            obs: one array for a single-input policy, else a list or tuple of inputs in `obs_i` order;
                a single row or a batch (N, ...).
            deterministic: the mean action (True) or a draw from the policy's distribution.
            seed: the noise stream of a stochastic call; row i gets the noise of row `row_offset + i`,
                so the answer does not depend on the server's batching. None: the server draws.
            row_offset: the row of the stream that `obs`'s first row takes.
            action_mask: for discrete actions, 1 or True where allowed; None allows all.
            memory: a recurrent policy's memory; None means zeros (an episode's start).

        Returns:
            The actions in the rank `obs` was given; for a recurrent policy (actions, next memory).

        Raises:
            ValueError: a wrong shape or value, or a seed outside [0, 2**64).
            RemoteRequestError: the server refused the request (4xx).
            RemoteServerError: the server failed (5xx) or could not be reached after the retries, or
                answered with another policy than this agent's (the split changed).
        """
        spec = self.spec
        inputs, single = as_input_batches(obs, spec)
        rows = len(inputs[0])
        if seed is not None and not 0 <= seed < SEED_LIMIT:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed}")
        sent = [array[0] for array in inputs] if single else inputs  # the rank it was given
        payload: dict[str, Any] = {"inputs": {i.name: array for i, array in
                                              zip(spec.inputs, sent, strict=True)},
                                   "deterministic": bool(deterministic),
                                   "seed": None if seed is None else int(seed)}
        if len(spec.inputs) == 1:
            payload["obs"] = payload.pop("inputs")[spec.inputs[0].name]
        mask = as_mask_batch(action_mask, spec, rows)
        if mask is not None:
            payload["action_mask"] = mask[0] if single else mask
        if spec.memory_size and memory is not None:
            batch = as_memory_batch(memory, spec, rows)
            payload["memory"] = batch[0] if single else batch
        elif memory is not None:
            as_memory_batch(memory, spec, rows)  # raises: no memory here
        if row_offset:
            payload["row_offset"] = int(row_offset)
        if self.session is not None:
            payload["session"] = self.session
        answer = self._act(json_body(payload))
        if answer.get("policy", self.policy_id) != self.policy_id:
            raise RemoteServerError(
                f"{self.url} answered with policy {answer['policy']!r}, but this agent acts for "
                f"{self.policy_id!r} (the server's split changed); create a new RemoteAgent to "
                "follow the new split")
        return _actions(answer, spec)

    def describe(self) -> dict[str, Any]:
        """The server's `/v1/info`.

        Returns:
            The default policy's description, the served policies, batching settings and counters.

        Raises:
            RemoteRequestError: the server refused the request (4xx).
            RemoteServerError: the server failed or could not be reached after the retries.
        """
        return self._request("GET", INFO_PATH)

    def policies(self) -> dict[str, Any]:
        """The server's `/v1/models`.

        Returns:
            Every served policy (`models`: id, interface, spec, fingerprint, source), the `default`
                and the `split`.

        Raises:
            RemoteRequestError: the server refused the request (4xx).
            RemoteServerError: the server failed or could not be reached after the retries.
        """
        return self._request("GET", MODELS_PATH)

    def change_policies(self, policies: list[dict[str, str]], default: str | None = None,
                        split: dict[str, float] | None = None) -> dict[str, Any]:
        """`PUT /v1/policies`: change what a `huggy serve` serves, live (needs its API key). The
        answer comes once every replica serves the new set, so give this client a `timeout`
        longer than a redeploy.

        Args:
            policies: each policy to serve, {"id": ...} for one served now, {"id": ...,
                "path": ...} for a file on the server's machine (absolute path).
            default: the policy `/v1/act` answers with outside the split; None keeps the current
                one where it stays served.
            split: {id: weight} of the sticky split; None: no split.

        Returns:
            The served set: `policies` (ids), `default` and `split`.

        Raises:
            RemoteRequestError: the server refused the change (4xx: no or a wrong key, a change it
                cannot apply, naming why).
            RemoteServerError: the redeploy failed, the server stopped before it answered
                the change (503), or it could not be reached.
        """
        body = json.dumps({"policies": policies, "default": default, "split": split}).encode()
        return self._request("PUT", POLICIES_PATH, body)

    def healthy(self) -> bool:
        """Whether the server is up: one attempt at `/v1/healthz`, no retries.

        Returns:
            True when it answers 200; False for any other answer or a connection failure.
        """
        try:
            return self._session.get(self.url + HEALTH_PATH, timeout=self.timeout).ok
        except requests.RequestException:
            return False

    def close(self) -> None:
        """Close the kept-alive connections."""
        self._session.close()

    def __enter__(self) -> RemoteAgent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _act(self, body: bytes) -> dict[str, Any]:
        """The server's answer to an act request's body (the transport's one override point)."""
        return self._request("POST", self._act_path, body)

    def _request(self, method: str, path: str, body: bytes | None = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"} if body is not None else None
        failure: Exception | None = None
        wait = self.backoff
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(wait)
                wait *= 2
            try:
                response = self._session.request(method, self.url + path, data=body,
                                                 headers=headers, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as error:
                failure = error
                continue
            if response.status_code in RETRIED_STATUS and attempt < self.retries:
                wait = max(wait, _retry_after(response))
                continue
            return _decode(method, self.url + path, response)
        raise RemoteServerError(f"{method} {self.url}{path} failed after {self.retries + 1} "
                                f"attempt(s): {failure}") from failure


def json_body_orjson(document: dict[str, Any]) -> bytes:
    """A request body written by orjson.

    Args:
        document: the request, numpy arrays in it.

    Returns:
        Compact JSON, float32 values in their shortest form.
    """
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def json_body_stdlib(document: dict[str, Any]) -> bytes:
    """A request body written by the standard library's json, where orjson is not installed.

    Args:
        document: the request, numpy arrays in it.

    Returns:
        Compact JSON, each float32 as the shortest form of the float64 equal to it (a longer
            number than orjson's, which reads back to the same float32).

    Raises:
        ValueError: on a NaN or an infinity (validation refuses them before a request is built).
    """
    return json.dumps(document, default=_as_list, separators=(",", ":"),
                      allow_nan=False).encode()


def _as_list(value: Any) -> Any:
    """A numpy array (or scalar) as Python lists and numbers, for `json.dumps`."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


json_body = json_body_orjson if ORJSON else json_body_stdlib
"""What `compute_action` sends: orjson's body where orjson is installed."""
read_json = orjson.loads if ORJSON else json.loads
"""What reads the server's answers (both raise a ValueError on a body that is not JSON)."""


def _retry_after(response: requests.Response) -> float:
    """The seconds of a `Retry-After` header given in seconds (0 without one)."""
    value = response.headers.get("Retry-After", "")
    return float(value) if value.isdigit() else 0.0


def _actions(answer: dict[str, Any], spec: ActorSpec) -> ActionResult:
    """A `/v1/act` answer (already in the rank of the request) as `HuggyAgent.compute_action`
    returns it."""
    actions: np.ndarray | Actions
    if spec.continuous_size and spec.discrete_branches:
        actions = Actions(np.asarray(answer["continuous"], dtype=np.float32),
                          np.asarray(answer["discrete"], dtype=np.int64))
    elif spec.discrete_branches:
        actions = np.asarray(answer["discrete"], dtype=np.int64)
    else:
        actions = np.asarray(answer["continuous"], dtype=np.float32)
    if not spec.memory_size:
        return actions
    return actions, np.asarray(answer["memory"], dtype=np.float32)


def _decode(method: str, url: str, response: requests.Response) -> dict[str, Any]:
    try:
        document = read_json(response.content)
    except ValueError:
        document = None
    if response.ok and isinstance(document, dict):
        return dict(document)
    if isinstance(document, dict) and "message" in document:
        kind, message = document.get("error", "error"), document["message"]
    else:
        kind, message = "error", response.text[:300] or response.reason
    if 400 <= response.status_code < 500:
        raise RemoteRequestError(response.status_code, kind, message)
    raise RemoteServerError(f"{method} {url} answered {response.status_code} {kind}: {message}")
