"""An engine's own NVMe I/O (``direct_io``): where NVMe is the only tier below DRAM, an engine
whose blocks are whole pages on page boundaries writes them into the NVMe slots the sidecar
names and, without a DRAM tier, reads them back itself; the sidecar still decides, commits and
checks. What may go wrong around it: slots of a connection that ends, a put naming slots it
was not given, bytes that are not what the put said, an eviction while the engine reads."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import pytest
import torch

from strata.worker.engine.model_runner import allocate_cache
from strata.worker.kv_connector import PAGE, BlockRef
from strata.worker.kvtier import copies as copies_module
from strata.worker.kvtier import protocol
from strata.worker.kvtier.client import TierClient
from strata.worker.kvtier.service import KVTierService, Owner, PutBlock
from tests.foundation.waiting import eventually

from .conftest import kvtier_config

SHAPE = (4, 2, 16, 8, 32)  # 64 KiB in bf16: whole pages
DTYPE = torch.bfloat16
BLOCK_BYTES = 64 * 1024
CPU = torch.device("cpu")


def chain(seed: int, count: int) -> list[BlockRef]:
    """Keys as the engine's are, hashes (the admission sketch takes their bytes as such)."""
    keys = [hashlib.blake2b(bytes([seed, i]), digest_size=16).digest() for i in range(count)]
    return [BlockRef(k, keys[i - 1] if i else b"\0" * 16, i) for i, k in enumerate(keys)]


def filled(count: int, seed: int = 0) -> torch.Tensor:
    cache = allocate_cache((count, *SHAPE), DTYPE, CPU)
    cache.copy_(torch.randn(cache.shape, generator=torch.Generator().manual_seed(seed)).to(DTYPE))
    return cache


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def nvme_only(
    root: Path, nvme_blocks: int = 64, nvme: Mapping[str, object] | None = None, **overrides: object
):
    """No DRAM tier; NVMe of ``nvme_blocks`` blocks (and ``nvme``'s settings)."""
    settings = {"capacity_bytes": nvme_blocks * BLOCK_BYTES, **(nvme or {})}
    return kvtier_config(root, dram={"capacity_bytes": 0}, nvme=settings, **overrides)


@pytest.fixture
def connect(root, start_sidecar):
    """A sidecar with NVMe only, and clients of it (closed at teardown)."""
    config = nvme_only(root)
    start_sidecar(config)
    clients: list[TierClient] = []

    def client(direct_io: bool = True) -> TierClient:
        clients.append(TierClient(config.socket_path, SHAPE, DTYPE, direct_io=direct_io))
        return clients[-1]

    yield client
    for made in clients:
        made.close()


def test_the_engine_cache_on_the_cpu_starts_on_a_page_and_is_zeroed():
    cache = allocate_cache((3, *SHAPE), DTYPE, CPU)
    assert cache.data_ptr() % PAGE == 0 and cache[1].data_ptr() % PAGE == 0
    assert cache.is_contiguous() and not cache.float().abs().sum()


def test_blocks_on_whole_pages_go_to_nvme_and_back_by_the_engine_itself(connect):
    client, blocks, data = connect(), chain(1, 12), filled(12)
    assert client.save_checked(blocks, list(data.unbind())) == 12
    assert client.direct_saved == 12  # no staging slot: the engine wrote them
    out = allocate_cache((12, *SHAPE), DTYPE, CPU)
    assert client.load([b.hash for b in blocks], list(out.unbind())) == 12
    assert client.direct_loaded == 12
    assert same(out, data)
    stats = client.stats()
    assert stats is not None and stats["tiers"]["nvme"]["blocks"] == 12


