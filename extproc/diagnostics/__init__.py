"""Diagnostics of the traffic the router sees (not of the router itself): prefix stability (issue 15).

``fingerprints`` (unchained per-granule content fingerprints), ``prefix_stability`` (the pure detector),
``live`` (the router's sampled hook and the scrape-time metrics), ``report`` (text, SVG and the status page's
HTML fragment), ``diagnose`` (the ``extproc diagnose`` command: JSONL bodies or a trace, offline).
"""
