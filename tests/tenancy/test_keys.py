"""Tenant B cannot make its keys A's: whatever B's requests carry (a vLLM ``cache_salt`` naming A's
cache namespace, a LoRA name), B's roots are salted with B's cache namespace first, so B's chains
never meet A's, on either engine."""

from __future__ import annotations

import pytest

from strata.worker.kv_connector import chain_hashes, root_hash
from strata.worker.vllm.keys import vllm_root

from .conftest import TENANT_A, TENANT_B

PROMPT = list(range(64))


@pytest.mark.parametrize("salt", [None, TENANT_A, TENANT_B, ""])
@pytest.mark.parametrize("lora", [None, "adapter"])
def test_bs_vllm_roots_are_never_as_whatever_its_requests_carry(salt: str | None, lora: str | None) -> None:
    a_roots = {
        vllm_root(TENANT_A, "m", 16, device, salt=s) for device in ("cpu", "cuda") for s in (None, TENANT_A)
    }
    b_root = vllm_root(TENANT_B, "m", 16, "cpu", salt=salt, lora=lora)
    assert b_root not in a_roots | {root_hash(TENANT_A, "m", 16)}


def test_the_same_prompt_chains_apart_from_the_first_block() -> None:
    a = chain_hashes(root_hash(TENANT_A, "m", 16), PROMPT, 16)
    b = chain_hashes(root_hash(TENANT_B, "m", 16), PROMPT, 16)
    assert len(a) == len(b) == 4 and not set(a) & set(b)
