"""The sidecar's control protocol: length-prefixed JSON frames over a Unix socket.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Every
request is an object with an ``op``; every reply is ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``. Block keys travel as 32-character hex strings. Block bytes
never travel here: they sit in shared-memory slots named by number (see docs/kvtier.md).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from strata.common.logs import REQUEST_ID

MAX_FRAME = 64 * 2**20
# The routers' look-ahead, over HTTP on the metrics port (``announced``, at
# ``strata.common.endpoints.EXPECT_PATH``): the largest body (131,072 keys of 32 hex characters,
# and the JSON around them).
EXPECT_MAX_BODY_BYTES = 16 << 20
# The id of the request the engine was working for when it sent a message (absent otherwise):
# the sidecar logs its lines about that message under the same id as the router and the worker.
REQUEST_ID_FIELD = "request_id"
# A reply's open file descriptors, passed along with its frame (``SCM_RIGHTS``) rather than in
# its JSON: the NVMe tier's data file, for an engine that reads and writes its blocks itself.
FDS_FIELD = "fds"
MAX_FDS = 4
_LENGTH = struct.Struct(">I")

Message = dict[str, Any]


class ExpectConflict(Exception):
    """A router's change to a set this sidecar does not hold (it restarted, or forgot the
    router): HTTP 409, and the router sends its whole set."""


class ProtocolError(Exception):
    """A malformed frame or a peer that went away mid-frame."""


def tagged(message: Message) -> Message:
    """``message`` with the current request id, when there is one."""
    request_id = REQUEST_ID.get()
    return {**message, REQUEST_ID_FIELD: request_id} if request_id is not None else message


def send(sock: socket.socket, message: Message) -> None:
    """Send one frame; a message's ``FDS_FIELD`` (a list of descriptors) rides along its first
    byte as ancillary data and is not part of the JSON."""
    fds = message.get(FDS_FIELD)
    if fds is not None:
        message = {k: v for k, v in message.items() if k != FDS_FIELD}
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    frame = _LENGTH.pack(len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [frame[:1]], list(fds))
        frame = frame[sent:]
    sock.sendall(frame)


def receive(sock: socket.socket, fds: list[int] | None = None) -> Message | None:
    """The next message, or None when the peer closed the connection between frames. With
    ``fds``, descriptors passed along the frame are appended to it (the caller owns them)."""
    head = _read_exact(sock, _LENGTH.size, allow_eof=True, fds=fds)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    body = _read_exact(sock, length, allow_eof=False)
    assert body is not None
    try:
        message = json.loads(body)
    except ValueError as err:
        raise ProtocolError(f"frame is not JSON: {err}") from err
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


def _read_exact(
    sock: socket.socket, length: int, allow_eof: bool, fds: list[int] | None = None
) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < length:
        if fds is None:
            chunk = sock.recv(length - len(chunks))
        else:
            chunk, passed, _, _ = socket.recv_fds(sock, length - len(chunks), MAX_FDS)
            fds += passed
        if not chunk:
            if allow_eof and not chunks:
                return None
            raise ProtocolError("connection closed mid-frame")
        chunks += chunk
    return bytes(chunks)


def keys_from(message: Message, field: str = "keys") -> list[bytes]:
    """Decode a list of hex block keys, naming the field on bad input."""
    raw = message.get(field)
    if not isinstance(raw, list):
        raise ValueError(f"{field}: expected a list of hex keys")
    try:
        keys = [bytes.fromhex(k) for k in raw]
    except (TypeError, ValueError) as err:
        raise ValueError(f"{field}: not hex strings ({err})") from err
    if any(len(k) != 16 for k in keys):
        raise ValueError(f"{field}: every key must be 16 bytes")
    return keys
