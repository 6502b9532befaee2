"""The end-to-end stack fixture (simulators, the picker process, real Envoy) shared with tests/e2e."""

from tests.e2e.conftest import make_stack

__all__ = ["make_stack"]
