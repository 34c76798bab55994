"""The runtime an engine imports: vLLM's protocol, the generic adapter, metadata providers, padding rules,
attention, host-sync guard, budgets and the budget manager. Needs torch; never imports :mod:`vitcg.tools`."""
