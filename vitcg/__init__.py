"""vitcg: declarative CUDA graphs for the vision encoders of vision-language models.

``vitcg.accelerate(model)`` routes a loaded transformers VLM's vision encoder through budget graphs (see
:mod:`vitcg.runtime.accelerate`); it is imported on first use, so ``import vitcg`` stays light.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "accelerate"]


def __getattr__(name: str) -> Any:
    if name == "accelerate":
        from .runtime.accelerate import accelerate

        return accelerate
    raise AttributeError(f"module 'vitcg' has no attribute {name!r}")
