"""The generic adapter on real (tiny) transformers encoders: item specs, selection, buffers, padding rules."""

from __future__ import annotations

import pytest
import torch

from support.inputs import qwen2_images, qwen2_videos
from support.specs import packaged
from support.tiny import tiny_adapter, tiny_manager
from vitcg.errors import InputError, SpecRuntimeError
from vitcg.runtime.adapter import SpecAdapter
from vitcg.runtime.manager import EncoderCudaGraphManager
from vitcg.runtime.protocol import SupportsEncoderCudaGraph

SPECS = packaged()


@pytest.fixture(scope="module")
def qwen2():
    return tiny_adapter(SPECS["qwen2_vl"])


@pytest.fixture(scope="module")
def qwen25():
    return tiny_adapter(SPECS["qwen2_5_vl"])


@pytest.fixture(scope="module")
def internvl():
    return tiny_adapter(SPECS["internvl"])


def test_adapters_satisfy_the_protocol(qwen2, qwen25, internvl):
    for adapter in (qwen2, qwen25, internvl):
        assert isinstance(adapter, SupportsEncoderCudaGraph)


def test_config(qwen2, internvl):
    config = qwen2.get_encoder_cudagraph_config()
    assert config.modalities == ["image", "video"]
    assert config.buffer_keys == ["pixel_values", "grid_thw", "cu_seqlens", "max_seqlen", "position_ids"]
    assert config.out_hidden_size == 48  # tiny_config hidden_size
    assert callable(config.padding_logics["cu_seqlens"]) and config.padding_logics["cu_seqlens"].rule == "trailing_segment"
    assert "max_seqlen" not in config.padding_logics  # a host integer is never refilled
    assert config.max_frames_per_video == 32
    assert internvl.get_encoder_cudagraph_config().out_hidden_size == 48  # tiny text hidden size


def test_input_modality(qwen2):
    assert qwen2.get_input_modality(qwen2_images([1, 4, 4])) == "image"
    both = {**qwen2_images([1, 4, 4]), **qwen2_videos([2, 4, 4], seed=0)}
    assert qwen2.get_input_modality(both) == "image+video"
    with pytest.raises(InputError, match="no known input key"):
        qwen2.get_input_modality({"pixel_values_flat": torch.zeros(1)})
    with pytest.raises(InputError, match="'pixel_values' is given without 'image_grid_thw'"):
        qwen2.get_input_modality({"pixel_values": torch.zeros(1, 1176)})


def test_item_specs_follow_the_formulas(qwen2, internvl):
    kwargs = {**qwen2_images([1, 4, 6], [1, 8, 8]), **qwen2_videos([3, 4, 4], seed=0)}
    specs = qwen2.get_encoder_cudagraph_item_specs(kwargs)
    assert [(s.input_size, s.output_tokens) for s in specs] == [(24, 6), (64, 16), (48, 12)]
    assert qwen2.get_encoder_cudagraph_item_frames(kwargs) == [0, 0, 3]
    tiles = {"pixel_values_flat": torch.zeros(5, 3, 56, 56), "image_num_patches": torch.tensor([2, 3])}
    assert [(s.input_size, s.output_tokens) for s in internvl.get_encoder_cudagraph_item_specs(tiles)] == [(2, 8), (3, 12)]


def test_bad_grid_shape(qwen2):
    with pytest.raises(InputError, match=r"must have shape \(items, 3\)"):
        qwen2.get_encoder_cudagraph_item_specs({"pixel_values": torch.zeros(4, 1176), "image_grid_thw": torch.ones(4)})


