"""Index inputs past the end of the table they index (issue 27, item 4): every integer role that feeds an embedding
has its bound in the spec (``params.below``) and a value at or past it is refused with an InputError naming the key,
the range, the value and the row, on every protocol entry point. Eagerly such a value was an IndexError from inside
the model; in a graph replay on a GPU a device-side assert that ends the process."""

from __future__ import annotations

import pytest
import torch

from support.inputs import assert_refused
from support.specs import packaged
from vitcg.lang.bindings import import_object
from vitcg.runtime.adapter import adapter_for
from vitcg.runtime.inputs import role_bounds
from vitcg.tools.encoders import build_config, build_encoder
from vitcg.tools.workloads import InputBuilder

SPECS = packaged()


def _word_embeddings(module):
    return module.qformer.embeddings.word_embeddings.num_embeddings


def _aspect_embeddings(module):
    rows = {module.pre_tile_positional_embedding.embedding.num_embeddings,
            module.post_tile_positional_embedding.embedding.num_embeddings,
            module.gated_positional_embedding.tile_embedding.num_embeddings}
    assert len(rows) == 1
    return rows.pop()


def _position_table(module):
    return module.patch_embedder.position_embedding_table.shape[1]


TABLES = {
    # spec: (its index role, the key carrying it, the rows of the table the model indexes with it)
    "instructblip": ("instruction", "qformer_input_ids", _word_embeddings),
    "instructblipvideo": ("instruction", "qformer_input_ids", _word_embeddings),
    "mllama": ("aspect_ids", "aspect_ratio_ids", _aspect_embeddings),
    "gemma4": ("positions", "image_position_ids", _position_table),
}


def _call(spec, module, items=1):
    adapter = adapter_for(spec, module)
    builder = InputBuilder(spec, adapter, torch.Generator().manual_seed(0))
    return adapter, builder.inputs(spec.modalities[0].name, [1] * items)


@pytest.fixture(scope="module", params=sorted(TABLES))
def case(request):
    spec = SPECS[request.param]
    module = build_encoder(spec)
    adapter, kwargs = _call(spec, module, items=3)
    return spec, module, adapter, kwargs


def refused(adapter, kwargs, *fragments):
    assert_refused([adapter.get_encoder_cudagraph_item_specs, adapter.encoder_eager_forward,
                    lambda kw: adapter.select_encoder_cudagraph_items(kw, [0])], kwargs, *fragments)


def test_every_index_role_that_feeds_a_table_has_its_bound():
    """The specs whose aligned buffers carry int64/int32 roles: each role that the model looks up in a table has a
    bound; the others are masks (instruction_mask, aspect_mask), whose values index nothing."""
    bounded = {s.name: sorted(role_bounds(s, {n: 1 for n, _ in s.geometry})) for s in SPECS
               if any(b.provider == "aligned" and b.params.get("dtype") in ("int64", "int32") for b in s.buffers)}
    assert bounded == {name: [role] for name, (role, _, _) in TABLES.items()}


def test_the_bound_is_the_models_table(case):
    spec, module, adapter, _ = case
    role, _, table = TABLES[spec.name]
    assert adapter._reader.role_bounds == {role: table(module)}


def test_an_index_at_the_bound_is_refused(case):
    spec, module, adapter, kwargs = case
    role, key, table = TABLES[spec.name]
    rows = table(module)
    bad = kwargs[key].clone()
    bad[2].view(-1)[0] = rows  # the third item's first value: one past the table's last row
    refused(adapter, {**kwargs, key: bad}, f"{spec.name}: {key!r}", "row 2", f"expected indices in [0, {rows})",
            "params.below", f"got {rows}")
    huge = kwargs[key].clone()
    huge[1].view(-1)[0] = 2 ** 40
    refused(adapter, {**kwargs, key: huge}, "row 1", f"got {2 ** 40}")


def test_indices_inside_the_table_are_served(case):
    """The bound is not tighter than the model: the table's last row is served, and equals the eager model."""
    spec, module, adapter, kwargs = case
    _, key, table = TABLES[spec.name]
    if spec.name == "gemma4":
        pytest.skip("Gemma 4's positions must form the processor's patch grid (another test below)")
    last = kwargs[key].clone()
    last.view(-1)[0] = table(module) - 1
    call = {**kwargs, key: last}
    assert len(adapter.get_encoder_cudagraph_item_specs(call)) == 3
    assert adapter.encoder_eager_forward(call).isfinite().all()


def test_gemma4_positions_past_a_small_table_are_refused_not_indexed():
    """A Gemma 4 config with a position table smaller than a processor's grid: the positions of a 48 x 36 patch
    grid pass the pooling-grid check, and the model's own forward raises IndexError on x = 47."""
    spec = SPECS["gemma4"]
    config = build_config(spec, "tiny")
    config.position_embedding_size = 40
    module = import_object(spec.encoder.class_path)(config).eval()
    adapter, kwargs = _call(spec, module)
    index = torch.arange(kwargs["image_position_ids"].shape[1])
    grid = torch.stack([index % 48, index // 48], dim=-1)
    grid[1728:] = -1  # 1728 patches, 48 wide: 192 soft tokens; then padding
    call = {**kwargs, "image_position_ids": grid.unsqueeze(0)}
    with pytest.raises(IndexError), torch.no_grad():
        module(pixel_values=call["pixel_values"], pixel_position_ids=call["image_position_ids"])
    refused(adapter, call, "'image_position_ids'", "row 0", "expected indices in [0, 40)", "got 40")
    smaller = grid.clone()
    smaller[:1728] = torch.stack([index[:1728] % 36, index[:1728] // 36], dim=-1)  # 36 x 48: x < 36, y up to 47
    refused(adapter, {**call, "image_position_ids": smaller.unsqueeze(0)}, "got 40")
    inside = grid.clone()
    inside[:1296] = torch.stack([index[:1296] % 36, index[:1296] // 36], dim=-1)  # 36 x 36 fits the table
    inside[1296:] = -1
    (item,) = adapter.get_encoder_cudagraph_item_specs({**call, "image_position_ids": inside.unsqueeze(0)})
    assert item.output_tokens == 1296 // 9
