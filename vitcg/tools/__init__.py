"""Tools around the runtime: check cases, benchmarks and their workloads, ``vitcg new`` drafts, registry
rendering, reports, building encoders from config classes, vLLM compilation configs."""