def off_page(count: int) -> torch.Tensor:
    """``count`` blocks starting 128 bytes past a page, wherever the allocator put the buffer
    (a plain ``torch.empty`` lands on a page boundary now and then)."""
    raw = torch.empty((count * BLOCK_BYTES + 2 * PAGE) // 2, dtype=DTYPE)
    skip = (-raw.data_ptr() % PAGE + 128) // 2
    return raw[skip : skip + count * BLOCK_BYTES // 2].view(count, *SHAPE)


def test_blocks_off_page_boundaries_are_staged_as_before(connect):
    count, client = 6, connect()
    data, out = off_page(count), off_page(count)
    assert data.data_ptr() % PAGE == out.data_ptr() % PAGE == 128
    data.copy_(filled(count))
    assert client.save_checked(chain(2, count), list(data.unbind())) == count
    assert client.load([b.hash for b in chain(2, count)], list(out.unbind())) == count
    assert client.direct_saved == client.direct_loaded == 0
    assert same(out, data)


@pytest.mark.parametrize("persistent", [True, False])
def test_after_a_sidecar_restart_the_client_takes_the_new_sidecars_file(root, start_sidecar, persistent):
    """The restarted sidecar (its NVMe tier recovered, or started afresh) hands out its data
    file again: the client writes through that descriptor, not the one of the sidecar that
    went, so the sidecar itself reads back what the client wrote."""
    config = nvme_only(root, nvme={"persistent": persistent})
    first = start_sidecar(config)
    client = TierClient(config.socket_path, SHAPE, DTYPE)
    reader = TierClient(config.socket_path, SHAPE, DTYPE, direct_io=False)  # the sidecar reads
    client.retry_s = 0.0
    before, after, data = chain(15, 4), chain(16, 4), filled(4)
    try:
        assert client.save_checked(before, list(data.unbind())) == 4
        first.stop()
        assert client.lookup([b.hash for b in before]) == []  # down: a miss
        start_sidecar(config)
        assert client.save_checked(after, list(data.unbind())) == 4
        assert client.direct_saved == 8
        out = allocate_cache((4, *SHAPE), DTYPE, CPU)
        assert reader.load([b.hash for b in after], list(out.unbind())) == 4 and same(out, data)
        out.zero_()
        assert client.load([b.hash for b in before], list(out.unbind())) == (4 if persistent else 0)
        assert same(out, data) if persistent else client.direct_loaded == 0
        assert client.corrupt_blocks == reader.corrupt_blocks == 0
    finally:
        client.close()
        reader.close()


def test_a_checked_save_whose_own_write_fails_raises_and_its_slots_go_back(root, start_sidecar, monkeypatch):
    """The OSError reaches the caller, and the connection goes with it: the NVMe slots its
    reserve took are the sidecar's again (not held by a connection that will never put)."""
    config = nvme_only(root)
    service = start_sidecar(config).service
    client = TierClient(config.socket_path, SHAPE, DTYPE)
    blocks, data = chain(17, 4), list(filled(4).unbind())

    def failing(*args: object) -> list[int]:
        raise OSError(errno.EIO, "injected")

    try:
        monkeypatch.setattr(copies_module, "write_blocks", failing)
        with pytest.raises(OSError, match="injected"):
            client.save_checked(blocks, data)
        monkeypatch.undo()
        writer = service.state.require().writer  # (configured by the client's hello)
        # The sidecar's thread sees the connection end, and gives the slots back.
        eventually(lambda: not writer.in_flight, "the failed save's NVMe slots given back", timeout_s=60)
        assert client.save_checked(blocks, data) == 4 and client.direct_saved == 4
    finally:
        client.close()


def test_a_client_told_not_to_stages_its_blocks(connect):
    client = connect(direct_io=False)
    assert client.save_checked(chain(3, 4), list(filled(4).unbind())) == 4
    assert client.direct_saved == 0


def test_beside_a_shared_tier_what_nvme_refuses_is_staged_for_it_and_asked_once(root, start_sidecar):
    """Write-back with a shared tier: NVMe's doorkeeper (its tier full) refuses a block at its
    first save (the reserve asks it), and the block goes to the shared tier through a staging
    slot without NVMe being asked again at the put (a second sighting would let it in)."""
    shared = {"enabled": True}
    nvme = {"admission": "doorkeeper"}
    config = nvme_only(root, nvme_blocks=16, nvme=nvme, shared=shared, write_mode="write-back")
    start_sidecar(config)
    client = TierClient(config.socket_path, SHAPE, DTYPE)
    blocks, data, out = chain(10, 4), filled(4), allocate_cache((4, *SHAPE), DTYPE, CPU)
    keys = [b.hash for b in blocks]
    try:
        assert client.save_checked(chain(11, 16), list(filled(16, seed=1).unbind())) == 16  # fills NVMe
        assert client.direct_saved == 16
        client.direct_saved = 0
        assert client.save_checked(blocks, list(data.unbind())) == 4
        assert client.direct_saved == 0 and client.lookup(keys) == ["shared"] * 4
        assert client.load(keys, list(out.unbind())) == 4 and client.direct_loaded == 0
        assert same(out, data)
        assert client.save_checked(blocks, list(data.unbind())) == 4  # the second sighting
        assert client.direct_saved == 4 and client.lookup(keys) == ["nvme"] * 4
        out.zero_()
        assert client.load(keys, list(out.unbind())) == 4 and client.direct_loaded == 4
        assert same(out, data)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("overrides", "block_bytes", "reason"),
    [
        ({"shared": {"enabled": True}, "write_mode": "write-through"}, BLOCK_BYTES, "write-through mode"),
        ({}, BLOCK_BYTES + 512, "not whole 4096-byte pages"),
        ({"nvme": {"capacity_bytes": 0}}, BLOCK_BYTES, "the NVMe tier is off"),
    ],
)
def test_direct_io_is_refused_naming_why(root, overrides, block_bytes, reason, caplog):
    config = kvtier_config(root, dram={"capacity_bytes": 0}, **overrides)
    service = KVTierService(config)
    try:
        with caplog.at_level(logging.INFO, logger="strata.worker.kvtier.direct"):
            assert service.configure(block_bytes)["direct_io"] is False
        said = [r.getMessage() for r in caplog.records if "direct_io" in r.getMessage()]
        if service.nvme is None:
            assert said == []  # no NVMe tier, nothing staged: nothing to say
        else:
            (line,) = said
            assert line.startswith("kvtier: engines stage NVMe blocks (direct_io): ") and reason in line
        with pytest.raises(ValueError, match=reason):
            service.direct_io(Owner())
        with pytest.raises(ValueError, match="not granted direct_io"):
            service.reserve_direct(Owner(), [b"k" * 16], None, direct=True)
    finally:
        service.close()


@pytest.fixture
def service(root):
    service = KVTierService(nvme_only(root, nvme_blocks=8))
    service.configure(BLOCK_BYTES)
    yield service
    service.close()


def granted(service: KVTierService) -> Owner:
    owner = Owner()
    service.direct_io(owner)
    return owner


def free_nvme(service: KVTierService) -> int:
    assert service.nvme is not None
    return len(service.nvme._free)


def test_a_sidecar_that_offers_direct_io_says_so_once(root, caplog):
    service = KVTierService(nvme_only(root))
    try:
        with caplog.at_level(logging.INFO, logger="strata.worker.kvtier.direct"):
            service.configure(BLOCK_BYTES)
            service.configure(BLOCK_BYTES)  # a second client: the tiers are built already
        said = [r.getMessage() for r in caplog.records if "direct_io" in r.getMessage()]
        assert said == ["kvtier: engines may read and write their NVMe blocks themselves (direct_io)"]
    finally:
        service.close()


def test_slots_of_a_connection_that_ends_before_its_put_are_free_again(service):
    owner = granted(service)
    keys = [b.hash for b in chain(4, 5)]
    slots, nvme = service.reserve_direct(owner, keys, None, direct=True)
    assert slots == [None] * 5 and None not in nvme
    assert free_nvme(service) == 3
    service.drop_owner(owner)
    assert free_nvme(service) == 8 and not owner.direct
    again = granted(service)
    assert None not in service.reserve_direct(again, keys, None, direct=True)[1]  # not "in flight"


def test_a_put_naming_a_slot_it_was_not_given_takes_nothing(service):
    owner = granted(service)
    _, nvme = service.reserve_direct(owner, [b.hash for b in chain(5, 2)], None, direct=True)
    stranger = next(s for s in range(8) if s not in nvme)
    with pytest.raises(ValueError, match=f"nvme_slots: slot {stranger} is not reserved"):
        service.put(owner, [], [(nvme[0], 1), (stranger, 2)])
    assert set(owner.direct) == set(nvme)  # both still the connection's
    with pytest.raises(ValueError, match="appears twice"):
        service.put(owner, [], [(nvme[0], 1), (nvme[0], 1)])


def test_a_put_that_fails_on_its_staging_blocks_gives_its_nvme_slots_back(service):
    owner = granted(service)
    _, nvme = service.reserve_direct(owner, [b.hash for b in chain(6, 2)], None, direct=True)
    bad = PutBlock(b"x" * 16, b"\0" * 16, slot=10_000)  # a staging slot never reserved
    with pytest.raises(ValueError, match="not reserved by this connection"):
        service.put(owner, [bad], [(nvme[0], 1)])
    assert free_nvme(service) == 7  # the put's slot is back; the other is still reserved


def test_a_put_of_blocks_written_through_and_blocks_the_engine_wrote_syncs_once(root, monkeypatch):
    """Write-through with a DRAM tier of two blocks behind a doorkeeper: in one reserve the
    block seen before enters DRAM (and the sidecar writes it through to NVMe) and the new one
    is the engine's to write; their put makes both durable in one ``fdatasync``."""
    config = kvtier_config(
        root,
        write_mode="write-through",
        dram={"capacity_bytes": 2 * BLOCK_BYTES, "admission": "doorkeeper"},
        nvme={"capacity_bytes": 16 * BLOCK_BYTES},
    )
    service = KVTierService(config)
    service.configure(BLOCK_BYTES)
    try:
        full, seen, new = chain(12, 2), chain(13, 1)[0].hash, chain(14, 1)[0].hash
        owner = granted(service)
        slots, _ = service.reserve_direct(owner, [b.hash for b in full], None, direct=True)
        assert None not in slots  # DRAM has room for both
        into = [PutBlock(b.hash, b.parent, cast(int, s)) for b, s in zip(full, slots, strict=True)]
        service.put(owner, into)
        slots, nvme = service.reserve_direct(owner, [seen], None, direct=True)  # a first sighting
        assert slots == [None] and nvme[0] is not None  # DRAM (full) refused it: the engine's
        service.drop_owner(owner)  # the put never came; the sighting stays
        owner = granted(service)
        slots, nvme = service.reserve_direct(owner, [seen, new], None, direct=True)
        assert slots[0] is not None and nvme == [None, nvme[1]] and nvme[1] is not None
        syncs: list[int] = []
        monkeypatch.setattr(os, "fdatasync", lambda fd: syncs.append(fd))
        count = service.put(owner, [PutBlock(seen, b"\0" * 16, slots[0])], [(nvme[1], 7)])
        assert count == 2 and len(syncs) == 1
        assert service.nvme is not None and seen in service.nvme.index and new in service.nvme.index
    finally:
        service.close()


def test_bytes_that_are_not_what_the_put_said_are_never_served(root, connect):
    client, blocks, data = connect(), chain(7, 4), filled(4)
    assert client.save_checked(blocks, list(data.unbind())) == 4
    with open(root / "nvme" / "blocks.dat", "r+b") as disk:  # slots 0-3, in order
        disk.seek(2 * BLOCK_BYTES + 100)
        disk.write(b"torn")
    out = allocate_cache((4, *SHAPE), DTYPE, CPU)
    assert client.load([b.hash for b in blocks], list(out.unbind())) == 2
    assert client.corrupt_blocks == 1
    assert client.lookup([b.hash for b in blocks]) == ["nvme", "nvme"]  # the bad one dropped


def test_a_slot_the_engine_reads_is_not_rewritten_until_it_is_released(service):
    reader, writer = granted(service), granted(service)
    first = chain(8, 8)
    _, nvme = service.reserve_direct(writer, [b.hash for b in first], None, direct=True)
    service.put(writer, [], [(slot, 0) for slot in nvme if slot is not None])
    found = service.get_direct(reader, [first[0].hash])
    assert found is not None and len(found) == 1
    ((leased, _),) = found
    # A full tier: eight more blocks evict all eight, but the leased slot is not handed out.
    _, again = service.reserve_direct(writer, [b.hash for b in chain(9, 8)], None, direct=True)
    assert leased not in again and again.count(None) == 1
    service.release(reader, [], [leased])
    assert free_nvme(service) == 1 and service.nvme is not None and leased in service.nvme._free


def test_the_bytes_an_engine_moves_itself_are_counted_apart_and_in_the_totals(service):
    sample = service.metrics.registry.get_sample_value
    assert sample("strata_kvtier_direct_written_bytes_total", {"tier": "nvme"}) == 0
    owner, blocks = granted(service), chain(15, 3)
    _, nvme = service.reserve_direct(owner, [b.hash for b in blocks], None, direct=True)
    service.put(owner, [], [(slot, 0) for slot in nvme if slot is not None])
    found = service.get_direct(owner, [b.hash for b in blocks[:2]])
    assert found is not None and len(found) == 2
    for name, count in (("written", 3), ("read", 2)):
        direct = sample(f"strata_kvtier_direct_{name}_bytes_total", {"tier": "nvme"})
        assert direct == sample(f"strata_kvtier_{name}_bytes_total", {"tier": "nvme"}) == count * BLOCK_BYTES


def test_descriptors_travel_beside_a_frame_not_in_it(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"data")
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(path, os.O_RDONLY)
    try:
        protocol.send(left, {"ok": True, "n": 1, protocol.FDS_FIELD: [fd]})
        protocol.send(left, {"ok": True, "n": 2})
        passed: list[int] = []
        assert protocol.receive(right, passed) == {"ok": True, "n": 1}
        assert len(passed) == 1 and os.fstat(passed[0]).st_ino == os.fstat(fd).st_ino
        assert protocol.receive(right) == {"ok": True, "n": 2}
        os.close(passed[0])
    finally:
        os.close(fd)
        left.close()
        right.close()
