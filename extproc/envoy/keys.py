"""Names that exist only in the rendered Envoy bootstrap (cluster names).

The names Envoy shares with the picker (headers, ``envoy.lb`` keys, the health service) live in
``extproc/wire.py``; these two are ours alone, read back by tests and the deploy renderer (for example the
counter ``cluster.picked.upstream_rq_retry``).
"""

from __future__ import annotations

PICKER_CLUSTER = "extproc"
"""The cluster of the ext_proc picker (gRPC, health-checked on ``wire.HEALTH_READINESS``)."""

MODEL_CLUSTER = "picked"
"""The cluster of the model servers, whose load balancer honours the pick."""
