"""``vllm-sim``: placeholder until the simulator lands."""


def main() -> int:
    raise SystemExit("vllm-sim: not built yet")
