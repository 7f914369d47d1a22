"""Which local environment stands in for a container's image (the runtime pulls no images).

Every image runs this checkout (mounted at ``IMAGE_CODE``, on PYTHONPATH) with the project's
virtualenv first on PATH, except vLLM's: an image whose repository is ``vllm-openai`` or
``strata-vllm`` (vLLM's, or vLLM with Strata installed) runs with the vLLM environment that
``make vllm-env`` builds (``tools/vllm/install.sh``, pinned: vLLM's CPU build), so a pod with
``engine.kind: vllm`` serves with a real vLLM on the local node. The variables that environment
needs on this machine come with it: vLLM's CPU target, no hub (the test models are local), no
usage statistics, one OpenMP thread unbound (the local node's pods share two cores).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

VLLM_IMAGE = re.compile(r"^(.*/)?(vllm-openai|strata-vllm)(:[^/]*)?(@.*)?$")
VLLM_ENV_VAR = "STRATA_VLLM_ENV"  # where the vLLM environment is, if not <checkout>/.vllm/env
VLLM_LOCAL_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}


class ImageUnavailable(Exception):
    """The environment an image maps to is not built here; the message says how to build it."""


@dataclass(frozen=True)
class Images:
    base: dict[str, str]  # every container's environment (host.image_env)
    vllm_env: Path  # the vLLM environment's prefix (bin/vllm inside)
    venv: Path = Path(sys.prefix)  # the project's virtualenv: every other image's

    def directories(self, image: str) -> list[Path]:
        """The environment ``image`` runs from, to be mounted where it is (read-only) over the
        pod's own volumes: a checkout under /tmp keeps its virtualenv visible in a container
        that mounts a volume at /tmp."""
        return [self.vllm_env if is_vllm(image) else self.venv]

    def env(self, image: str) -> dict[str, str]:
        """The environment ``image`` starts from; raises ImageUnavailable where it is not built."""
        if not is_vllm(image):
            return dict(self.base)
        if not (self.vllm_env / "bin" / "vllm").is_file():
            raise ImageUnavailable(
                f"image {image} runs vLLM from {self.vllm_env}, which is not built here: run `make vllm-env`"
            )
        path = f"{self.vllm_env / 'bin'}:{self.base['PATH'].split(':', 1)[1]}"
        return {**self.base, **VLLM_LOCAL_ENV, "PATH": path}


def is_vllm(image: str) -> bool:
    return VLLM_IMAGE.match(image) is not None


def vllm_env_dir(repo_root: Path) -> Path:
    given = os.environ.get(VLLM_ENV_VAR)
    return Path(given) if given else repo_root / ".vllm" / "env"
