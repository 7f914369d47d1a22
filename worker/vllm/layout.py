"""vLLM's paged KV cache, one tensor per layer, read and written in Strata's block layout.

A Strata block holds one block of tokens' keys and values for every layer, contiguous, in the
built-in engine's layout ``[layers, 2, block_size, kv_heads, head_dim]`` (``kv_connector``), so
a block's bytes mean the same whatever attention backend wrote them: a service moved from CPU
to GPU nodes finds its NVMe blocks still right. Each vLLM attention backend shapes a layer's
cache its own way; :func:`layer_layout` recognises the ones vLLM's backends use and refuses the
rest (the connector then stays off, and says why), rather than guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

# (2, N, B, H, D): flash-attn, triton and flashinfer's NHD; (N, 2, B, H, D): kv-first per
# block; (2, N, H, B, D): HND; (N, H, B, 2D): vLLM's CPU backend, which views it as
# (N, H, 2B, D): per head, a block's B keys, then its B values.
Kind = Literal["kv_nbhd", "n_kv_bhd", "kv_nhbd", "cpu_nhb2d"]


class UnsupportedLayout(ValueError):
    """A layer's cache has a shape none of the known layouts give."""


@dataclass(frozen=True)
class CacheGeometry:
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int

    @property
    def per_layer(self) -> tuple[int, int, int, int]:
        return (2, self.block_size, self.num_kv_heads, self.head_dim)


def layer_layout(shape: Sequence[int], geometry: CacheGeometry) -> Kind:
    n, b, h, d = geometry.num_blocks, geometry.block_size, geometry.num_kv_heads, geometry.head_dim
    known: dict[tuple[int, ...], Kind] = {
        (2, n, b, h, d): "kv_nbhd",
        (n, 2, b, h, d): "n_kv_bhd",
        (2, n, h, b, d): "kv_nhbd",
        (n, h, b, 2 * d): "cpu_nhb2d",
    }
    kind = known.get(tuple(shape))
    if kind is None:
        raise UnsupportedLayout(
            f"KV cache layer of shape {tuple(shape)} is none of the layouts Strata reads "
            f"(blocks {n}, block size {b}, KV heads {h}, head dim {d})"
        )
    return kind


def gather(layer: torch.Tensor, kind: Kind, ids: torch.Tensor) -> torch.Tensor:
    """Blocks ``ids`` of one layer as ``[n, 2, block_size, kv_heads, head_dim]`` (a new tensor)."""
    if kind == "kv_nbhd":
        return layer.index_select(1, ids).transpose(0, 1)
    if kind == "n_kv_bhd":
        return layer.index_select(0, ids)
    if kind == "kv_nhbd":
        return layer.index_select(1, ids).transpose(0, 1).transpose(2, 3)
    blocks = layer.index_select(0, ids)  # [n, H, B, 2D]: per head, B keys then B values
    n, h, b, d2 = blocks.shape
    return blocks.view(n, h, 2, b, d2 // 2).permute(0, 2, 3, 1, 4)


def scatter(layer: torch.Tensor, kind: Kind, ids: torch.Tensor, data: torch.Tensor) -> None:
    """Write ``data`` (``[n, 2, block_size, kv_heads, head_dim]``) into blocks ``ids`` of a layer."""
    if kind == "kv_nbhd":
        layer[:, ids] = data.transpose(0, 1)
    elif kind == "n_kv_bhd":
        layer[ids] = data
    elif kind == "kv_nhbd":
        layer[:, ids] = data.transpose(2, 3).transpose(0, 1)
    else:
        n, _, b, h, d = data.shape
        layer[ids] = data.permute(0, 3, 1, 2, 4).reshape(n, h, b, 2 * d)


@dataclass(frozen=True)
class PagedCache:
    """Every layer of one worker's cache, in layer order, with its layout."""

    layers: tuple[torch.Tensor, ...]
    kinds: tuple[Kind, ...]
    geometry: CacheGeometry

    @property
    def block_shape(self) -> tuple[int, ...]:
        return (len(self.layers), *self.geometry.per_layer)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].dtype

    @property
    def device(self) -> torch.device:
        return self.layers[0].device

    def read(self, block_ids: Sequence[int], out: torch.Tensor) -> None:
        """Blocks ``block_ids`` into ``out`` (``[n, *block_shape]``)."""
        ids = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        for i, (layer, kind) in enumerate(zip(self.layers, self.kinds, strict=True)):
            out[:, i].copy_(gather(layer, kind, ids))

    def write(self, block_ids: Sequence[int], data: torch.Tensor) -> None:
        """``data`` (``[n, *block_shape]``) into blocks ``block_ids``."""
        ids = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        for i, (layer, kind) in enumerate(zip(self.layers, self.kinds, strict=True)):
            scatter(layer, kind, ids, data[:, i])


def paged_cache(layers: Sequence[torch.Tensor], geometry: CacheGeometry) -> PagedCache:
    kinds = tuple(layer_layout(layer.shape, geometry) for layer in layers)
    return PagedCache(tuple(layers), kinds, geometry)
