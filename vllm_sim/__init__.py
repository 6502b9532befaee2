"""vllm-sim: a vLLM-compatible simulator (HTTP API, metrics, KV events, prefix caching) with a timing model.

Entry points: ``vllm_sim.cli:main`` (the ``vllm-sim`` console script, ``python -m vllm_sim``) and
``vllm_sim.cluster.SimCluster`` (K servers inside the caller's event loop). See docs/simulator.md.
This package never imports the router (``extproc``).
"""
