"""``spec.engine``: which inference engine serves the model, and its tuning.

Two engines sit behind the same InferenceService: ``torch``, Strata's built-in worker, and
``vllm``, vLLM's OpenAI server with Strata's KV connector. The operator renders every flag that
ties the engine to the rest of the platform (the model, ports, block size, tensor parallelism,
KV events, the connector); ``spec.engine.vllm.args`` passes anything else through, and refuses,
naming it, a flag the operator owns.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from strata.common.blocks import BLOCK_SIZE
from strata.operator.api.base import ApiModel
from strata.operator.api.cel import rule, rules

EngineKind = Literal["torch", "vllm"]
VLLM_CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention kernels take blocks of multiples of 32 tokens
MAX_VLLM_ARGS = 64
MAX_VLLM_ARG_CHARS = 2048  # with MAX_VLLM_ARGS, what keeps the CEL rule within its cost budget

# Every `vllm serve` flag the operator renders or rules out, and where its value comes from
# instead. Underscores and dashes are the same flag to vLLM; `--no-X` is X's negation, and
# `--X.key=value` sets one key of X's JSON.
VLLM_OWNED_FLAGS: dict[str, str] = {
    "model": "spec.model sets it",
    "served-model-name": "spec.model.name sets it",
    "tokenizer": "the router tokenizes with the model's own tokenizer, as the engine must",
    "chat-template": "the router renders the model's own chat template, as the engine must",
    "host": "the engine listens on the pod IP",
    "port": "the operator sets the engine's port",
    "max-model-len": "spec.model.maxContextTokens sets it",
    "dtype": "spec.model.dtype sets it",
    "block-size": "spec.engine.blockSize sets it, for the engine and the KV-tier sidecar alike",
    "enable-prefix-caching": "prefix caching is always on: the KV tiers and the router rely on it",
    "max-num-seqs": "spec.engine.maxNumSeqs sets it",
    "max-num-batched-tokens": "spec.engine.maxBatchedTokens sets it",
    "kv-cache-memory-bytes": "spec.cache.hbm sets it",
    "tensor-parallel-size": "spec.resources.gpus sets it (a replica's GPUs are one tensor-parallel group)",
    "pipeline-parallel-size": "a replica's GPUs are one tensor-parallel group (spec.resources.gpus)",
    "data-parallel-size": "one pod is one replica: scale with spec.replicas",
    "nnodes": "one pod is one replica on one node",
    "node-rank": "one pod is one replica on one node",
    "headless": "the engine serves its own API",
    "kv-events-config": "the operator publishes KV events to the pod's KV-tier sidecar",
    "kv-transfer-config": "the operator loads Strata's KV connector",
    "disable-log-stats": "the autoscaler reads the engine's statistics",
    "enable-prompt-tokens-details": "the router reads every answer's cached tokens",
    "api-key": "the router checks API keys (spec.pod env) in front of the engines",
    "config": "a config file could set any flag; pass flags one by one",
}
# One-dash aliases of owned flags; every `-dp...` alias is a data-parallel setting.
VLLM_SHORT_FLAGS = {
    "-tp": "tensor-parallel-size",
    "-pp": "pipeline-parallel-size",
    "-n": "nnodes",
    "-r": "node-rank",
}
VLLM_OWNED_PREFIXES = ("data-parallel-",)

VllmArg = Annotated[str, Field(min_length=1, max_length=MAX_VLLM_ARG_CHARS)]


def owned_flags_regex() -> str:
    """RE2 matching an argument that sets an owned flag: the API server's copy of
    ``owned_flag_reason``, so `kubectl apply` refuses it before the operator sees it."""
    long = "|".join(name.replace("-", "[-_]") for name in sorted(VLLM_OWNED_FLAGS))
    prefixes = "|".join(p.replace("-", "[-_]") + ".*" for p in VLLM_OWNED_PREFIXES)
    short = "|".join(s.removeprefix("-") for s in sorted(VLLM_SHORT_FLAGS))
    return f"^(--(no[-_])?({long}|{prefixes})([=.].*)?|-({short}|dp[a-z]*)(=.*)?)$"


def vllm_flag(arg: str) -> str | None:
    """The canonical name of the flag ``arg`` is (``--max_num_seqs=8`` -> ``max-num-seqs``), or
    None where it is a value."""
    if arg.startswith("--"):
        name = arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
        return name.removeprefix("no-")
    if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
        short = arg.split("=", 1)[0]
        return VLLM_SHORT_FLAGS.get(short, "data-parallel-" if short.startswith("-dp") else short)
    return None


def owned_flag_reason(flag: str) -> str | None:
    """Why the operator owns ``flag`` (canonical name), or None where the tenant may set it."""
    if flag in VLLM_OWNED_FLAGS:
        return VLLM_OWNED_FLAGS[flag]
    if flag.startswith(VLLM_OWNED_PREFIXES):
        return VLLM_OWNED_FLAGS["data-parallel-size"]
    return None


def check_vllm_args(args: list[str]) -> None:
    """Refuse a positional argument first, and any flag the operator owns, naming it."""
    if args and vllm_flag(args[0]) is None:
        raise ValueError(
            f"spec.engine.vllm.args[0]: {args[0]!r} is not a flag; the model is spec.model's, "
            "so arguments start with a --flag"
        )
    for i, arg in enumerate(args):
        flag = vllm_flag(arg)
        reason = owned_flag_reason(flag) if flag is not None else None
        if reason is not None:
            raise ValueError(
                f"spec.engine.vllm.args[{i}]: {arg.split('=', 1)[0]} is owned by the operator: {reason}"
            )


_OWNED = owned_flags_regex()
_ARGS_RULES = rules(
    rule(
        "!has(self.args) || size(self.args) == 0 || self.args[0].startsWith('-')",
        "spec.engine.vllm.args[0]: arguments start with a --flag; the model is spec.model's",
        field_path=".args",
    ),
    rule(
        f"!has(self.args) || self.args.all(a, !a.matches('{_OWNED}'))",
        message_expression=f"'spec.engine.vllm.args: ' + self.args.filter(a, a.matches('{_OWNED}'))[0]"
        " + ' is owned by the operator'",
        field_path=".args",
    ),
)


class VllmEngineSpec(ApiModel):
    """What only the vLLM engine takes."""

    model_config = ConfigDict(json_schema_extra=_ARGS_RULES)

    args: list[VllmArg] = Field(
        default_factory=list,
        max_length=MAX_VLLM_ARGS,
        description="Extra `vllm serve` arguments, after the operator's own (e.g. `--enable-lora`, "
        "`--gpu-memory-utilization=0.85`, `--quantization=fp8`). Flags the operator sets are refused, "
        "naming the field that sets them instead: the model and its name, host and port, "
        "`--max-model-len`, `--dtype`, `--block-size`, prefix caching, `--max-num-seqs`, "
        "`--max-num-batched-tokens`, `--kv-cache-memory-bytes`, parallelism, `--kv-events-config`, "
        "`--kv-transfer-config`, `--tokenizer`, `--chat-template`, `--api-key`, `--config`.",
    )

    @field_validator("args")
    @classmethod
    def _not_owned(cls, args: list[str]) -> list[str]:
        check_vllm_args(args)
        return args


_VLLM_ONLY = rules(
    rule(
        "!has(self.vllm) || self.kind == 'vllm'",
        "spec.engine.vllm: only for kind vllm",
        field_path=".vllm",
    )
)


class EngineSpec(ApiModel):
    model_config = ConfigDict(json_schema_extra=_VLLM_ONLY)

    kind: EngineKind = Field(
        "torch",
        description="Inference engine: `torch` is Strata's built-in worker (Llama-family models); "
        "`vllm` is vLLM's OpenAI server with Strata's KV connector (any model vLLM serves; tensor "
        "parallel over the replica's GPUs).",
    )
    image: str | None = Field(
        None,
        max_length=512,
        description="Engine container image; unset uses the operator's default for the kind "
        "(`workerImage` or `vllmImage`). A vLLM image needs Strata installed beside vLLM "
        "(`pip install strata`) for its KV connector.",
    )
    block_size: int = Field(BLOCK_SIZE, ge=1, le=1024, description="Tokens per KV-cache block (tokens).")
    max_num_seqs: int = Field(64, ge=1, le=4096, description="Most sequences in one batch (sequences).")
    max_batched_tokens: int = Field(
        2048, ge=16, le=1048576, description="Token budget per scheduler step, for chunked prefill (tokens)."
    )
    vllm: VllmEngineSpec | None = Field(None, description="Settings only the vLLM engine takes.")

    @model_validator(mode="after")
    def _engine_specific(self) -> EngineSpec:
        if self.vllm is not None and self.kind != "vllm":
            raise ValueError(f"spec.engine.vllm: only for kind vllm (kind is {self.kind})")
        return self
