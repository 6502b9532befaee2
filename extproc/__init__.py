"""Cache-aware router for vLLM fleets: an Envoy ext_proc endpoint picker."""
