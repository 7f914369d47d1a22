"""Every known vLLM cache layout read and written in Strata's block layout, exactly."""

from __future__ import annotations

import pytest
import torch

from strata.worker.vllm.layout import CacheGeometry, UnsupportedLayout, layer_layout, paged_cache

GEO = CacheGeometry(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=3)
N, B, H, D = 6, 4, 2, 3
SHAPES = {
    "kv_nbhd": (2, N, B, H, D),
    "n_kv_bhd": (N, 2, B, H, D),
    "kv_nhbd": (2, N, H, B, D),
    "cpu_nhb2d": (N, H, B, 2 * D),
}


def key_value(
    layer: torch.Tensor, kind: str, block: int, token: int, head: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's key and value as each backend's attention kernel finds them."""
    if kind == "kv_nbhd":
        return layer[0, block, token, head], layer[1, block, token, head]
    if kind == "n_kv_bhd":
        return layer[block, 0, token, head], layer[block, 1, token, head]
    if kind == "kv_nhbd":
        return layer[0, block, head, token], layer[1, block, head, token]
    halves = layer.view(N, H, 2 * B, D).chunk(2, dim=2)  # vLLM's CPU backend: keys, then values
    return halves[0][block, head, token], halves[1][block, head, token]


@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_blocks_read_out_in_strata_layout_and_back(kind: str) -> None:
    torch.manual_seed(0)
    layers = [torch.randn(SHAPES[kind]) for _ in range(3)]
    cache = paged_cache(layers, GEO)
    assert cache.kinds == (kind,) * 3 and cache.block_shape == (3, 2, B, H, D)
    out = torch.empty((2, *cache.block_shape))
    cache.read([4, 1], out)
    for i, block in enumerate([4, 1]):
        for layer_no, layer in enumerate(layers):
            k, v = key_value(layer, kind, block, token=3, head=1)
            assert torch.equal(out[i, layer_no, 0, 3, 1], k) and torch.equal(out[i, layer_no, 1, 3, 1], v)
    before = [layer.clone() for layer in layers]
    cache.write([0, 5], out)
    for layer, old in zip(layers, before, strict=True):
        for src, dst in ((4, 0), (1, 5)):
            assert (
                key_value(layer, kind, dst, 2, 0)[1].tolist() == key_value(old, kind, src, 2, 0)[1].tolist()
            )
        assert torch.equal(key_value(layer, kind, 2, 0, 0)[0], key_value(old, kind, 2, 0, 0)[0])  # untouched


def test_an_unknown_layout_is_refused_naming_its_shape() -> None:
    with pytest.raises(UnsupportedLayout, match=r"\(6, 4, 2, 7\)"):
        layer_layout((6, 4, 2, 7), GEO)
