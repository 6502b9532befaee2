"""Wire names Envoy and the picker agree on (GIE endpoint-picker protocol), as the Envoy config uses them.

The picker's adapter owns these names (``extproc/protocol/constants.py``, ``extproc/router.py``); they are
repeated here so that rendering Envoy config never imports the gRPC stack. A test pins them equal.
"""

from __future__ import annotations

DEST_HEADER = "x-gateway-destination-endpoint"
"""Request header the picker sets: ``ip:port`` or an ordered ``ip:port,ip:port`` fallback list."""

LB_NAMESPACE = "envoy.lb"
"""Dynamic-metadata namespace the picker writes its pick into (key ``DEST_HEADER``)."""

SERVED_KEY = "x-gateway-destination-endpoint-served"
"""Key in ``LB_NAMESPACE`` under which override_host records the host it actually used."""

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
"""Request-metadata namespace a gateway uses to restrict the picker to a subset of endpoints."""

SUBSET_KEY = "x-gateway-destination-endpoint-subset"
"""Key in ``SUBSET_NAMESPACE``: a list of ``ip:port``."""

REASON_HEADER = "x-router-reason"
"""Request header the picker may set with its decision reason (logged by Envoy, not used for routing)."""

CACHED_TOKENS_HEADER = "x-router-cached-tokens"
"""Request header the picker may set with the expected cached prefix tokens (logged only)."""

PICKER_HEALTH_SERVICE = "readiness"
"""The picker's gRPC health service Envoy checks (NOT_SERVING until its first scrape round, and while stopping)."""

# Cluster names in the rendered bootstrap; tests read counters such as cluster.picked.upstream_rq_retry.
PICKER_CLUSTER = "extproc"
MODEL_CLUSTER = "picked"
