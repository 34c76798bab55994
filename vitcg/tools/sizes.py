"""The bench workloads as image and video sizes in pixels (torch-free: ``vitcg plan`` reads them without the
model stack); :mod:`vitcg.tools.workloads` turns them into encoder inputs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    images: tuple[tuple[int, int], ...] = ()
    """(height, width) in pixels."""
    videos: tuple[tuple[int, int, int], ...] = ()
    """(frames, height, width)."""


MIXED_SIZES = ((480, 640), (768, 1024), (600, 800), (375, 500), (720, 1280), (336, 336), (448, 448), (612, 612))
"""Resolutions typical of VLM benchmarks: COCO/VQAv2 photos (640x480, 500x375), DocVQA/ChartQA pages and
charts (1024x768, 800x600), 720p screenshots, and square crops (336, 448, 612)."""

WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("1x224", "one 224x224 image", images=((224, 224),)),
    Workload("1x448", "one 448x448 image", images=((448, 448),)),
    Workload("8x224", "eight 224x224 images", images=((224, 224),) * 8),
    Workload("mixed", "eight images of realistic resolutions", images=MIXED_SIZES),
    Workload("video4x448", "one 4-frame 448x448 video", videos=((4, 448, 448),)),
    Workload("image+video", "two images (480x640, 448x448) and a 4-frame 448x448 video",
             images=((480, 640), (448, 448)), videos=((4, 448, 448),)),
)}
