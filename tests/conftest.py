"""Fixtures every test folder shares, registered once here; their code lives in ``tests/support/``.

``valkey_url``, ``redis7_url``, ``server_url``, ``valkey_cluster`` (``tests/support/valkey.py``);
``make_stack`` and ``gie_stack`` (``tests/support/stacks.py``, over ``bench.stack``); ``envoy_factory``
(``tests/support/envoy.py``). Helpers without fixtures are imported from ``tests/support`` directly
(``polling.until``, ``clock.FakeClock``, ``golden.golden``, ``http.http_ok``, ``config.router_config``).
``tests/support/realtime.py`` adds the ``realtime(race=...)`` marker: the only tests scripts/test.sh retries.
"""

pytest_plugins = ["tests.support.valkey", "tests.support.stacks", "tests.support.envoy", "tests.support.realtime"]
