"""Tenant B, on the same node and the same shared volume as tenant A, tries to read A's KV blocks
through its own sidecar: by sending A's prompt, by A's exact keys (as if it had learnt them), by
keys that are paths, and by a link planted in its own directory that points into A's. It gets
nothing of A's, and the files on the volume are laid out per tenant, readable by their owner only."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
import torch

from strata.worker.config import WorkerConfig
from strata.worker.kv_connector import BlockRef, chain_hashes, root_hash
from strata.worker.kvtier import protocol
from strata.worker.kvtier.client import TierClient, connect
from strata.worker.kvtier.janitor import Janitor, scan
from strata.worker.kvtier.shared import FilesystemBlockStore
from strata.worker.kvtier.walls import OutsideTenant, tenant_dir_name, tenant_root

from .conftest import TENANT_A, TENANT_B, StartTenant

SHAPE = (2, 2, 16, 2, 32)  # layers, K/V, block_size, kv heads, head_dim
PROMPT = list(range(16 * 8))  # eight full blocks of the same prompt for both tenants


def chain(tenant: str, tokens: list[int]) -> list[BlockRef]:
    """The block keys a tenant's engine computes for ``tokens`` (model "m", 16-token blocks)."""
    root = root_hash(tenant, "m", 16)
    hashes = chain_hashes(root, tokens, 16)
    return [BlockRef(h, p, i) for i, (h, p) in enumerate(zip(hashes, [root, *hashes[:-1]], strict=True))]


def client(config: WorkerConfig) -> TierClient:
    connected = connect(config, SHAPE, torch.float32)
    assert isinstance(connected, TierClient)
    return connected


def a_saved_its_prompt(start_tenant: StartTenant) -> list[bytes]:
    """A's engine saves the prompt's blocks; written through, they are on the volume when the
    save returns. A's own sidecar finds them."""
    a = client(start_tenant("pod-a", TENANT_A))
    refs = chain(TENANT_A, PROMPT)
    a.save(refs, [torch.randn(SHAPE) for _ in refs])
    keys = [r.hash for r in refs]
    assert a.lookup(keys) == ["dram"] * len(keys)
    return keys


def ask(config: WorkerConfig, message: protocol.Message) -> protocol.Message:
    """One raw request on a sidecar's socket, as any process that reaches it could send."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(config.kvtier.socket_path)
        protocol.send(sock, message)
        reply = protocol.receive(sock)
    assert reply is not None
    return reply


def test_b_asking_for_the_same_prompt_or_as_keys_gets_none_of_as_blocks(
    start_tenant: StartTenant, volume: Path
) -> None:
    a_keys = a_saved_its_prompt(start_tenant)
    b_config = start_tenant("pod-b", TENANT_B)
    b = client(b_config)
    b_keys = [r.hash for r in chain(TENANT_B, PROMPT)]
    assert not set(a_keys) & set(b_keys)  # the same prompt, other keys: the roots are salted
    assert b.lookup(b_keys) == []
    assert b.lookup(a_keys) == []  # A's exact keys: B's sidecar looks only in B's directory
    out = [torch.empty(SHAPE) for _ in a_keys]
    assert b.load(a_keys, out) == 0
    assert ask(b_config, {"op": "get", "keys": [k.hex() for k in a_keys]})["slots"] == []


def test_the_volume_holds_a_private_directory_per_tenant(start_tenant: StartTenant, volume: Path) -> None:
    a_keys = a_saved_its_prompt(start_tenant)
    start_tenant("pod-b", TENANT_B)
    shared = volume / "shared"
    assert sorted(p.name for p in shared.iterdir()) == sorted(
        [tenant_dir_name(TENANT_A), tenant_dir_name(TENANT_B)]
    )
    assert TENANT_A.split(".")[0] not in tenant_dir_name(TENANT_A)  # the name says nothing of whose
    a_dir = tenant_root(shared, TENANT_A)
    files = [p for p in a_dir.rglob("*") if p.is_file() and p.name != ".janitor.lock"]
    assert len(files) == len(a_keys)
    for path in [a_dir, *(p for p in a_dir.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


@pytest.mark.parametrize(
    ("keys", "refused"),
    [
        (["../../../etc/passwd"], "not hex"),
        (["2e2e2f2e2e2f"], "16 bytes"),  # "../../" in hex: decodes, but is no block key
        (["00" * 64], "16 bytes"),
        ("0011", "list"),
    ],
)
def test_b_sending_paths_as_keys_is_refused_naming_the_field(
    start_tenant: StartTenant, keys: object, refused: str
) -> None:
    b_config = start_tenant("pod-b", TENANT_B)
    for op in ("lookup", "get", "prefetch"):
        reply = ask(b_config, {"op": op, "keys": keys})
        assert reply["ok"] is False and reply["error"].startswith("keys:") and refused in reply["error"], (
            reply
        )


def test_a_link_planted_in_bs_directory_does_not_lead_into_as(
    start_tenant: StartTenant, volume: Path
) -> None:
    a_keys = a_saved_its_prompt(start_tenant)
    b = client(start_tenant("pod-b", TENANT_B))
    shared = volume / "shared"
    a_dir, b_dir = tenant_root(shared, TENANT_A), tenant_root(shared, TENANT_B)
    fan_out = a_keys[0].hex()[:2]
    (b_dir / fan_out).symlink_to(a_dir / fan_out)  # B's own directory, where B's code may write
    with pytest.raises(OutsideTenant, match="outside the tenant directory"):
        FilesystemBlockStore(b_dir).contains(a_keys[0])
    assert b.lookup(a_keys) == []  # the sidecar: the shared tier skipped, no block
    assert (a_dir / fan_out).is_dir() and any((a_dir / fan_out).iterdir())  # nothing of A's removed
    os.unlink(b_dir / fan_out)


def test_blocks_of_the_layout_before_tenant_directories_are_swept_as_stale(volume: Path) -> None:
    """A volume written before blocks moved into tenant directories: nothing reads those blocks
    any more, so the tenant's janitor removes them, and nothing of the tenant's own."""
    shared = volume / "shared"
    before, own = FilesystemBlockStore(shared), FilesystemBlockStore(tenant_root(shared, TENANT_A))
    data = memoryview(bytes(4096))
    for n in range(3):
        before.write(bytes([n]) * 16, bytes(16), 0, data)
    own.write(bytes([9]) * 16, bytes(16), 0, data)
    sweep = Janitor(tenant_root(shared, TENANT_A), 2**30, legacy=shared).sweep()
    assert sweep.removed_stale == 3 and sweep.removed_lru == 0
    assert not list(scan(shared)) and own.contains(bytes([9]) * 16)
