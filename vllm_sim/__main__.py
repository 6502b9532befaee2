"""``python -m vllm_sim``: same as the ``vllm-sim`` console script."""

from vllm_sim.cli import main

raise SystemExit(main())
