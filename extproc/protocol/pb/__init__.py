"""Generated protobuf/gRPC stubs for our subset of Envoy's ext_proc API (``scripts/gen_protos.py``; do not edit)."""
