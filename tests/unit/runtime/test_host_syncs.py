"""Host syncs and data-dependent shapes raise inside no_host_syncs, with the caller's location."""

from __future__ import annotations

import pytest
import torch

from vitcg.runtime.syncs import HostSyncError, no_host_syncs, tensor_text_without_data

X = torch.tensor([1, 2, 3])
INDEX = torch.tensor([0, 2])
POINTS = torch.arange(3)


@pytest.mark.parametrize(("name", "call"), [
    ("item", lambda: X[0].item()),
    ("tolist", lambda: X.tolist()),
    ("__bool__", lambda: bool(X[0])),
    ("__int__", lambda: int(X[0])),
    ("__index__", lambda: [0, 1, 2][X[0]]),
    ("nonzero", lambda: X.nonzero()),
    ("repeat_interleave without output_size", lambda: torch.repeat_interleave(X, X)),
    ("boolean-mask indexing", lambda: X[X > 1]),
    ("indexing with a Python list (a host index copied to the device)", lambda: X[[0, 2]]),
    ("indexing with a Python list (a host index copied to the device)", lambda: X[None][:, [2, 1]]),
    ("where(condition)", lambda: torch.where(X > 1)),
    ("cpu", lambda: X.cpu()),
    ("tensor", lambda: torch.tensor([1, 2])),
    ("unique", lambda: torch.unique(X)),
    ("__format__ (a tensor formatted into text)", lambda: f"grids {X}"),
    ("__repr__ (a tensor formatted into text)", lambda: repr(X)),
])
def test_offending_calls_raise(name, call):
    with pytest.raises(HostSyncError) as info, no_host_syncs():
        call()
    assert f"calls {name} at test_host_syncs.py:" in str(info.value)


@pytest.mark.parametrize("call", [
    lambda: X * 2 + 1,
    lambda: torch.repeat_interleave(X, X, output_size=6),
    lambda: torch.repeat_interleave(X, 2),
    lambda: X[1:],
    lambda: X[INDEX],
    lambda: torch.where(X > 1, X, 0),
    lambda: torch.searchsorted(X, POINTS),
])
def test_fixed_shape_calls_pass(call):
    with no_host_syncs():
        call()


def test_mode_ends_with_the_block():
    with no_host_syncs():
        pass
    assert X.tolist() == [1, 2, 3]


def test_tensor_text_reads_no_data():
    """A message built from a tensor (MiniCPM-V's f"Patch grids {target_sizes} ...") reads as the tensor's shape
    inside the graph forward, so no_host_syncs (and a CUDA capture) sees no host read."""
    with no_host_syncs(), tensor_text_without_data():
        text = f"grids {X} and {str(X)} and {X!r}"
    assert text == "grids " + " and ".join(["tensor(shape=(3,), dtype=torch.int64, device=cpu)"] * 3)
    assert f"{X}" == "tensor([1, 2, 3])"  # only inside the block
