"""``vitcg new``: a draft spec read off a transformers model type (:mod:`.scaffold`)."""
