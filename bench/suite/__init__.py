"""The benchmark suite: ``python -m bench`` (see ``bench/__main__.py`` and docs/benchmarks.md).

Modules: ``words`` (token-exact synthetic text), ``workloads`` (request plans and their cache ceiling),
``fleet`` (simulated backends, our pickers behind Envoy, Envoy baselines, the peer routers), ``client`` (one
asyncio load generator), ``measure`` (backend metrics, process CPU, per-cell summaries), ``runner`` (the
rate ladders, ``results.json``), ``report`` (Markdown, plots, goals).
"""
