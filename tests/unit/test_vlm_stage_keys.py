"""The end-to-end stage feeds the VLM's processor outputs to the graphs under the spec's input keys, as an engine
does: a spec whose keys are swapped or misnamed fails there (issue 26, item 3). Routing inside ``generate`` goes
by the encoder call's arguments, so before this such a spec passed both stages and failed only when served."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitcg.errors import VitcgError
from vitcg.lang import spec_from_text
from vitcg.lang.bindings import Bindings
from vitcg.tools.vlm import check_vlm

pytest.importorskip("PIL")
QWEN2 = (Path(__file__).resolve().parents[2] / "vitcg" / "specs" / "qwen2_vl.yaml").read_text()
IMAGE_KEYS = "inputs: {pixels: pixel_values, grid: image_grid_thw}"


def variant(image_keys: str):
    assert IMAGE_KEYS in QWEN2
    return spec_from_text(QWEN2.replace(IMAGE_KEYS, image_keys, 1), "qwen2_vl.yaml", Bindings())


def test_the_real_keys_pass():
    items, worst, _ = check_vlm(variant(IMAGE_KEYS))
    assert items >= 3 and worst <= 1e-5


def test_swapped_keys_fail_naming_the_inputs():
    with pytest.raises(VitcgError, match=r"under the spec's input keys fail: .*'image_grid_thw'.*check "
                                         r"modalities\.image\.inputs \(image_grid_thw, pixel_values\)"):
        check_vlm(variant("inputs: {pixels: image_grid_thw, grid: pixel_values}"))


def test_a_key_the_processor_does_not_make_fails_naming_it():
    with pytest.raises(VitcgError, match=r"the processor makes no 'image_grid' for images \(it makes .*"
                                         r"image_grid_thw.*\): check modalities\.image\.inputs"):
        check_vlm(variant("inputs: {pixels: pixel_values, grid: image_grid}"))
