"""Where a GPU engine's DRAM load and save spend their time: 96 blocks of 2 MiB through a real
sidecar, the GPU hashing them; cProfile of 10 loads and 10 saves (top functions by own time),
and the GPU hash's parts timed apart (each followed by a synchronisation)."""

from __future__ import annotations

import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

import torch

from bench.kvtier_bandwidth import BLOCK_SHAPE, DTYPE, tier_client, wait_sealed
from bench.kvtier_sidecar import refs
from strata.worker.kvtier import devicehash, xxh3parts
from strata.worker.kvtier.blockcopy import flat_bytes

BLOCKS = 96


def profiled(label: str, run) -> None:
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    for i in range(10):
        run(i)
    profile.disable()
    print(f"== {label}: {(time.perf_counter() - started) * 100:.2f} ms each")
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-3000:])


def timed(label: str, run) -> object:
    torch.cuda.synchronize()
    started = time.perf_counter()
    value = run()
    torch.cuda.synchronize()
    print(f"{label}: {(time.perf_counter() - started) * 1e3:.3f} ms")
    return value


def hash_parts(blocks: list[torch.Tensor]) -> None:
    flat = [flat_bytes(b) for b in blocks]
    shape = xxh3parts.layout(flat[0].numel())
    for _ in range(3):
        devicehash.checksums(flat)
    timed("usable", lambda: devicehash.usable(flat))
    addresses = timed("addresses", lambda: torch.tensor([t.data_ptr() for t in flat]).cuda())
    tables = devicehash._tables(flat[0].device)
    sums = torch.empty(BLOCKS * (shape.whole_blocks + 1) * 8, dtype=torch.int64, device="cuda")
    out = torch.empty(BLOCKS, dtype=torch.int64, device="cuda")
    for _ in range(2):
        timed("piece sums kernel", lambda: devicehash.sum_pieces(addresses, tables, sums, shape))
        timed("chain kernel", lambda: devicehash.run_chains(addresses, tables, sums, out, shape))
    timed("to host", lambda: out.cpu().tolist())
    timed("checksums, all", lambda: devicehash.checksums(flat))


def main() -> None:
    source = [torch.randn(BLOCK_SHAPE, device="cuda").to(DTYPE) for _ in range(BLOCKS)]
    out = [torch.empty_like(b) for b in source]
    hash_parts(source)
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        room = 40 * BLOCKS * (2 << 20)
        with tier_client(Path(root), "dram", {}, dram=room, threads=8) as (client, _):
            chain = refs(1, BLOCKS)
            client.save_checked(chain, source)
            wait_sealed(client)
            keys = [r.hash for r in chain]
            for _ in range(3):
                assert client.load(keys, out) == BLOCKS
            profiled("load", lambda i: client.load(keys, out))
            profiled("save", lambda i: (client.save(refs(100 + i, BLOCKS), source), wait_sealed(client)))


if __name__ == "__main__":
    main()
