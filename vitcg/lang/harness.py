"""The harness of a spec: how ``vitcg check`` and ``vitcg bench`` build and feed a model (``tests``, written in the
spec or in ``NAME.tests.yaml`` beside it). The runtime never imports this module: nothing here changes what a graph
computes, only how it is tested."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .formulas import Formula


@dataclass(frozen=True)
class ExampleInput:
    """How ``vitcg check`` synthesizes one input role, per row (a patch row or a tile)."""

    shape: tuple[Formula, ...]
    fill: str | tuple[Formula, ...]
    """``randn``, ``ones``, ``zeros``, or per-row integer formulas (one per element of a 1-D row)."""
    dtype: str


@dataclass(frozen=True)
class Placeholder:
    """How ``input_ids`` hold one image or video in the end-to-end stage: VLM config fields of token ids."""

    token: str
    """The field of the placeholder token id (one per output row)."""
    before: tuple[str, ...] = ()
    """Fields of the token ids that open each group."""
    after: tuple[str, ...] = ()
    """Fields of the token ids that close each group."""
    per_frame: bool = False
    """One group per frame (grid t) instead of one per item (videos only)."""


@dataclass(frozen=True)
class VlmTest:
    """The end-to-end stage of ``vitcg check`` (``tests.vlm``): how to build the tiny full VLM and its inputs."""

    config: Mapping[str, Any]
    """Overrides of the VLM config class besides the tiny vision config."""
    processor: Mapping[str, Any]
    """Keyword arguments of the model's image processor class."""
    token: str
    """The VLM config field holding the image placeholder token id (one per output row)."""
    before: tuple[str, ...] = ()
    """Config fields of the token ids that open each image in ``input_ids``."""
    after: tuple[str, ...] = ()
    """Config fields of the token ids that close each image."""
    skip: str | None = None
    """Why the stage cannot run for this model, or None."""
    features_out_of_reach: str | None = None
    """Why the feature call's output cannot be compared item by item (``tests.vlm.features.out_of_reach``), or
    None. The stage still compares greedy ``generate``."""
    engine_keys: str | None = None
    """Why the processor's outputs are not the spec's inputs (``tests.vlm.engine_keys``), or None: then the stage
    also feeds the processor's outputs to the graphs under the spec's input keys."""
    architecture: str | None = None
    """The VLM class to build; None: the first of the spec's architectures that transformers has."""
    processor_class: str | None = None
    """The image processor class; None: the one transformers maps to the spec's model types."""
    transformers: str | None = None
    """The oldest transformers release whose config classes take ``config`` (older: the stage is skipped)."""
    video: Placeholder | None = None
    """How ``input_ids`` hold a video (``tests.vlm.video_placeholder``); None: the stage feeds images only."""
    video_processor: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Keyword arguments of the image processor call that makes the frames of composed videos
    (``tests.vlm.video_processor``)."""

    @property
    def image(self) -> Placeholder:
        """How ``input_ids`` hold an image (``tests.vlm.placeholder``)."""
        return Placeholder(self.token, self.before, self.after)


@dataclass(frozen=True)
class TestMeta:
    """The harness: prompts, budgets, example inputs, the tiny and real configs, the end-to-end stage."""

    prompt_template: str
    image_placeholder: str
    video_placeholder: str | None
    num_video_frames: int
    max_model_len: int
    needs_video_metadata: bool
    runner_kwargs: Mapping[str, Any]
    marks: tuple[str, ...]
    budgets: tuple[int, ...]
    tiny_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Overrides of the encoder's config class for tiny CPU checks."""
    real_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Overrides for a real checkpoint's dimensions."""
    inputs: Mapping[str, ExampleInput] = field(default_factory=lambda: MappingProxyType({}))
    """Example inputs by role for ``vitcg check``; pixels default to the pixel buffer's row shape."""
    shaping: Mapping[str, Mapping[str, Formula]] = field(default_factory=lambda: MappingProxyType({}))
    """Per modality: item name -> formula over the image or video size in pixels (``tests.shaping``, or the
    attention style's default), how the model's processor shapes one item."""
    vlm: VlmTest | None = None
    """The end-to-end stage against the full VLM (``tests.vlm``); None when the spec does not describe it."""
