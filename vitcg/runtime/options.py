"""How the manager packs and routes, as one value: torch-free, so that ``vitcg plan`` describes the manager it
plans for with the same options the manager takes."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BudgetError
from .packing import PACKING


@dataclass(frozen=True)
class ManagerOptions:
    """How the manager packs and routes. ``packing``: :data:`~vitcg.runtime.packing.PACKING`. ``ladder``: budgets
    generated as vLLM does, or ``pow2``. ``lean``: when items or frames per pack are left to be inferred, use
    :data:`~vitcg.runtime.budgets.LEAN_ITEMS` and one video's frames instead of vLLM's larger values.
    ``route_eager``: on CUDA, time replays and eager calls and run each call on the side measured cheaper
    (:mod:`vitcg.runtime.costs`).
    ``isolate_nonfinite``: run items with NaN or inf inputs eagerly, each alone (:mod:`vitcg.runtime.nonfinite`).
    ``use_cuda_graphs``: None follows the device. ``progress``: a progress bar while capturing."""

    packing: str = "tight"
    ladder: str = "vllm"
    lean: bool = True
    route_eager: bool = True
    isolate_nonfinite: bool = True
    use_cuda_graphs: bool | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        if self.packing not in PACKING:
            raise BudgetError(f"packing must be one of {', '.join(PACKING)}, got {self.packing!r}")
