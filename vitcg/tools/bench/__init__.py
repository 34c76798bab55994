"""``vitcg bench``: latency of every method on the bench workloads (:mod:`.measure`) and the roofline floor
(:mod:`.roofline`)."""
