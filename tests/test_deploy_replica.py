"""A replica's own request path in process, without Ray: requests that arrive together share one
forward pass and each gets the actions of its own rows, seed and offset; a request whose heads
fail is answered 500 alone; a batch in flight starts no collection of young objects; the
replica's service through its own listener answers HTTP and gRPC as `compute_action` does.
Concurrency comes from one event loop's turns, never from timing."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.requests import Request

from deploy.serving.http_server import UnixHttpServer
from deploy.serving.metrics import BucketCounters
from deploy.serving.replica import HuggyPolicyDeployment
from deploy.serving.runner import YOUNG_GC_THRESHOLD
from deploy.serving.settings import AppArgs
from huggy_agent import HuggyAgent
from huggy_agent.numerics import FP32_ACTION_ATOL

ROWS = np.random.default_rng(4).standard_normal((16, 59)).astype(np.float32)
DOCUMENTS: list[dict[str, Any]] = [
    {"obs": ROWS[0].tolist()},
    {"obs": ROWS[1].tolist(), "deterministic": False, "seed": 13},
    {"obs": ROWS[2:5].tolist(), "deterministic": False, "seed": 13, "row_offset": 1},
    {"obs": ROWS[5].tolist(), "deterministic": False, "seed": 7, "row_offset": 9},
    {"obs": ROWS[6:8].tolist()},
    {"obs": ROWS[8].tolist(), "deterministic": True, "seed": 5},
    {"obs": ROWS[9].tolist(), "deterministic": False, "seed": 2**64 - 1},
]


def request(document: dict[str, Any]) -> Request:
    body = json.dumps(document).encode()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/v1/act", "root_path": "",
                    "query_string": b"", "headers": [(b"content-type", b"application/json"),
                                                     (b"content-length", str(len(body)).encode())]},
                   receive)


class InProcessReplica(HuggyPolicyDeployment.func_or_class):  # type: ignore[misc,name-defined]
    """The replica without Serve: nothing to stop at collection (Serve awaits the async
    `__del__`, which only stops the own listener, never started here)."""

    def __del__(self) -> None:
        pass


@pytest.fixture()
def replica() -> Iterator[Any]:
    threshold = gc.get_threshold()  # a replica sets its process's; this process gets it back
    deployment = InProcessReplica("cpu")
    args = AppArgs(accelerator="cpu")
    asyncio.run(deployment.reconfigure({**asdict(args.batch_settings()),
                                        **args.policy_set().as_config()}))
    try:
        yield deployment
    finally:
        gc.set_threshold(*threshold)


def answer_all(replica: Any) -> list[tuple[int, dict]]:
    async def run() -> list[Any]:
        return await asyncio.gather(*(replica(request(d)) for d in DOCUMENTS))

    return [(r.status_code, json.loads(r.body)) for r in asyncio.run(run())]


def expected(agent: HuggyAgent, document: dict[str, Any]) -> np.ndarray:
    return agent.compute_action(np.asarray(document["obs"], np.float32),
                                document.get("deterministic", True), document.get("seed"),
                                document.get("row_offset", 0))


def test_requests_that_arrive_together_share_a_pass_and_keep_their_own_actions(
        replica: Any) -> None:
    agent = HuggyAgent(device="cpu")
    passes = replica.runner.metrics.counters["forward_passes"]
    answers = answer_all(replica)
    # one batch for all of them
    assert replica.runner.metrics.counters["forward_passes"] - passes == 1
    for document, (status, answer) in zip(DOCUMENTS, answers, strict=True):
        assert status == 200
        # One pass over 12 rows against each request's own compute_action: other matmul
        # shapes, so within the numerical contract.
        got = np.asarray(answer["continuous"], np.float32)
        assert got.shape == expected(agent, document).shape
        assert np.abs(got - expected(agent, document)).max() <= FP32_ACTION_ATOL


def test_the_row_helper_is_woken_only_for_a_request_that_follows_a_lone_one(
        replica: Any) -> None:
    """A request that enters the idle replica wakes the row helper (`expect_row`) when the
    latest pass was a lone request's, not after a batch (under load a helper woken on a busy
    machine takes the replica's own CPU), nor before any pass."""
    (policy_id,) = replica.held()
    agent = replica.runner._held[policy_id].agent
    woken: list[int] = []
    agent.expect_row = lambda: woken.append(replica.runner.metrics.counters["forward_passes"])

    def alone() -> None:
        assert asyncio.run(replica(request(DOCUMENTS[0]))).status_code == 200

    # the warm-up ran no request alone
    passes = replica.runner.metrics.counters["forward_passes"]
    alone()
    assert woken == []  # no lone pass before it
    alone()
    assert woken == [passes + 1]
    answer_all(replica)  # its first request found the replica idle after a lone pass
    assert woken == [passes + 1, passes + 2]
    alone()  # after a batch
    assert woken == [passes + 1, passes + 2]
    alone()
    assert woken == [passes + 1, passes + 2, passes + 4]
    assert replica.runner.metrics.counters["forward_passes"] == passes + 5
    assert replica.runner.metrics.counters["requests_alone"] == 4


