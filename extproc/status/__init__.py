"""What the scheduler sees, for people: the fleet view behind ``/status`` and the ``router_endpoint_*`` /
``router_model_*`` metrics.

* ``tap``: ``DecisionTap``, fed once per decision from ``Router._observe`` (O(1): counters and ring appends).
* ``ceiling``: the cached-share ceiling estimate (an infinite cache over the requests the tap queued).
* ``view``: ``gather(sources)`` reads the in-memory state (registry, in-flight load, event streams, indexes, tap)
  into one frozen ``FleetView``; no I/O.
* ``collector``: ``FleetCollector``, the view as Prometheus families (at scrape time).
* ``page``: ``render(view, sections)``, plain HTML and inline SVG; ``sections`` is a list, so later reports
  (the prefix-stability report) plug in as one more section renderer.
"""
