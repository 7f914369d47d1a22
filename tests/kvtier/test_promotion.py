"""Promotions read their blocks with the sidecar's lock released (``promotion``): what the
service does while a read is parked half-way, the state a read without the lock can meet.
Every wait here is bounded (``WAIT_S``) and ends with a message, so a deadlock fails the test
rather than hanging the suite."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.service import KVTierService, Owner

from .conftest import kvtier_config
from .test_service import BLOCK, _get, _put, key, make, payload, put

WAIT_S = 60.0  # far above any step here: only a deadlock reaches it
OPERATIONS = 1000  # per thread in the concurrent test: a few seconds here


class Gate:
    """Parks a store's reads at their start until opened; counts the blocks each read asks for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: object, names: tuple[str, ...]) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()
        self.reads: list[int] = []
        self.after: Callable[[Any], Any] = lambda result: result
        for name in names:
            monkeypatch.setattr(store, name, self._held(getattr(store, name)))

    def _held(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def read(*args: Any) -> Any:
            self.reads.append(len(args[0]) if isinstance(args[0], list) else 1)
            self.entered.set()
            assert self.go.wait(WAIT_S), "the test never let the read go on"
            return self.after(real(*args))

        return read

    def wait_entered(self) -> None:
        assert self.entered.wait(WAIT_S), "no read reached the store"


def nvme_gate(monkeypatch: pytest.MonkeyPatch, service: KVTierService) -> Gate:
    assert service.nvme is not None
    return Gate(monkeypatch, service.nvme.store, ("read", "read_unhashed"))


def waiting_for_promotions(monkeypatch: pytest.MonkeyPatch, service: KVTierService) -> threading.Event:
    """Set once a thread waits for another promotion's read to end (a load of the same blocks,
    or ``close``)."""
    waiting = threading.Event()
    condition = service.state.promoted
    real = condition.wait

    def wait(timeout: float | None = None) -> bool:
        waiting.set()
        return real(timeout)

    monkeypatch.setattr(condition, "wait", wait)
    return waiting


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(3) as executor:
        yield executor


def on_nvme_only(root: Any) -> KVTierService:
    """Blocks 0 and 1 on NVMe only, 9 in DRAM."""
    service = make(root, dram={"capacity_bytes": 4 * BLOCK}, retention_s=3600)
    put(service, list(range(10)))
    assert service.lookup([key(0), key(1)]) == ["nvme"] * 2 and service.lookup([key(9)])[-1] == "dram"
    return service


def result(future: Future[Any]) -> Any:
    return future.result(timeout=WAIT_S)


def test_lookups_and_saves_are_answered_while_a_load_reads_nvme(root, monkeypatch, pool):
    service = on_nvme_only(root)
    gate = nvme_gate(monkeypatch, service)
    loading = pool.submit(_get, service, [0, 1])
    gate.wait_entered()
    # The load is parked inside its disk read: another connection is served meanwhile.
    assert result(pool.submit(service.lookup, [key(0), key(9)])) == ["nvme", "dram"]
    assert result(pool.submit(_put, service, [20, 21])) == 2
    gate.go.set()
    assert result(loading) == [payload(0), payload(1)]
    assert gate.reads == [2]
    assert get_all(service, [0, 1, 20, 21]) == [payload(n) for n in (0, 1, 20, 21)]
    service.close()


@pytest.mark.parametrize("damaged", [False, True])
def test_an_nvme_block_dropped_while_read_keeps_its_slot_until_the_read_ends(
    root, monkeypatch, pool, damaged
):
    """Retention drops the blocks while a load reads them: their slots are not handed out
    before the read ends, and are free once after it. The bytes read are the blocks' and are
    served; read damaged, the block is not dropped a second time (the entry is not this one's)."""
    service = on_nvme_only(root)
    assert service.nvme is not None
    slot = entry(service, 0).slot
    gate = nvme_gate(monkeypatch, service)
    if damaged:
        gate.after = lambda sums: [sums[0] ^ 1, *sums[1:]]
    loading = pool.submit(_get, service, [0, 1])
    gate.wait_entered()
    assert service.sweep(now=time.time() + 7200) >= 2  # retention drops every block meanwhile
    assert slot not in service.nvme._free  # being read: a new block must not be written there
    gate.go.set()
    assert result(loading) == ([] if damaged else [payload(0), payload(1)])
    assert service.nvme._free.count(slot) == 1
    assert service.metrics.corrupt_blocks.labels("nvme")._value.get() == 0
    service.close()


def test_a_block_saved_again_while_it_was_read_is_served_from_one_dram_copy(root, monkeypatch, pool):
    """Retention drops block 0 while a load reads it and the engine saves it again: the load's
    commit finds it in DRAM already and serves that copy, giving its own slot back."""
    service = on_nvme_only(root)
    dram = service.dram
    assert dram is not None
    gate = nvme_gate(monkeypatch, service)
    loading = pool.submit(_get, service, [0, 1])
    gate.wait_entered()
    service.sweep(now=time.time() + 7200)
    assert result(pool.submit(_put, service, [0])) == 1
    saved = dram.index.get(key(0))
    assert saved is not None
    gate.go.set()
    assert result(loading) == [payload(0), payload(1)]
    assert dram.index.get(key(0)) is saved
    assert dram.free_slots() + len(dram.index) == dram.capacity  # no slot lost or held
    service.close()


def test_a_block_failing_its_checksum_is_dropped_from_nvme(root, monkeypatch, pool):
    service = on_nvme_only(root)
    assert service.nvme is not None
    slot = entry(service, 0).slot
    gate = nvme_gate(monkeypatch, service)
    gate.after = lambda sums: [sums[0] ^ 1, *sums[1:]]
    gate.go.set()
    assert _get(service, [0, 1]) == []
    assert key(0) not in service.nvme.index and service.nvme._free.count(slot) == 1
    assert service.metrics.corrupt_blocks.labels("nvme")._value.get() == 1
    service.close()


def test_a_load_of_blocks_a_prefetch_is_reading_waits_for_that_read(root, monkeypatch, pool):
    """The look-ahead's prefetch reads a queued request's blocks; the request's own load then
    takes them from DRAM once the prefetch commits, instead of reading them a second time."""
    service = on_nvme_only(root)
    gate = nvme_gate(monkeypatch, service)
    waiting = waiting_for_promotions(monkeypatch, service)
    service.prefetch([key(0), key(1)])
    gate.wait_entered()
    loading = pool.submit(_get, service, [0, 1])
    assert waiting.wait(WAIT_S), "the load did not wait for the prefetch's read"
    gate.go.set()
    assert result(loading) == [payload(0), payload(1)]
    assert gate.reads == [2]  # one read: the prefetch's
    assert service.metrics.read_waits.labels("nvme")._value.get() == 1  # block 0, once
    service.close()


def test_close_waits_for_a_read_in_flight(root, monkeypatch, pool):
    service = on_nvme_only(root)
    gate = nvme_gate(monkeypatch, service)
    waiting = waiting_for_promotions(monkeypatch, service)
    loading = pool.submit(service.get, Owner(), [key(0), key(1)])
    gate.wait_entered()
    closing = pool.submit(service.close)
    assert waiting.wait(WAIT_S), "close did not wait for the read"
    assert not closing.done()
    gate.go.set()
    assert len(result(loading)) == 2  # read from a store still open
    result(closing)
    with pytest.raises(RuntimeError, match="not configured"):
        service.get(Owner(), [key(0)])


def test_a_shared_tier_read_leaves_the_lock_free(root, monkeypatch, pool):
    service = make(
        root,
        write_mode="write-through",
        shared={"enabled": True},
        nvme={"capacity_bytes": 0},
        dram={"capacity_bytes": 4 * BLOCK},
    )
    put(service, list(range(10)))  # every block on the shared volume, 4 of them in DRAM too
    assert service.shared is not None
    where = {n: service.lookup([key(n)]) for n in range(10)}
    below, above = (next(n for n in range(10) if where[n] == [tier]) for tier in ("shared", "dram"))
    gate = Gate(monkeypatch, service.shared.store, ("read_checked",))
    loading = pool.submit(_get, service, [below])
    gate.wait_entered()
    assert result(pool.submit(service.lookup, [key(above)])) == ["dram"]
    gate.go.set()
    assert result(loading) == [payload(below)]
    service.close()


def entry(service: KVTierService, number: int) -> Entry:
    assert service.nvme is not None
    found = service.nvme.index.get(key(number))
    assert found is not None
    return found


def get_all(service: KVTierService, numbers: list[int]) -> list[bytes]:
    return [block for n in numbers for block in _get(service, [n])]


def test_loads_saves_prefetches_and_sweeps_at_once_keep_every_block_and_slot(root):
    """Four threads load, save, prefetch and sweep overlapping chains on small tiers (reads
    leave the lock, so they interleave with everything): every block read is the one saved,
    and at the end every slot is either free or holds a block, once, with no lease left."""
    config = kvtier_config(
        root, dram={"capacity_bytes": 16 * BLOCK}, nvme={"capacity_bytes": 48 * BLOCK}, retention_s=3600
    )
    service = KVTierService(config, staging_slots=8, background_demotion=True)
    service.configure(BLOCK)
    wrong: list[object] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(OPERATIONS):
            numbers = list(range(start := rng.randrange(80), start + rng.randrange(1, 8)))
            op = rng.random()
            if op < 0.4:
                _put(service, numbers)
            elif op < 0.8:
                got = _get(service, numbers)
                wrong.extend(n for n, data in zip(numbers, got, strict=False) if data != payload(n))
            elif op < 0.95:
                service.prefetch([key(n) for n in numbers])
            else:
                service.sweep(now=time.time() + rng.choice([0, 7200]))

    with ThreadPoolExecutor(4) as workers:
        for done in [workers.submit(work, seed) for seed in range(4)]:
            result(done)
    service.wait_for_hints()
    dram, nvme = service.dram, service.nvme
    assert dram is not None and nvme is not None and not wrong
    service.close()  # the background demoter stops: nothing moves below
    assert dram.free_slots() + len(dram.index) == dram.capacity and not dram._leases
    assert (
        len(set(nvme._free)) == len(nvme._free) and len(nvme._free) + len(nvme.index) == nvme.store.num_slots
    )
    assert not nvme._leases and not service.state.reading
    # A read that met another block in its slot (one evicted and its slot rewritten meanwhile)
    # would have failed its checksum: none did.
    assert all(service.metrics.corrupt_blocks.labels(t)._value.get() == 0 for t in ("dram", "nvme"))