def test_a_batch_in_flight_starts_no_collection_of_young_objects(replica: Any) -> None:
    """64 requests gathered at once hold more young objects than Python's default threshold
    (700): with it, the collector runs during the batch; with the replica's, it does not (the
    counts start from zero after `gc.collect`). Counted by `gc.callbacks`, not timed."""
    assert gc.get_threshold()[0] == YOUNG_GC_THRESHOLD
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    async def batch() -> list[Any]:
        return await asyncio.gather(*(replica(request({"obs": ROWS[k % 16].tolist()}))
                                      for k in range(64)))

    found = {}
    gc.callbacks.append(count)
    try:
        for threshold in (700, YOUNG_GC_THRESHOLD):
            gc.set_threshold(threshold, *gc.get_threshold()[1:])
            gc.collect()
            collections.clear()
            answers = asyncio.run(batch())
            assert [a.status_code for a in answers] == [200] * 64
            found[threshold] = len(collections)
    finally:
        gc.callbacks.remove(count)
    assert found[700] > 0 and found[YOUNG_GC_THRESHOLD] == 0, found


def test_a_request_whose_heads_fail_is_answered_alone(replica: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    agent = HuggyAgent(device="cpu")
    served = replica.runner._held[replica.held()[0]].agent
    actions_from = served.actions_from

    def failing(outputs: Any, deterministic: bool = True, seed: int | None = None,
                row_offset: int = 0, action_mask: Any = None) -> Any:
        if seed == 7:
            raise RuntimeError("the heads of seed 7 failed")
        return actions_from(outputs, deterministic, seed, row_offset, action_mask)

    def shared_failing(*args: Any) -> Any:
        raise RuntimeError("the shared heads failed")

    monkeypatch.setattr(served, "actions_from", failing)
    monkeypatch.setattr(served, "actions_of_parts", shared_failing)
    answers = answer_all(replica)
    for document, (status, answer) in zip(DOCUMENTS, answers, strict=True):
        if document.get("seed") == 7:
            assert status == 500 and "the heads of seed 7 failed" in answer["message"]
            continue
        assert status == 200
        got = np.asarray(answer["continuous"], np.float32)
        assert np.abs(got - expected(agent, document)).max() <= FP32_ACTION_ATOL


def chunked_request(chunks: list[bytes], declared: int | None = None,
                    then_leave: bool = False) -> Request:
    """A POST /v1/act whose body arrives in `chunks` (one ASGI message each), with a
    Content-Length of `declared` or none (as a chunked transfer); `then_leave`: the client
    disconnects after them, more of the body still announced."""
    messages = [{"type": "http.request", "body": chunk,
                 "more_body": then_leave or index < len(chunks) - 1}
                for index, chunk in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    headers = [(b"content-type", b"application/json")]
    if declared is not None:
        headers.append((b"content-length", str(declared).encode()))
    return Request({"type": "http", "method": "POST", "path": "/v1/act", "root_path": "",
                    "query_string": b"", "headers": headers}, receive)


def test_a_body_in_several_messages_is_read_whole_and_bounded_as_it_arrives(
        replica: Any) -> None:
    agent = HuggyAgent(device="cpu")
    body = json.dumps(DOCUMENTS[1]).encode()
    pieces = [body[:1], body[1:100], b"", body[100:]]
    response = asyncio.run(replica(chunked_request(pieces)))
    assert response.status_code == 200
    got = np.asarray(json.loads(response.body)["continuous"], np.float32)
    assert np.abs(got - expected(agent, DOCUMENTS[1])).max() <= FP32_ACTION_ATOL
    # No Content-Length: the limit is checked on what arrives, one byte past it refused.
    limit = replica.runner.settings.max_body_bytes
    for declared in (None, limit):
        response = asyncio.run(replica(chunked_request([b" " * limit, b" "], declared)))
        assert response.status_code == 413, declared
        assert json.loads(response.body)["error"] == "body_too_large"
    # A declared length over the limit is refused before the body is read.
    response = asyncio.run(replica(chunked_request([], limit + 1)))
    assert (response.status_code, json.loads(response.body)["error"]) == (413, "body_too_large")


def test_a_client_that_leaves_before_its_body_arrives_is_counted_not_logged_as_a_failure(
        replica: Any, caplog: pytest.LogCaptureFixture) -> None:
    body = json.dumps(DOCUMENTS[0]).encode()
    with caplog.at_level(logging.WARNING):
        response = asyncio.run(replica(chunked_request([body[:40]], len(body), then_leave=True)))
    assert response.status_code == 499
    assert replica.runner.metrics.counters["disconnected"] == 1
    assert not caplog.records
    # It served on: the next request is answered as compute_action answers it.
    response = asyncio.run(replica(request(DOCUMENTS[0])))
    got = np.asarray(json.loads(response.body)["continuous"], np.float32)
    assert np.abs(got - expected(HuggyAgent(device="cpu"), DOCUMENTS[0])).max() <= FP32_ACTION_ATOL


def test_bucket_counters_count_what_is_at_most_each_bound() -> None:
    """Worked by hand: of 1, 1, 2, 3, 8, 9, 2 are at most 1, 3 at most 2, 4 at most 4, 5 at
    most 8, and 6 in all; bounds that do not increase are refused."""
    counters = BucketCounters("huggy_test_sizes", "test sizes", [1, 2, 4, 8])
    assert counters.labels == ["1", "2", "4", "8", "+Inf"]
    assert counters.cumulative_counts([1, 1, 2, 3, 8, 9]) == [2, 3, 4, 5, 6]
    assert counters.cumulative_counts([]) == [0, 0, 0, 0, 0]
    counters.add([1, 1, 2, 3, 8, 9])  # without a cluster Ray keeps the counts to itself
    with pytest.raises(ValueError, match=r"boundaries must increase, got \[1, 4, 2\]"):
        BucketCounters("huggy_test_bad", "test", [1, 4, 2])


def test_the_replicas_service_through_its_own_listener_answers_http_and_grpc_alike(
        replica: Any, tmp_path: Path) -> None:
    """The listener HAProxy talks to, with the replica's real service behind it: an HTTP request
    and a gRPC call (as HAProxy hands one over: HTTP/1.1, chunked, one message) of the same
    body get the actions `compute_action` gives (one row each, alone), and the same refusal for
    the same bad body: a 422 and the gRPC status INVALID_ARGUMENT with the API's JSON."""
    agent = HuggyAgent(device="cpu")
    document = DOCUMENTS[1]
    body = json.dumps(document).encode()

    async def http_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().partition(b"content-length: ")[2].partition(b"\r\n")[0])
        return head, await reader.readexactly(length)

    async def grpc_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"content-type: application/grpc" in head
        message = b""
        while (size := int(await reader.readuntil(b"\r\n"), 16)) > 0:
            message += (await reader.readexactly(size + 2))[:-2]
        return message, await reader.readuntil(b"\r\n\r\n")  # the trailers

    async def run() -> list[tuple[bytes, bytes]]:
        server = UnixHttpServer(replica.service)
        await server.start(tmp_path / "replica.sock")
        try:
            reader, writer = await asyncio.open_unix_connection(str(server.path))
            answers = []
            for payload in (body, b'{"obs": [1, 2]}'):
                writer.write(b"POST /v1/act HTTP/1.1\r\ncontent-length: %d\r\n\r\n"
                             % len(payload) + payload)
                answers.append(await http_answer(reader))
                framed = b"\x00" + len(payload).to_bytes(4, "big") + payload
                writer.write(b"POST /huggy.v1.Policy/Act HTTP/1.1\r\ncontent-type: "
                             b"application/grpc\r\ntransfer-encoding: chunked\r\n\r\n"
                             + b"%x\r\n" % len(framed) + framed + b"\r\n0\r\n\r\n")
                answers.append(await grpc_answer(reader))
            writer.close()
            return answers
        finally:
            await server.stop(grace=5)

    (http_head, http_ok), (grpc_ok, grpc_trailers), (http_refused_head, http_refused), \
        (grpc_refused, grpc_refused_trailers) = asyncio.run(run())
    want = expected(agent, document)
    assert http_head.startswith(b"HTTP/1.1 200 ") and grpc_trailers == b"grpc-status: 0\r\n\r\n"
    assert grpc_ok[:5] == b"\x00" + (len(grpc_ok) - 5).to_bytes(4, "big")
    for answer in (http_ok, grpc_ok[5:]):
        actions = np.asarray(json.loads(answer)["continuous"], np.float32)
        assert np.abs(actions - want).max() <= FP32_ACTION_ATOL
    assert http_refused_head.startswith(b"HTTP/1.1 422 ")
    assert json.loads(http_refused)["error"] == "invalid_shape"
    assert grpc_refused == b"" and grpc_refused_trailers.startswith(b"grpc-status: 3\r\n")
    assert b'grpc-message: {"error": "invalid_shape"' in grpc_refused_trailers
