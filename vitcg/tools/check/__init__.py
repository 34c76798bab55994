"""``vitcg check``: the spec stage's cases (:mod:`.cases`, bounded by :mod:`.bounds`), the end-to-end stage on the
tiny VLM (:mod:`.vlm`), why a step failed (:mod:`.failures`) and the report (:mod:`.report`)."""
