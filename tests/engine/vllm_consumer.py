"""A minimal engine-side consumer of the protocol that calls a model the way vLLM 0.33.0's manager does.

Written from the facts in shared/VLLM_PROTOCOL.md, not from vLLM's code. It imports nothing of vitcg but
the data objects: if an adapter works here, it works under an engine that knows only the protocol.

Calling sequence: config -> budget range from a ``vllm_config``-shaped object -> doubling ladder and the
item cap -> capture per budget (and per combination of capture axis keys), largest first, with ``path`` and
``axis_keys`` passed positionally -> item specs -> smallest-first packing (closing a pack when an item alone
outweighs it) -> select with the pack's unsorted index list, popping the axis keys it returns -> the graph of
that budget and those keys -> replay buffers -> padding callables (or zero + copy) -> forward -> postprocess
into a ``dest`` dict. Packing is by each item's tokens on the default path (``get_path_output_tokens``): a pack
whose items have none there runs no forward, and postprocess gets no output for the path (vLLM 0.33.0's
``_execute_local`` for a path a pack leaves out, which ``allow_zero_tokens`` permits). ``execute_dp`` simulates
data-parallel ranks: items are load-balanced across ranks by input size, each rank selects its unsorted share
and runs it locally, results are scattered back.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from vitcg.runtime.protocol import ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG


class ProtocolConsumer:
    def __init__(self, vllm_config: Any, device: torch.device, dtype: torch.dtype, model: Any,
                 cuda_graphs: bool = False):
        self.model, self.device, self.dtype, self.cuda_graphs = model, device, dtype, cuda_graphs
        self.config = model.get_encoder_cudagraph_config()
        options = vllm_config.compilation_config
        budgets = options.encoder_cudagraph_token_budgets
        items = options.encoder_cudagraph_max_vision_items_per_batch
        if budgets and items > 0:
            self.budgets, self.max_batch_size = sorted(budgets), items
        else:
            low, high = model.get_encoder_cudagraph_budget_range(vllm_config)
            assert 0 < low <= high
            if items > 0:
                self.budgets, self.max_batch_size = self.ladder(max(low, items), high), items
            else:
                self.budgets = sorted(budgets) if budgets else self.ladder(low, high)
                self.max_batch_size = min(high // low, min(self.budgets))
        frames = options.encoder_cudagraph_max_frames_per_batch
        self.max_frames_per_batch = (frames if frames is not None
                                     else self.max_batch_size * self.config.max_frames_per_video)
        self.graphs: dict[tuple, dict[str, Any]] = {}
        """By (budget, axis keys): the keys are () for a model without capture axes."""
        self.pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self.hits = self.misses = 0

    @staticmethod
    def ladder(low: int, high: int) -> list[int]:
        out, b = [], low
        while b <= high:
            out.append(b)
            b *= 2
        if out[-1] < high:
            out.append(high)
        return out

    def capture(self) -> None:
        for budget, keys in itertools.product(sorted(self.budgets, reverse=True),
                                              itertools.product(*self.config.capture_axes)):
            inputs = self.model.prepare_encoder_cudagraph_capture_inputs(
                budget, self.max_batch_size, self.max_frames_per_batch, self.device, self.dtype, "default", keys)
            values = inputs.values
            entry: dict[str, Any] = {"values": values}
            if self.cuda_graphs:
                with torch.inference_mode():
                    out = self.model.encoder_cudagraph_forward({**values}, path="default")
                    entry["out"] = torch.empty_like(out)
                graph = torch.cuda.CUDAGraph()
                with torch.inference_mode(), torch.cuda.graph(graph, pool=self.pool):
                    entry["out"].copy_(self.model.encoder_cudagraph_forward({**values}, path="default"))
                entry["graph"] = graph
            self.graphs[(budget, keys)] = entry

    def fit(self, tokens: int) -> int | None:
        return next((b for b in self.budgets if b >= tokens), None)

    def packs(self, tokens: list[int], path_tokens: list[int] | None = None) -> list[list[int]]:
        """Items in order of their output ``tokens``, packed by their tokens on the path (``path_tokens``,
        default the same): an item of no tokens there fits any pack and never closes one early."""
        path_tokens = tokens if path_tokens is None else path_tokens
        order = sorted(range(len(tokens)), key=lambda i: tokens[i])
        packs: list[list[int]] = []
        current: list[int] = []
        total = 0
        for i in order:
            fits = len(current) < self.max_batch_size and total + path_tokens[i] <= self.budgets[-1]
            defer = False
            if current and fits and path_tokens[i]:
                now, alone, merged = self.fit(total), self.fit(path_tokens[i]), self.fit(total + path_tokens[i])
                defer = alone is not None and alone >= now and now + alone < merged
            if current and (not fits or defer):
                packs.append(current)
                current, total = [], 0
            current.append(i)
            total += path_tokens[i]
        if current:
            packs.append(current)
        return packs

    def replay(self, budget: int, keys: tuple, selected: dict) -> torch.Tensor:
        entry = self.graphs[(budget, keys)]
        fresh = self.model.prepare_encoder_cudagraph_replay_buffers(
            selected, self.max_batch_size, self.max_frames_per_batch, "default")
        for key, buffer in entry["values"].items():
            value = fresh.values.get(key)
            if value is None:
                continue
            if value.ndim == 0:
                buffer.copy_(value)
            elif key in self.config.padding_logics:
                self.config.padding_logics[key](buffer, value)
            else:
                buffer.zero_()
                buffer[:value.shape[0]].copy_(value)
        if self.cuda_graphs:
            entry["graph"].replay()
            return entry["out"]
        with torch.inference_mode():
            return self.model.encoder_cudagraph_forward({**entry["values"]}, path="default")

    def select(self, mm_kwargs: dict, indices: list[int]) -> tuple[dict, tuple]:
        """The selection and the capture axis keys it names (one per axis)."""
        selected = dict(self.model.select_encoder_cudagraph_items(mm_kwargs, indices))
        keys = tuple(selected.pop(ENCODER_CUDAGRAPH_AXIS_KEYS_KWARG, ()))
        assert len(keys) == len(self.config.capture_axes)
        return selected, keys

    def execute(self, mm_kwargs: dict) -> list[torch.Tensor]:
        specs = self.model.get_encoder_cudagraph_item_specs(mm_kwargs)
        tokens = [s.output_tokens for s in specs]
        path_tokens = [s.get_path_output_tokens("default") for s in specs]
        dest: dict[int, torch.Tensor] = {}
        for pack in self.packs(tokens, path_tokens):
            selected, keys = self.select(mm_kwargs, pack)
            on_path = sum(path_tokens[i] for i in pack)
            budget = self.fit(on_path)
            outputs = {}
            if not on_path:  # the pack leaves the path out: no forward runs for it
                self.misses += len(pack)
            elif budget is None:
                with torch.inference_mode():
                    outputs["default"] = self.model.encoder_eager_forward(selected, path="default")
                self.misses += len(pack)
            else:
                outputs["default"] = self.replay(budget, keys, selected)
                self.hits += len(pack)
            self.model.postprocess_encoder_output(outputs, pack, tokens, dest, clone=True, batch_mm_kwargs=selected)
        return [dest[i] for i in range(len(specs))]

    @staticmethod
    def shares(sizes: list[int], ranks: int) -> list[list[int]]:
        """Each rank's items by load balance of their input ``sizes`` (largest first onto the least loaded
        rank); a rank's index list is in assignment order, not sorted."""
        shares: list[list[int]] = [[] for _ in range(ranks)]
        load = [0] * ranks
        for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
            r = min(range(ranks), key=lambda r: (load[r], r))
            shares[r].append(i)
            load[r] += sizes[i]
        return shares

    def execute_dp(self, mm_kwargs: dict, ranks: int) -> list[torch.Tensor]:
        """Every rank's share (:meth:`shares`) run locally, one after another, results in item order."""
        sizes = [s.input_size for s in self.model.get_encoder_cudagraph_item_specs(mm_kwargs)]
        results: dict[int, torch.Tensor] = {}
        for share in self.shares(sizes, ranks):
            local = self.execute(self.select(mm_kwargs, share)[0])
            results.update(zip(share, local))
        return [results[i] for i in range(len(sizes))]
