"""The tokens a tiles tower puts before its patch rows (a CLS token, register tokens), measured for ``vitcg new``.

A tile of ``image_size`` pixels at ``patch_size`` yields ``(image_size // patch_size) ** 2`` patch rows, but ViT,
BEiT, DINOv2, BLIP, CLIP's tower and their kin prepend a class embedding (DINOv2 with registers four register
tokens more, Pixio eight class tokens): 21 raw tiles drafts of the 2026-11-29 sweep failed on "manager output
(16, 64) but eager output (17, 64)". A class-token parameter alone does not decide it: AIMv2 keeps its
``cls_token`` in the pooling head, and its ``last_hidden_state`` holds the patch rows only. So the tower is built
on the meta device (shapes without storage: no weights, no compute, a fraction of a second at the default size)
and called on one tile; the rows past the patch grid count only where a token parameter explains them.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

TOKEN_PARAMETERS = re.compile(r"cls_tokens?|class_embedding|class_token|cls_embedding|register_tokens|reg_tokens")
"""Names of the parameters that hold tokens a tower prepends to its patch rows (the last part of the name)."""


@dataclass(frozen=True)
class Prepended:
    """Tokens a tower's output holds beyond its patch grid, and what holds them."""

    count: int
    """Rows of one tile's output past ``(image_size // patch_size) ** 2``."""
    parameters: tuple[str, ...]
    """The token parameters of the tower (``embeddings.cls_token``), for the draft's comment."""


def prepended_tokens(encoder: type, config: Any, image_size: int, patch_size: int, channels: int,
                     output: str = "last_hidden_state") -> Prepended | None:
    """The tokens ``encoder`` (built from ``config``) puts before the patch rows of one ``image_size`` tile in its
    ``output`` field, or None where it puts none, has no token parameter, or cannot be measured on the meta device
    (a forward that needs other arguments or reads values: the draft then keeps the patch count as a guess)."""
    import torch

    if image_size <= 0 or patch_size <= 0 or image_size % patch_size:
        return None
    called = meta_call(encoder, config, image_size, channels)
    if called is None:
        return None
    tower, result = called
    rows = getattr(result, output, None) if not isinstance(result, torch.Tensor) else result
    if not isinstance(rows, torch.Tensor) or rows.dim() != 3:  # channels-first maps and pooled rows: not tokens
        return None
    count = rows.shape[1] - (image_size // patch_size) ** 2
    names = tuple(name for name, _ in tower.named_parameters() if TOKEN_PARAMETERS.fullmatch(name.rpartition(".")[2]))
    return Prepended(count, names) if count > 0 and names else None


MEMO_SIZE = 32
"""Meta-device calls :func:`meta_call` remembers (the latest). ``vitcg new`` renders a draft twice where it writes
a family draft that comes out as the whole draft (no spec has the tower), and every render measures the same
towers: with the memo each is built and called once."""

_memo: OrderedDict[tuple, tuple[Any, Any] | None] = OrderedDict()


def meta_call(encoder: type, config: Any, image_size: int, channels: int) -> tuple[Any, Any] | None:
    """``(tower, output)``: ``encoder`` built from ``config`` on the meta device and called on one tile of
    ``image_size`` pixels, or None where building or calling it raises (model code that reads values, a forward
    that needs other arguments, a config whose parts do not fit together). Answered once per tower class, config
    (its every value, as JSON), tile and channels among the latest :data:`MEMO_SIZE` calls; a config that does not
    serialize is measured each time. Callers only read the result (shapes, parameter names)."""
    try:
        key = (encoder, type(config), config.to_json_string(use_diff=False), image_size, channels)
    except Exception:  # noqa: BLE001 - config code of any release: measured without the memo
        return _meta_call(encoder, config, image_size, channels)
    if key in _memo:
        _memo.move_to_end(key)
        return _memo[key]
    result = _memo[key] = _meta_call(encoder, config, image_size, channels)
    if len(_memo) > MEMO_SIZE:
        _memo.popitem(last=False)
    return result


def _meta_call(encoder: type, config: Any, image_size: int, channels: int) -> tuple[Any, Any] | None:
    import torch

    try:
        with torch.device("meta"):
            tower = encoder(config)
        with torch.no_grad():
            return tower, tower(torch.empty(1, channels, image_size, image_size, device="meta"))
    except Exception:  # noqa: BLE001 - model code of any release; a draft never fails on a measurement
        return None
