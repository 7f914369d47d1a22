"""The GPU's XXH3 (strata.worker.kvtier.devicehash) alone on 96 blocks of 2 MiB, by PIECES (1 KiB
pieces a program of the first kernel sums) and UNROLL (pieces' sums a chain loads at once),
against a device-to-device copy of the same bytes: GB/s, best of 20 after 3 warm-ups, and
whether each matches the host's xxhash."""

from __future__ import annotations

import json
import time

import torch
import xxhash

from strata.worker.kvtier import devicehash

BLOCKS, SIZE = 96, 2 << 20


def best_gbps(run) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return round(BLOCKS * SIZE / min(times) / 1e9, 1)


def main() -> None:
    cache = torch.randint(0, 256, (BLOCKS, SIZE), dtype=torch.uint8, device="cuda")
    blocks = [cache[i] for i in range(BLOCKS)]
    want = [xxhash.xxh3_64_intdigest(cache[i].cpu().numpy().tobytes()) for i in range(4)]
    copy = torch.empty_like(cache)
    result = {"d2d_copy_gbps": best_gbps(lambda: copy.copy_(cache))}
    for pieces, unroll in ((32, 8), (16, 8), (32, 16), (64, 8)):
        devicehash.PIECES, devicehash.UNROLL = pieces, unroll
        name = f"pieces_{pieces}_unroll_{unroll}"
        result[f"{name}_matches"] = devicehash.checksums(blocks[:4]) == want
        result[f"{name}_gbps"] = best_gbps(lambda: devicehash.checksums(blocks))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
