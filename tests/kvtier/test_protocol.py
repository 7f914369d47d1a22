"""The control protocol and the CLI: framing, bad input answered with errors naming the field,
and a server that keeps serving after them."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator

import pytest

from strata.common import logs
from strata.worker.kvtier import allocator, cli, protocol
from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.server import handle
from strata.worker.kvtier.service import KVTierService, Owner

from .conftest import kvtier_config


def test_frames_round_trip_over_a_socket_pair():
    a, b = socket.socketpair()
    protocol.send(a, {"op": "lookup", "keys": ["00" * 16]})
    assert protocol.receive(b) == {"op": "lookup", "keys": ["00" * 16]}
    a.close()
    assert protocol.receive(b) is None  # clean end between frames
    b.close()


def test_truncated_and_oversized_frames_are_protocol_errors():
    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", 10) + b"{}")
    a.close()
    with pytest.raises(protocol.ProtocolError, match="mid-frame"):
        protocol.receive(b)
    c, d = socket.socketpair()
    c.sendall(struct.pack(">I", protocol.MAX_FRAME + 1))
    with pytest.raises(protocol.ProtocolError, match="exceeds"):
        protocol.receive(d)
    e, f = socket.socketpair()
    e.sendall(struct.pack(">I", 2) + b"[]")
    with pytest.raises(protocol.ProtocolError, match="not a JSON object"):
        protocol.receive(f)


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        ({"op": "explode"}, "op: unknown operation 'explode'"),
        ({"op": "lookup", "keys": "ab"}, "keys: expected a list of hex keys"),
        ({"op": "lookup", "keys": ["zz"]}, "keys: not hex strings"),
        ({"op": "lookup", "keys": ["abcd"]}, "keys: every key must be 16 bytes"),
        ({"op": "release", "slots": ["1"]}, "slots: expected a list of integers"),
        ({"op": "hello", "block_bytes": -1}, "block_bytes: expected a positive integer"),
        ({"op": "hello", "block_bytes": 8192}, "block_bytes: sidecar holds 4096-byte blocks"),
        ({"op": "put", "keys": ["00" * 16], "parents": [], "slots": [0]}, "must have the same length"),
        (
            {"op": "put", "keys": ["00" * 16], "parents": ["00" * 16], "slots": [0], "checksums": ["x"]},
            "checksums: expected a list of integers",
        ),
    ],
)
def test_bad_requests_get_errors_naming_the_field(root, request_, error):
    service = KVTierService(kvtier_config(root))
    service.configure(4096)
    reply = handle(service, Owner(), request_)
    assert reply["ok"] is False and error in reply["error"]
    assert handle(service, Owner(), {"op": "stats"})["ok"] is True  # still serving
    service.close()


def test_requests_before_hello_are_refused(root):
    service = KVTierService(kvtier_config(root))
    reply = handle(service, Owner(), {"op": "get", "keys": ["00" * 16]})
    assert reply == {"ok": False, "error": "sidecar not configured: send hello with block_bytes first"}


@pytest.fixture
def cli_logging() -> Iterator[None]:
    """The CLI sets the process's logging up (JSON lines at INFO on stderr): undone afterwards,
    so the rest of the session does not log every library's INFO lines."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if isinstance(h, logs.CurrentStderr)]:
        root.removeHandler(handler)
    root.setLevel(level)


def test_cli_rejects_a_bad_config(root, capsys, cli_logging, monkeypatch):
    fixed: list[bool] = []

    def fix() -> bool:
        fixed.append(True)
        return True

    monkeypatch.setattr(allocator, "fix_thresholds", fix)
    path = root / "worker.yaml"
    path.write_text("model: {name: m, path: /m}\nkvtier: {dram: {capacity_bytes: -5}}\n")
    assert cli.main(["serve", "--config", str(path)]) == 2
    assert "capacity_bytes" in capsys.readouterr().err
    assert cli.main(["serve", "--config", str(root / "missing.yaml")]) == 2
    assert fixed == [True, True]  # the allocator's thresholds, first of all (allocator.py)


def test_cli_reports_start_up_failures(root, capsys, cli_logging):
    blocker = root / "file"
    blocker.write_text("")
    config = kvtier_config(root, dram={"shm_path": str(blocker / "shm")})
    path = root / "worker.yaml"
    path.write_text(f"model: {{name: m, path: /m}}\nkvtier: {config.model_dump_json()}\n")
    assert cli.main(["serve", "--config", str(path), "--block-bytes", "0"]) == 2
    assert cli.main(["serve", "--config", str(path), "--block-bytes", "4096", "--metrics-port", "0"]) == 1
    assert "cannot start" in capsys.readouterr().err


def test_staging_slots_ask_for_the_clients_checksum_and_a_put_may_leave_some_out(root):
    # DRAM full of nothing but room for one block: the first key gets a DRAM slot (sealed later
    # by the sidecar), the second a staging slot, whose block is written to NVMe at its put.
    service = KVTierService(kvtier_config(root, dram={"capacity_bytes": 4096}))
    service.configure(4096)
    owner = Owner()
    keys = [f"{i:032x}" for i in (1, 2)]
    reply = handle(service, owner, {"op": "reserve", "keys": keys, "parents": ["00" * 16] * 2})
    assert reply["ok"] is True and reply["hash"] == [False, True], reply
    staged = reply["slots"][1]
    view = service.dram.arena.view(staged, 4096)  # type: ignore[union-attr]
    view[:] = b"\x07" * 4096
    put = {"op": "put", "keys": keys, "parents": ["00" * 16] * 2, "slots": reply["slots"]}
    assert handle(service, owner, put | {"checksums": [None, checksum(view)]}) == {"ok": True, "stored": 2}
    nvme = service.nvme
    assert nvme is not None
    entry = nvme.index.get(bytes.fromhex(keys[1]))
    assert entry is not None and entry.checksum == checksum(b"\x07" * 4096)
    service.close()
