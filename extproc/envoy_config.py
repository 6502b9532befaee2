"""The one door to Envoy configuration for code outside ``extproc/envoy/``: ``EnvoyOptions`` →
``render_bootstrap`` → ``to_yaml`` (the package's own modules never come back through it).

The pieces live in ``extproc/envoy/``: ``options`` (the typed knobs), ``filters`` (strip, subset hint,
ext_proc, router, access log), ``clusters`` (picker and model servers), ``bootstrap`` (listener, route,
retries, overload manager). ``extproc envoy-config`` is the command-line front end.
"""

from __future__ import annotations

from extproc.envoy import keys
from extproc.envoy.bootstrap import RETRY_ON, render_bootstrap, to_yaml
from extproc.envoy.filters import ACCESS_LOG_FORMAT
from extproc.envoy.options import BodyMode, ClusterMode, EnvoyOptions, OriginalDstSource

__all__ = [
    "ACCESS_LOG_FORMAT",
    "RETRY_ON",
    "BodyMode",
    "ClusterMode",
    "EnvoyOptions",
    "OriginalDstSource",
    "keys",
    "render_bootstrap",
    "to_yaml",
]
