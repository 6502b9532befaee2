"""A 300 KB chat body received in 64 KiB reads, cut out of its gRPC frame, parsed and JSON-decoded, 300 times:
CPU and minor page faults per body. ``KEEP=1`` first calls ``extproc.process.keep_heap(64 MiB)``.

    python bench/results/hotpath-inline/malloc_micro.py; KEEP=1 python bench/results/hotpath-inline/malloc_micro.py
"""

import json
import os
import resource
import time

from bench.picker_latency import filler, messages
from bench.stack_config import MODEL
from extproc import process
from extproc.protocol.pb import external_processor_pb2 as pb

BODY = json.dumps({"model": MODEL, "messages": messages(filler(6250), 1), "max_tokens": 1}).encode()
MESSAGE = pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)).SerializeToString()
FRAME = b"\x00" + len(MESSAGE).to_bytes(4, "big") + MESSAGE


def one() -> int:
    buffered = bytearray()
    for at in range(0, len(FRAME), 65536):
        buffered += FRAME[at : at + 65536]
    request = pb.ProcessingRequest.FromString(bytes(buffered[5:]))
    return len(json.loads(request.request_body.body)["messages"])


def main(rounds: int = 300) -> None:
    if os.environ.get("KEEP"):
        process.keep_heap(64 << 20)
    for _ in range(20):
        one()
    faults0, cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    for _ in range(rounds):
        one()
    faults1, cpu1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    side = "kept" if os.environ.get("KEEP") else "default"
    print(f"{side:>8}: body {len(BODY)} B, {1000 * (cpu1 - cpu0) / rounds:.3f} ms/body, "
          f"minor faults/body {(faults1 - faults0) / rounds:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
