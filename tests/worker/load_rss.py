"""Peak resident memory of loading a model, measured in a fresh process:
``python -m tests.worker.load_rss MODEL_DIR DTYPE`` prints JSON with the weights' bytes and the
growth of peak RSS while ``load_model`` ran (the kernel's high-water mark, reset just before).

Building a module on the meta device the first time pulls in ~160 MB of torch code whatever the
model's size; a one-layer model is built first so that the figure is the weights' own cost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from strata.worker.models.hf_config import DecoderConfig
from strata.worker.models.llama import LlamaForCausalLM
from strata.worker.models.loader import DTYPES, load_model

WARM_UP = DecoderConfig(8, 8, 8, 1, 2, 2, 4, 8, 1e-5)


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(model_dir: str, dtype: str) -> dict[str, float]:
    torch.set_num_threads(1)
    with torch.device("meta"):
        LlamaForCausalLM(WARM_UP)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    model = load_model(model_dir, DTYPES[dtype], torch.device("cpu"))
    peak = _status("VmHWM")
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    return {"weights_bytes": weights, "peak_growth_bytes": peak - before, "ratio": (peak - before) / weights}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2])))
