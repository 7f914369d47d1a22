"""Read a .safetensors file one tensor at a time, straight into memory the caller keeps.

The ``safetensors`` library maps the whole file: every page it touches counts in the process's
resident memory until the file is closed, so loading a shard costs the shard's size on top of
the weights kept. The format is simple (an 8-byte little-endian header length, a JSON header of
``name -> dtype, shape, data_offsets``, then the bytes), so we allocate each tensor once, in its
final dtype and on its final device, and ``readinto`` it (through a small staging buffer when it
is cast or moved): resident memory grows by what is kept and nothing else.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
MAX_HEADER_BYTES = 100 * 2**20
STAGING_BYTES = 4 * 2**20  # read buffer for tensors that change dtype or device on the way in


class SafetensorsError(RuntimeError):
    """The file is not a well-formed safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute file offsets
    end: int


def read_header(f: io.FileIO, path: Path) -> list[TensorInfo]:
    (size,) = struct.unpack("<Q", f.read(8))
    if size > MAX_HEADER_BYTES:
        raise SafetensorsError(f"{path}: header of {size} bytes is implausible")
    header = json.loads(f.read(size))
    infos = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in DTYPES:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        infos.append(
            TensorInfo(name, DTYPES[entry["dtype"]], tuple(entry["shape"]), 8 + size + begin, 8 + size + end)
        )
    return sorted(infos, key=lambda info: info.begin)  # sequential reads


def _check_size(info: TensorInfo, nbytes: int, path: Path) -> None:
    if nbytes != info.end - info.begin:
        raise SafetensorsError(
            f"{path}: tensor {info.name} has {info.end - info.begin} bytes for shape {info.shape}"
        )


def _read_exact(f: io.FileIO, into: torch.Tensor, info: TensorInfo, path: Path) -> None:
    raw = into.reshape(-1).view(torch.uint8).numpy()
    if raw.nbytes and f.readinto(raw.data) != raw.nbytes:
        raise SafetensorsError(f"{path}: file ends inside tensor {info.name}")


def _read_cast(f: io.FileIO, out: torch.Tensor, info: TensorInfo, path: Path, staging: torch.Tensor) -> None:
    """Through one reused staging buffer, chunk by chunk into ``out`` (another dtype or device):
    no temporary the size of the tensor, so no heap holes of varying sizes either."""
    flat = out.reshape(-1)
    itemsize = torch.empty((), dtype=info.dtype).element_size()
    step = staging.numel() // itemsize
    for start in range(0, flat.numel(), step):
        count = min(step, flat.numel() - start)
        chunk = staging[: count * itemsize]
        _read_exact(f, chunk, info, path)
        flat[start : start + count].copy_(chunk.view(info.dtype))


def _read(
    f: io.FileIO,
    info: TensorInfo,
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    staging: torch.Tensor,
) -> torch.Tensor:
    out = torch.empty(info.shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=info.dtype).element_size()
    _check_size(info, out.numel() * itemsize, path)
    f.seek(info.begin)
    if dtype == info.dtype and device.type == "cpu":
        _read_exact(f, out, info, path)
    else:
        _read_cast(f, out, info, path, staging)
    return out


def iter_tensors(
    path: str | Path, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of the file, one at a time, as ``dtype`` (default: as stored) on ``device``
    (default: the CPU), allocated once in its final form."""
    file, target = Path(path), device or torch.device("cpu")
    staging = torch.empty(STAGING_BYTES, dtype=torch.uint8)
    with file.open("rb", buffering=0) as f:
        try:
            infos = read_header(f, file)
        except (struct.error, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SafetensorsError(f"{file}: not a safetensors file: {exc}") from exc
        for info in infos:
            yield info.name, _read(f, info, file, dtype or info.dtype, target, staging)
