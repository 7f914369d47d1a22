"""Next-token choice: greedy at temperature 0, else temperature, top-k and nucleus (top-p)
sampling from a per-request generator, so a seeded request gives the same text whatever it
shares a batch with. Log-probabilities come from the same logits, so they cost one softmax."""

from __future__ import annotations

import torch
from torch import Tensor

from strata.worker.engine.sequence import SamplingParams, TokenLogprob


def _filtered(probs: Tensor, params: SamplingParams) -> Tensor:
    """``probs`` with tokens outside top-k and top-p zeroed (multinomial renormalises)."""
    sorted_probs, order = probs.sort(descending=True)
    if 0 < params.top_k < sorted_probs.numel():
        sorted_probs[params.top_k :] = 0.0
        sorted_probs /= sorted_probs.sum()  # top-p applies to what top-k kept, as in vLLM
    if params.top_p < 1.0:
        outside = sorted_probs.cumsum(-1) - sorted_probs > params.top_p  # keep the first past top_p
        sorted_probs[outside] = 0.0
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def sample_one(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    if params.temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0 or params.top_k > 0:
        probs = _filtered(probs, params)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprob(logits: Tensor, token: int, top: int) -> TokenLogprob:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    best = logprobs.topk(top) if top > 0 else None
    pairs = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True))
    return TokenLogprob(token, float(logprobs[token]), pairs)


class Sampler:
    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = seed
        self.device = device
        self._generators: dict[int, torch.Generator] = {}

    def sample(self, seq_id: int, logits: Tensor, params: SamplingParams) -> int:
        generator = None
        if params.temperature > 0:
            generator = self._generators.get(seq_id)
            if generator is None:
                seed = params.seed if params.seed is not None else self.seed * 1_000_003 + seq_id
                generator = torch.Generator(device=self.device).manual_seed(seed)
                self._generators[seq_id] = generator
        return sample_one(logits, params, generator)

    def forget(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)
