"""pytest's hooks and fixtures for the suite: the lane markers (`ray`, `standin`), the guard that
keeps stand-ins out of the fast lane, one two-node Ray cluster per test session, and the guard
that keeps a test module from leaving Serve running on it. The helpers tests share live in
`tests.support`."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.support.processes import starts_a_player
from tests.support.ray_cluster import (
    RayCluster,
    remove_session_token,
    stop_serve_left_running,
    two_node_cluster,
    use_session_token,
)

# --- lanes: `make test-fast` runs what is neither `ray` nor `standin` --------------------------

SLOW_LANES = ("ray", "standin")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `ray` every test that uses the session's Ray cluster (directly or through another
    fixture); `standin` is marked in the test modules, where a test starts a stand-in."""
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(autouse=True)
def _fast_lane_starts_no_standin(request: pytest.FixtureRequest,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A test in neither slow lane may not start a stand-in: it fails, naming the marker it needs,
    so the fast lane stays free of stand-ins. (Fixtures of a wider scope start before this.)"""
    if any(request.node.get_closest_marker(lane) for lane in SLOW_LANES):
        return
    popen_init = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        if starts_a_player(args):
            raise RuntimeError(f"{request.node.nodeid} starts a stand-in or an envs worker but is "
                               "not marked: add `pytest.mark.standin` to it")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


def pytest_configure(config: pytest.Config) -> None:
    """Token authentication with the session's own token, before any test module imports Ray
    (`tests.support.ray_cluster.use_session_token`)."""
    use_session_token()


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_session_token()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """One two-node Ray cluster for the whole session (`tests.support.ray_cluster`)."""
    with two_node_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module", autouse=True)
def _no_serve_left_running() -> Iterator[None]:
    """A module that leaves Serve running on the session's cluster (a `huggy serve --address`
    killed mid-test, a shutdown that failed) errors at its end, after Serve is shut down: the
    failure stays with the module where it arose, and the next module starts without Serve, as
    `start_serve` requires. (Module fixtures that start Serve end before this.)"""
    yield
    if stop_serve_left_running():
        pytest.fail("Serve was left running on the session's Ray cluster; it is shut down now")
