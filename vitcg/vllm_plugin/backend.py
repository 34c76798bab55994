"""vLLM's Transformers backend with encoder CUDA graphs: its multimodal classes, serving vLLM's protocol from a spec.

Where the graphs sit. The backend's ``embed_multimodal`` encodes a batch of one modality through the Hugging
Face model's ``get_image_features`` / ``get_video_features`` (tower, then whatever the VLM does after it:
projector, feature layer, token dropping) and splits the result into one tensor per item. vLLM's
``EncoderCudaGraphManager`` must return exactly those per-item tensors. The spec captures the tower (the call
named by ``encoder.class`` / ``encoder.method`` at ``encoder.vlm_attribute``), so here:

- capture, packing, replay and the eager fallback of the tower are vLLM's manager driving vitcg's spec adapter
  (:class:`~vitcg.runtime.adapter.SpecAdapter`) through the protocol members below;
- ``postprocess_encoder_output`` then runs the backend's own ``embed_multimodal`` on the pack, with the
  tower's call answered from the pack's graph rows (the call is checked against the spec: the same inputs,
  the same rows). What follows the tower runs as the stock backend runs it, so each item is what the stock
  backend would return for it.

The first pack also runs the tower once eagerly, to learn how its output is structured (see
:class:`~vitcg.runtime.hf.Layout`).

A model whose spec cannot be used becomes an instance of the stock class, so vLLM sees no
``SupportsEncoderCudaGraph`` and captures nothing; one INFO line on the ``vitcg`` logger says why. That is
decided right after construction (no spec matches, the installed transformers lacks the spec's code, the spec
is graph-scoped, its encoder is not where the spec says, a tower layer holds a tensor parallel shard under
``--mm-encoder-tp-mode data``), or at the first batch ``embed_multimodal`` sees
before any manager holds the model's config, which in vLLM is the profiling run (the spec cannot read the
backend's batch: a pixel layout it does not describe).

After that, the plugin is fail-safe (:class:`~vitcg.vllm_plugin.bridge.EncoderGraphs`): whatever fails on
vitcg's path (a batch the spec cannot read, as without a profiling run; capture; replay; a feature call the
spec does not describe: an argument it does not capture, another row count, a second tower call, an output the
graph rows cannot build) turns the graphs off for that model with one warning; the batch in flight gets the
stock backend's items and every later batch goes to the stock path.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
from vllm.model_executor.models.transformers import (
    TransformersMultiModalForCausalLM,
    TransformersMultiModalMoEForCausalLM,
)

from .bridge import EncoderGraphs


def sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds only its tensor parallel rank's part of a weight: vLLM's column and row parallel
    linears (their subclasses included: QKV, merged, the fusers' layers) split over more than one rank. vLLM's
    ``ReplicatedLinear``, where the backend puts every layer its plans do not name (the tower's), and a parallel
    linear built with ``disable_tp`` (one rank's size) hold the whole weight."""
    return isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and getattr(module, "tp_size", 1) > 1


def _with_encoder_graphs(stock: type, name: str) -> type:
    """A direct subclass of the backend class ``stock`` with :class:`~vitcg.vllm_plugin.bridge.EncoderGraphs`'s
    members."""
    members = {k: v for k, v in vars(EncoderGraphs).items() if k not in ("__dict__", "__weakref__", "__doc__")}
    doc = f"vLLM's ``{stock.__name__}`` with encoder CUDA graphs from vitcg's spec of the model it wraps."
    return type(name, (stock,), {**members, "_stock": stock, "_sharded": staticmethod(sharded), "__doc__": doc,
                                  "__qualname__": name, "__module__": __name__})


VitcgMultiModalForCausalLM = _with_encoder_graphs(TransformersMultiModalForCausalLM, "VitcgMultiModalForCausalLM")
VitcgMultiModalMoEForCausalLM = _with_encoder_graphs(TransformersMultiModalMoEForCausalLM,
                                                     "VitcgMultiModalMoEForCausalLM")