def test_select_slices_rows_by_cumulative_offsets(qwen2):
    kwargs = qwen2_images([1, 2, 2], [1, 2, 4], [1, 4, 4])
    picked = qwen2.select_encoder_cudagraph_items(kwargs, [2, 0])  # in the order of the indices
    assert picked["image_grid_thw"].tolist() == [[1, 4, 4], [1, 2, 2]]
    torch.testing.assert_close(picked["pixel_values"], torch.cat([kwargs["pixel_values"][12:], kwargs["pixel_values"][:4]]))
    empty = qwen2.select_encoder_cudagraph_items(kwargs, [])
    assert qwen2.get_encoder_cudagraph_item_specs(empty) == [] and empty["pixel_values"].shape == (0, 1176)
    with pytest.raises(InputError, match="repeat an item"):
        qwen2.select_encoder_cudagraph_items(kwargs, [1, 1])
    with pytest.raises(InputError, match="item index 3 out of range"):
        qwen2.select_encoder_cudagraph_items(kwargs, [3])


def test_select_detects_inconsistent_pixels(qwen2):
    kwargs = qwen2_images([1, 2, 2])
    kwargs["pixel_values"] = kwargs["pixel_values"][:3]
    with pytest.raises(InputError, match="has 3 rows but 'image_grid_thw' describes 4"):
        qwen2.select_encoder_cudagraph_items(kwargs, [0])


def test_select_tiles(internvl):
    tiles = {"pixel_values_flat": torch.arange(5.0).reshape(5, 1, 1, 1).expand(5, 3, 56, 56),
             "image_num_patches": torch.tensor([2, 3])}
    picked = internvl.select_encoder_cudagraph_items(tiles, [1])
    assert picked["pixel_values_flat"][:, 0, 0, 0].tolist() == [2.0, 3.0, 4.0]
    assert picked["image_num_patches"].tolist() == [3]


def test_budget_range(qwen2, internvl):
    assert qwen2.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": 8192, "max_model_len": 4096}) == (64, 4096)

    class Limits:  # flat attributes are not vLLM's shape
        max_num_batched_tokens = 2048
        max_model_len = 32768

    assert internvl.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": 2048, "max_model_len": 32768}) == (4, 2048)
    with pytest.raises(InputError, match=r"limits\['max_model_len'\] is missing"):
        qwen2.get_encoder_cudagraph_budget_range({"max_num_batched_tokens": 1})
    from vitcg.runtime.engine import engine_config

    assert qwen2.get_encoder_cudagraph_budget_range(engine_config(2048, 1024)) == (64, 1024)
    with pytest.raises(InputError, match=r"vllm_config.scheduler_config.max_num_batched_tokens is missing"):
        qwen2.get_encoder_cudagraph_budget_range(Limits())


