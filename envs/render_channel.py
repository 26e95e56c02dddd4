"""The Python end of the render side channel (`envs.standin.poses`): an mlagents-envs
`SideChannel` that keeps the latest pose record the stand-in sent."""

from __future__ import annotations

from mlagents_envs.side_channel.incoming_message import IncomingMessage
from mlagents_envs.side_channel.side_channel import SideChannel

from envs.standin.poses import RENDER_CHANNEL_ID, PoseMessage, decode_payload


class PoseChannel(SideChannel):
    """Registered with `UnityEnvironment(side_channels=...)`; mlagents-envs hands it the record
    of each message (after every reset and step), `take()` returns it once."""

    def __init__(self) -> None:
        super().__init__(RENDER_CHANNEL_ID)
        self._latest: bytes | None = None

    def on_message_received(self, msg: IncomingMessage) -> None:
        """Keep the message's record (mlagents-envs calls this).

        Args:
            msg: the message from the stand-in.
        """
        self._latest = msg.get_raw_bytes()

    def take(self) -> PoseMessage | None:
        """The record of the last message, once.

        Returns:
            The decoded record, or None when no message came since the last call.
        """
        payload, self._latest = self._latest, None
        return None if payload is None else decode_payload(payload)
