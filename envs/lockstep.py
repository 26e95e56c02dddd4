"""mlagents-envs' communicator with its gRPC server run in the caller's thread.

mlagents-envs serves the Unity player's calls with `grpc`'s synchronous server: a polling
thread, a pool thread per call, and a handoff of each message to the main thread and back:
several times the CPU per exchange of serving the call in the thread that steps the environment
(docs/benchmarks.md, "Environments").
The exchange is lockstep (the player waits for each answer), so `LockstepCommunicator` reads the
player's calls and writes the answers itself when the environment steps, with
`envs.http2.UnaryServer`: no threads, no handoffs. Everything above the server is mlagents-envs'
own `RpcCommunicator` (its handshake, timeouts and `poll_callback` checks), which reaches the
server through `unity_to_external.parent_conn`.

It listens on `LISTEN_HOST` (127.0.0.1; mlagents-envs' own server listens on every address, for
a player in another container: set `LISTEN_HOST`, or `envs.fast_step.set_fast_paths(False)`
for mlagents-envs' server).
"""

from __future__ import annotations

from typing import Any

from envs.http2 import UnaryServer

LISTEN_HOST = "127.0.0.1"
EXCHANGE_PATH = "/communicator_objects.UnityToExternalProto/Exchange"
"""The one method a Unity player calls (`UnityToExternalProto.Exchange`); the server answers a
call to any other path with UNIMPLEMENTED."""


class MessageChannel:
    """The `parent_conn` of `LockstepCommunicator`: `UnityMessageProto`s in and out of a
    `UnaryServer`, with the methods of the `multiprocessing` connection it replaces.

    Args:
        server: the server the player calls.
    """

    def __init__(self, server: UnaryServer) -> None:
        from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto

        self._server = server
        self._parse = UnityMessageProto.FromString

    def send(self, message: Any) -> None:
        """Answer the player's last call.

        Args:
            message: a `UnityMessageProto`.
        """
        self._server.answer(message.SerializeToString())

    def recv(self) -> Any:
        """The player's next call's message, waiting for it.

        Returns:
            The `UnityMessageProto` it sent.
        """
        return self._parse(self._server.receive())

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether the player has called.

        Args:
            timeout: how long to wait for a call, in seconds (negative counts as 0).

        Returns:
            True once the player has called; False after `timeout` seconds.
        """
        return self._server.poll(max(float(timeout), 0.0))

    def close(self) -> None:
        self._server.close()


def lockstep_communicator(worker_id: int = 0, base_port: int = 5005,
                          timeout_wait: int = 30) -> Any:
    """A `LockstepCommunicator`, made as mlagents-envs' `UnityEnvironment._get_communicator` makes
    its communicator.

    Args:
        worker_id: the worker id; the port is `base_port + worker_id`.
        base_port: the first port.
        timeout_wait: seconds to wait for the player.

    Returns:
        The communicator.
    """
    return _communicator_class()(worker_id, base_port, timeout_wait)


_CLASS: list[type] = []


def _communicator_class() -> type:
    """`LockstepCommunicator`, made once: mlagents-envs is imported only once `envs.compat`
    has adapted it."""
    if _CLASS:
        return _CLASS[0]
    from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto
    from mlagents_envs.exception import UnityWorkerInUseException
    from mlagents_envs.rpc_communicator import RpcCommunicator

    class LockstepCommunicator(RpcCommunicator):
        """mlagents-envs' `RpcCommunicator` whose server is a `UnaryServer` served in the
        thread that steps the environment."""

        def create_server(self) -> None:
            self.check_port(self.port)
            try:
                self.server = UnaryServer(LISTEN_HOST, self.port, EXCHANGE_PATH)
            except OSError as error:
                raise UnityWorkerInUseException(self.worker_id) from error
            self.unity_to_external = _Servicer(MessageChannel(self.server))
            self.is_open = True

        def close(self) -> None:
            """Answer the player's pending call with status 400 (it then quits), as
            mlagents-envs does, and stop serving."""
            if self.is_open:
                goodbye = UnityMessageProto()
                goodbye.header.status = 400
                self.unity_to_external.parent_conn.send(goodbye)
                self.unity_to_external.parent_conn.close()
                self.is_open = False

    _CLASS.append(LockstepCommunicator)
    return LockstepCommunicator


class _Servicer:
    """What `RpcCommunicator` keeps in `unity_to_external`: the main thread's end."""

    def __init__(self, parent_conn: MessageChannel) -> None:
        self.parent_conn = parent_conn
