"""A dummy LoRA adapter for the tiny Qwen3 (rank 8 on q_proj and v_proj, lora_B zero so outputs are unchanged),
written with the engine venv's own torch and safetensors (the router's venv has neither)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

NAME = "tiny-lora"
RANK = 8
_WRITE = """
import sys, torch
from safetensors.torch import save_file
rank, target = int(sys.argv[1]), sys.argv[2]
shapes = {"q_proj": 256, "v_proj": 128}  # out features: 4 heads x 64, 2 KV heads x 64; in = hidden 256
tensors = {}
for layer in range(2):
    for proj, out in shapes.items():
        key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, 256, dtype=torch.bfloat16) * 0.01
        tensors[f"{key}.lora_B.weight"] = torch.zeros(out, rank, dtype=torch.bfloat16)
save_file(tensors, f"{target}/adapter_model.safetensors")
"""


def make_adapter(python: Path, target: Path) -> Path:
    """Write the adapter folder at ``target`` (config + weights); returns it. Raises ``CalledProcessError``."""
    target.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "r": RANK,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "tiny",
    }
    (target / "adapter_config.json").write_text(json.dumps(config))
    subprocess.run([str(python), "-c", _WRITE, str(RANK), str(target)], check=True, timeout=120,
                   capture_output=True)  # fmt: skip
    return target
