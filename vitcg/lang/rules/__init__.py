"""Rule functions: each takes the parts of a spec it reads and returns or yields the diagnostics it finds.

One module per section of a spec: :mod:`.schema` (structure), :mod:`.geometry` (geometry and attention),
:mod:`.modalities` (input roles and the eager call), :mod:`.buffers`, :mod:`.tests` and :mod:`.bindings`
(import paths, configs and evaluated formulas). :mod:`vitcg.lang.checks` runs them in order and builds the spec.
"""
