"""Which keys a tiny or real config may set (``unknown_config_keys``): declared fields, ``attribute_map`` names, and
properties with a setter, which a config's keywords set as they set fields."""

from __future__ import annotations

from vitcg.lang.bindings import unknown_config_keys


def test_a_property_with_a_setter_is_a_config_key_and_a_misspelling_is_not():
    """A backbone's out_indices is a property over _out_indices: BeitConfig(out_indices=[1, 2]) sets it, so a tiny
    config may write it (ZoeDepth's drafted tiny backbone returns each of its four layers)."""
    from transformers import BeitConfig, ZoeDepthConfig

    assert BeitConfig(num_hidden_layers=2, out_indices=[1, 2]).out_indices == [1, 2]
    assert unknown_config_keys(BeitConfig, {"out_indices": [1, 2], "out_features": ["stage1"]}) == []
    assert unknown_config_keys(ZoeDepthConfig, {"backbone_config": {"model_type": "beit", "out_indices": [1]}}) == []
    (problem,) = unknown_config_keys(BeitConfig, {"out_indice": [1]})
    assert problem[0] == "out_indice" and "out_indices" in problem[1]
