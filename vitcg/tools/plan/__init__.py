"""``vitcg plan`` (:mod:`.planner`: budgets for a sample of requests) and ``vitcg compile-config``
(:mod:`.compile_config`: the compilation config vLLM takes)."""
