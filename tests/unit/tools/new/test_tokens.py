"""``meta_call`` (vitcg/tools/new/tokens.py): a tower built on the meta device and called on one tile, answered
once per tower class, config, tile and channels among the latest calls."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from vitcg.tools.new import tokens


class CountedTower(torch.nn.Module):
    """A tower that counts how often it is built; its output has one token before the patch rows."""

    built = 0

    def __init__(self, config):
        super().__init__()
        CountedTower.built += 1
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.patch = torch.nn.Conv2d(3, config.hidden_size, config.patch_size, config.patch_size)

    def forward(self, pixels):
        rows = self.patch(pixels).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(rows.shape[0], -1, -1), rows], dim=1)


def test_the_same_tower_config_and_tile_are_built_and_called_once(monkeypatch):
    monkeypatch.setattr(tokens, "_memo", type(tokens._memo)())
    CountedTower.built = 0
    config = PretrainedConfig(hidden_size=8, patch_size=4)
    first = tokens.meta_call(CountedTower, config, 16, 3)
    again = tokens.meta_call(CountedTower, PretrainedConfig(hidden_size=8, patch_size=4), 16, 3)  # equal values
    assert again is first and CountedTower.built == 1
    assert tuple(first[1].shape) == (1, 17, 8) and first[1].device.type == "meta"
    tokens.meta_call(CountedTower, PretrainedConfig(hidden_size=8, patch_size=2), 16, 3)  # another config
    tokens.meta_call(CountedTower, config, 32, 3)  # another tile
    assert CountedTower.built == 3
    assert tokens.prepended_tokens(CountedTower, config, 16, 4, 3).count == 1 and CountedTower.built == 3


def test_the_memo_keeps_only_the_latest_calls(monkeypatch):
    monkeypatch.setattr(tokens, "_memo", type(tokens._memo)())
    CountedTower.built = 0
    for size in range(4, 4 * (tokens.MEMO_SIZE + 2), 4):  # MEMO_SIZE + 1 tiles
        tokens.meta_call(CountedTower, PretrainedConfig(hidden_size=8, patch_size=4), size, 3)
    assert len(tokens._memo) == tokens.MEMO_SIZE and CountedTower.built == tokens.MEMO_SIZE + 1
    tokens.meta_call(CountedTower, PretrainedConfig(hidden_size=8, patch_size=4), 4, 3)  # the oldest: dropped
    assert CountedTower.built == tokens.MEMO_SIZE + 2
