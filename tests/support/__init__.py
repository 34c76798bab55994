"""Helpers that test files share, in one place each (importable as ``support.NAME``: ``tests/`` is on ``sys.path``
through ``tests/conftest.py``, pytest's default import mode).

- :mod:`support.specs`: the packaged specs loaded once for the session (:func:`~support.specs.packaged`), spec
  files as tests read, copy and edit them, the generated ``test_configs.py``;
- :mod:`support.tiny`: a spec's tiny encoder behind its adapter, a manager over it, and qwen2_vl inputs;
- :mod:`support.eager`: per-item comparisons against eager;
- :mod:`support.cli`: the ``vitcg`` command as a subprocess, and a folder's files as one comparable value;
- :mod:`support.inprocess`: the ``vitcg`` command inside the test process;
- :mod:`support.scripts`: a script of ``benchmarks/`` imported by its path.

The stand-ins for other projects' code live beside the tests that drive them, each in one place:
``tests/engine/vllm_consumer.py`` and ``tests/engine/backend_standin.py`` (vLLM's consumer of the protocol and
its Transformers backend), ``tests/vllm/doubles.py`` (what vLLM's own manager needs of a GPU).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root: a test finds files by it, wherever under tests/ it lives."""
