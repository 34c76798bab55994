"""Fixtures shared by the unit tests of compiled blocks."""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.utils import counters


@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile with dynamo's eager backend, dynamo's caches and counters fresh."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
