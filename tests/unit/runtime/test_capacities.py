"""No hidden capacities (issue 25, item 4): a buffer whose provider's value grows with the items or segments of a
pack holds what its spec writes; ``vitcg validate`` holds the written first dimension to the provider's need, and
a capture allocates the spec's shape, never more."""

from __future__ import annotations

import dataclasses

import pytest

from support import REPO
from support.specs import packaged, skip_unavailable
from support.tiny import tiny_adapter
from vitcg.errors import SpecRuntimeError
from vitcg.lang import SpecSource
from vitcg.lang import catalogue as cat
from vitcg.lang.formulas import parse
from vitcg.runtime.adapter import adapter_for
from vitcg.tools.encoders import build_encoder

SPECS = packaged()


INVALID = REPO / "tests/specs/invalid"


@pytest.mark.parametrize(("case", "message"), [
    # a cap written into a segment buffer: a capture of 33 images needs 35 slots
    ("capacity_segment_cap", "buffer 'cu_seqlens' holds min(max_items, 32) + 2 = 34 rows at budget=64, max_items=33"),
    # a modality split by frames gives the encoder a grid row per frame, not per item
    ("capacity_split_grid", "buffer 'grid_thw' holds max_items + 1 = 2 rows at budget=64, max_items=1, max_frames=64"),
    # a role aligned with the items holds a row per item
    ("capacity_item_role", "buffer 'merge_sizes' holds max(1, max_items // 2) = 1 rows at budget=64, max_items=2"),
])
def test_a_written_capacity_short_of_what_a_pack_needs_is_a_diagnostic_at_its_line(case, message):
    path = INVALID / f"{case}.yaml"
    (found,) = SpecSource.of_files([path]).diagnostics
    line = next(i for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if "shape: [" in text
                and "#" in text.split("shape: [", 1)[1])  # the example marks its short shape with a comment
    assert (found.file, found.line, found.code) == (str(path), line, "semantic")
    assert found.path.endswith(".shape[0]") and message in found.message
    assert found.hint.endswith("a capture allocates what the spec writes, never more")


def test_a_written_capacity_above_the_need_is_valid(tmp_path):
    text = (INVALID / "capacity_segment_cap.yaml").read_text(encoding="utf-8")
    roomy = tmp_path / "roomy.yaml"
    roomy.write_text(text.replace('"min(max_items, 32) + 2"', "max_items + 8"), encoding="utf-8")
    assert SpecSource.of_files([roomy]).diagnostics == []


@pytest.mark.parametrize("name", ["qwen2_vl", "glm4v", "inkling2"])
@pytest.mark.parametrize(("budget", "items", "frames"), [(64, 1, 0), (64, 40, 0), (256, 3, 24)])
def test_a_capture_allocates_the_written_shape_and_never_more(name, budget, items, frames):
    spec = SPECS[name]
    adapter = tiny_adapter(spec)
    values = adapter.prepare_encoder_cudagraph_capture_inputs(budget, items, frames, device="cpu").values
    names = {**cat.buffer_names(budget, items, frames), **adapter.geometry}
    for buffer in spec.buffers:
        if not buffer.is_host:
            assert values[buffer.name].shape[0] == buffer.shape[0].evaluate(names), buffer.name


def test_a_capture_past_a_short_written_capacity_raises_instead_of_growing_the_buffer():
    skip_unavailable("inkling2")
    spec = SPECS["inkling2"]
    capped = parse("min(max_items, 32) + 2", cat.BUFFER_NAMES)
    short = [dataclasses.replace(b, shape=(capped,)) if b.name == "cu_seqlens" else b for b in spec.buffers]
    adapter = adapter_for(dataclasses.replace(spec, buffers=tuple(short)), build_encoder(spec))
    assert adapter.prepare_encoder_cudagraph_capture_inputs(64, 32, 0, device="cpu").values["cu_seqlens"].shape == (34,)
    with pytest.raises(SpecRuntimeError, match=r"inkling2: buffer 'cu_seqlens' holds 34 rows \(min\(max_items, 32\) "
                                               r"\+ 2\) at budget=64, max_items=40, max_frames=0, but a pack can need "
                                               r"42 \(max_segments \+ 2\)"):
        adapter.prepare_encoder_cudagraph_capture_inputs(64, 40, 0, device="cpu")