def test_capture_inputs_hold_the_all_padding_layout(qwen25):
    values = qwen25.prepare_encoder_cudagraph_capture_inputs(64, 4, 8, "cpu", torch.float32).values
    rows = 64 * 4
    assert values["pixel_values"].shape == (rows, 1176) and not values["pixel_values"].any()
    for key in ("cu_seqlens", "cu_window_seqlens"):  # all rows are padding, spread over every slot
        bounds = values[key].tolist()
        free = len(bounds) - 1
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        assert bounds[0] == 0 and bounds[-1] == rows and min(lengths) >= 0
        assert max(lengths) == -(-rows // free)
    assert values["window_index"].tolist() == list(range(64))
    assert values["max_seqlen"] == rows and isinstance(values["max_seqlen"], int)
    assert values["cu_seqlens"].dtype == torch.int32 and values["position_ids"].dtype == torch.int64


def test_replay_layout_padding_is_its_own_trailing_segment(qwen25):
    manager = tiny_manager(qwen25)
    kwargs = qwen2_images([1, 4, 6], [2, 4, 4])
    manager.execute(kwargs)
    [budget] = manager.stats.replays_per_budget
    values = manager.graphs[budget].inputs.values
    rows = budget * 4
    bounds = values["cu_seqlens"].tolist()
    assert bounds[:4] == [0, 16, 32, 56]  # packing order (largest first): 2 frames, then 1; then padding
    padding = [b - a for a, b in zip(bounds[3:], bounds[4:])]
    free = len(bounds) - 4
    assert bounds[-1] == rows and sum(padding) == rows - 56
    assert max(padding) == -(-(rows - 56) // min(free, rows - 56))  # spread, never one long segment
    assert values["cu_window_seqlens"].tolist()[-1] == rows
    window = values["window_index"].tolist()
    assert sorted(window[:14]) == list(range(14)) and window[14:] == list(range(14, budget))
    assert values["max_seqlen"] == rows  # host int fixed at capture, never replaced


def test_padding_rows_are_finite_even_from_garbage(qwen2):
    manager = tiny_manager(qwen2)
    manager.capture()
    for entry in manager.graphs.values():
        entry.inputs.values["pixel_values"].fill_(float("nan"))  # stale contents must not leak
    kwargs = qwen2_images([1, 4, 4])
    [out] = manager.execute(kwargs)
    want = qwen2.encoder_eager_forward(kwargs)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    graph_out = qwen2.encoder_cudagraph_forward(manager.graphs[64].inputs.values)
    assert torch.isfinite(graph_out).all()  # padding rows were zero-filled, not left as NaN


def test_mixed_image_and_video_in_one_pack(qwen2):
    manager = tiny_manager(qwen2)
    kwargs = {**qwen2_images([1, 4, 6]), **qwen2_videos([2, 4, 4], seed=3)}
    out = manager.execute(kwargs)
    assert manager.stats.replays == 1 and len(out) == 2
    for index, got in enumerate(out):
        want = qwen2.encoder_eager_forward(qwen2.select_encoder_cudagraph_items(kwargs, [index]))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_output_field_missing_is_clear(qwen2):
    class NoPooler:
        last_hidden_state = torch.zeros(1, 2)

    with pytest.raises(SpecRuntimeError, match="has no 'pooler_output'"):
        qwen2.combine_output(NoPooler())


@pytest.fixture(scope="module")
def paddle():
    if SPECS["paddleocr_vl"].unavailable:
        pytest.skip(SPECS["paddleocr_vl"].unavailable)
    return tiny_adapter(SPECS["paddleocr_vl"])


def paddle_images(*grids, seed=0):
    g = torch.tensor(grids, dtype=torch.int64)
    rows = int(g.prod(-1).sum())
    return {"pixel_values": torch.randn(rows, 3, 14, 14, generator=torch.Generator().manual_seed(seed)),
            "image_grid_thw": g}


def test_pixels_rows_dim_stores_rows_first_and_calls_with_leading_ones(paddle):
    """PaddleOCR-VL's tower takes (1, rows, C, p, p): the buffer holds (budget, C, p, p), as the inputs come."""
    values = paddle.prepare_encoder_cudagraph_capture_inputs(256, 2, 2).values
    assert values["pixel_values"].shape == (256, 3, 14, 14)
    (call,) = paddle.eager_calls(paddle_images([1, 4, 6]))
    assert call["pixel_values"].shape == (1, 24, 3, 14, 14)
    with pytest.raises(InputError, match=r"expected shape \(rows, 3, 14, 14\), got \(1, 24, 3, 14, 14\)"):
        paddle.get_encoder_cudagraph_item_specs({**paddle_images([1, 4, 6]),
                                                  "pixel_values": torch.zeros(1, 24, 3, 14, 14)})


def test_pixels_rows_dim_graph_path_matches_eager(paddle):
    manager = EncoderCudaGraphManager(paddle, max_num_batched_tokens=256, max_model_len=256, device="cpu",
                                      dtype=torch.float32)
    manager.capture()
    mm = paddle_images([1, 4, 6], [1, 2, 2])
    got = torch.cat(manager.execute(mm))
    want = paddle.encoder_eager_forward(mm)
    assert got.shape == want.shape == (28, 64)
    assert torch.allclose(got, want, atol=1e-5)


class _Features:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def test_per_item_outputs_join_on_the_rows(paddle):
    """``field[*]``: a tuple of per-item tensors (get_image_features' pooler_output) is one tensor of rows."""
    from dataclasses import replace

    adapter = SpecAdapter.__new__(SpecAdapter)
    adapter.__dict__.update(paddle.__dict__)
    adapter.spec = replace(paddle.spec, encoder=replace(paddle.spec.encoder, outputs=("pooler_output[*]",)))
    parts = (torch.ones(4, 64), torch.zeros(2, 64))
    assert torch.equal(adapter.combine_output(_Features(pooler_output=parts)), torch.cat(parts))
    with pytest.raises(SpecRuntimeError, match=r"expected a tuple or list of per-item tensors, got Tensor"):
        adapter.combine_output(_Features(pooler_output=torch.ones(4, 64)))
    with pytest.raises(SpecRuntimeError, match="do not share a last dimension"):
        adapter.combine_output(_Features(pooler_output=(torch.ones(4, 64), torch.ones(2, 32))))


def test_navit_pixels_lie_side_by_side_in_the_call():
    """MiniCPM-V's tower takes (1, C, p, rows * p): each row is a (C, p, p) block of p columns."""
    from vitcg.lang.model import PixelLayout
    from vitcg.runtime.hf import pixels_to_call, pixels_to_rows

    layout = PixelLayout(ones=1, lead=(3, 14), width=14, trail=())
    rows = torch.randn(5, 3, 14, 14)
    call = pixels_to_call(layout, rows)
    assert call.shape == (1, 3, 14, 70)
    assert torch.equal(call[0, :, :, 28:42], rows[2])
    assert torch.equal(pixels_to_rows(layout, call), rows)
    assert pixels_to_rows(layout, call[..., :69]) is None  # not a whole number of rows
    assert pixels_to_rows(layout, call.reshape(3, 14, 70)) is None  # no leading dimension of 1
    plain = PixelLayout(ones=1, lead=(), width=1, trail=(3, 14, 14))  # PaddleOCR-VL: a view, no copy
    assert pixels_to_call(plain, rows).shape == (1, 5, 3, 14, 14)
    assert pixels_to_call(plain, rows).data_ptr() == rows.data_ptr()


@pytest.mark.skipif(SPECS["minicpmv4_6"].unavailable is not None, reason="needs transformers 5.23")
def test_navit_capture_buffers_hold_rows_first_and_a_row_for_the_padding_item():
    spec = SPECS["minicpmv4_6"]
    adapter = tiny_adapter(spec)
    values = adapter.prepare_encoder_cudagraph_capture_inputs(256, 3, 3).values
    assert values["pixel_values"].shape == (1024, 3, 14, 14)  # 256 tokens after the tower's 2x2 merge
    assert values["target_sizes"].tolist() == [[2, 512], [0, 0], [0, 0], [0, 0]]  # all padding: one item
    assert values["cu_window_seqlens"].shape == (257,)  # one slot per window, as the merger checks
    rows = torch.randn(32, 3, 14, 14)
    (call,) = adapter.eager_calls({"pixel_values": rows, "target_sizes": torch.tensor([[4, 8]])})
    assert call["pixel_values"].shape == (1, 3, 14, 32 * 14) and call["use_vit_merger"] is True


def test_postprocess_by_rows_cuts_items_and_clones_once():
    """Each item gets its rows in ``indices`` order; with clone, rows that the next replay overwrites are copied
    (one copy for the call), so writing the graph output afterwards changes no item."""
    from vitcg.runtime.protocol import postprocess_by_rows

    output = torch.arange(20.0).reshape(10, 2)
    dest = {}
    postprocess_by_rows({"default": output}, [2, 0], [3, 5, 2], dest, clone=True)
    assert torch.equal(dest[2], torch.tensor([[0.0, 1], [2, 3]])) and torch.equal(dest[0], output[2:5])
    output.fill_(-1)  # the next replay
    assert dest[2][0, 0] == 0 and dest[0][0, 0] == 4
    views = {}
    postprocess_by_rows({"default": output}, [1], [3, 5, 2], views)
    assert views[1].data_ptr() == output.data_ptr()  # eager outputs are kept as views
