"""The built-in profiles: ``gpu`` (an H100 SXM serving an 8B model, from published figures) and
``cpu`` (this project's worker with the ``small`` test model on the development machine, fitted
to ``make bench`` figures). docs/autoscaling.md gives every figure's source and reasoning."""

from __future__ import annotations

from pathlib import Path

from strata.sim.profile import Profile, ReadBandwidth, load

# ---- gpu: NVIDIA H100 SXM 80 GB, Llama-3.1-8B in bfloat16 ----
H100_BF16_FLOPS = 989e12  # dense tensor-core peak (H100 datasheet)
H100_HBM_BYTES_PER_S = 3.35e12  # HBM3 bandwidth (H100 datasheet)
LLAMA_8B_PARAMS = 8.03e9  # Llama-3.1-8B model card
LLAMA_8B_LAYERS, LLAMA_8B_HIDDEN = 32, 4096
LLAMA_8B_KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2  # layers x (K, V) x 8 KV heads x 128 dims x bf16
PREFILL_MFU = 0.5  # share of peak a long prefill's matmuls reach (FlashAttention-class kernels)
ATTENTION_MFU = 0.4
BANDWIDTH_EFFICIENCY = 0.8  # share of peak HBM bandwidth a decode step's reads reach

GPU = Profile(
    name="gpu",
    description="NVIDIA H100 SXM 80 GB, Llama-3.1-8B bf16, one GPU per replica, vLLM-class engine",
    kv_bytes_per_token=LLAMA_8B_KV_BYTES_PER_TOKEN,
    # 80 GB (85.0e9 bytes as the driver reports them) minus 16.1 GB of weights, minus ~4.5 GB of
    # CUDA context, activations and workspaces; the tier's hbm.kvFraction of the rest holds KV.
    memory_free_bytes=64_000_000_000,
    max_batched_tokens=8192,  # vLLM's default chunked-prefill budget for online serving
    max_num_seqs=64,  # the InferenceService default (spec.engine.maxNumSeqs)
    overhead_s=0.001,  # scheduling and launch per step, with CUDA graphs
    floor_s=2 * LLAMA_8B_PARAMS / (H100_HBM_BYTES_PER_S * BANDWIDTH_EFFICIENCY),
    prefill_token_s=2 * LLAMA_8B_PARAMS / (H100_BF16_FLOPS * PREFILL_MFU),
    attention_pair_s=4 * LLAMA_8B_LAYERS * LLAMA_8B_HIDDEN / (H100_BF16_FLOPS * ATTENTION_MFU),
    decode_seq_s=2 * LLAMA_8B_PARAMS / (H100_BF16_FLOPS * PREFILL_MFU),
    decode_context_token_s=LLAMA_8B_KV_BYTES_PER_TOKEN / (H100_HBM_BYTES_PER_S * BANDWIDTH_EFFICIENCY),
    # Host DRAM over PCIe Gen5 x16 (64 GB/s raw; ~50 GB/s measured host-to-device with pinned
    # memory); a data-center NVMe drive (PCIe Gen4, ~6.5 GB/s sequential read) then PCIe; a
    # shared file system over the network (25 GbE class, ~3 GB/s).
    read_gbps=ReadBandwidth(dram=40.0, nvme=6.0, shared=3.0),
    read_latency_s=0.001,
    startup_s=60.0,  # schedule, pull a cached image, load 16 GB of weights, compile, capture graphs
    sources=(
        "NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB",
        "Meta Llama-3.1-8B model card: 8.03B parameters, 32 layers, 4096 hidden, 8 KV heads of 128",
        "NVIDIA NIM LLM benchmarking (docs.nvidia.com/nim/benchmarking): Llama-3.1-8B on one H100, "
        "ITL 4.6 ms at concurrency 1 in FP8 (half the weight bytes of bf16)",
        "vLLM engine arguments: max_num_batched_tokens 8192 for online serving, gpu_memory_utilization 0.9",
    ),
)

# ---- cpu: the `small` test model (12.4M parameters, float32), torch's default threads ----
SMALL_KV_BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 4  # layers x (K, V) x 2 KV heads x 64 dims x float32

CPU = Profile(
    name="cpu",
    description="strata worker, `small` test model (float32), on the 2-core development machine",
    kv_bytes_per_token=SMALL_KV_BYTES_PER_TOKEN,
    kv_cache_bytes=512 * 2**20,  # the engine's cpu_kv_bytes default: 256 blocks of 512 tokens
    max_batched_tokens=2048,  # the InferenceService default
    max_num_seqs=64,
    overhead_s=0.003,  # Python scheduling and sampling per step
    floor_s=0.0025,  # 50 MB of float32 weights read once per step (~20 GB/s)
    # Least squares over the cold TTFTs of 1k, 4k and 8k prompts in 2,048-token chunks (0.25,
    # 1.59, 3.35 s): within 3% at 4k and 8k; the 1k figure (0.25 s) comes out 0.36 s.
    prefill_token_s=3.4e-4,
    attention_pair_s=1.65e-8,
    decode_seq_s=0.00025,  # one token's 25 MFLOP of linear layers
    # From the HBM-hit TTFTs (a few tokens computed over 1k / 8k of context: 19 / 35 ms); with
    # the above, one sequence decodes at 1k context in 7.5 ms a step (measured: 119 tok/s, 8.4 ms).
    decode_context_token_s=2.0e-6,
    # bench/bench_kvtier.py through the sidecar: DRAM tier get 4.1 GB/s, NVMe tier read
    # 1.19 GB/s; the shared tier's read of one file per block, pages dropped (the router's
    # bench/bench_routing.py, router/weights.py): 0.095 GB/s.
    read_gbps=ReadBandwidth(dram=4.1, nvme=1.19, shared=0.095),
    read_latency_s=0.002,
    startup_s=5.0,  # import torch, load 50 MB of weights, serve: seconds on this machine
    sources=(
        "README `make bench` table (2-core development machine): worker (small model) TTFT cold "
        "0.25 / 1.59 / 3.35 s at 1k / 4k / 8k tokens, HBM hit 0.019 / 0.023 / 0.035 s, decode "
        "119 tok/s; kvtier DRAM get 4.1 GB/s, NVMe read 1.19 GB/s",
        "router/weights.py: shared-tier read of a file per block 0.095 GB/s",
    ),
)

BUILTIN = {p.name: p for p in (GPU, CPU)}


def resolve(name_or_path: str) -> Profile:
    """A built-in profile by name, or a profile YAML file."""
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    if not Path(name_or_path).exists():
        known = ", ".join(sorted(BUILTIN))
        raise ValueError(f"profile: {name_or_path!r} is neither a built-in profile ({known}) nor a file")
    return load(name_or_path)
