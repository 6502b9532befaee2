"""Scripted prompt material for the real-vLLM tier: deterministic documents of a few hundred tokens each.

Block size is 128 on vLLM's CPU build, so a case needs several blocks of shared prefix to show a hit.
"""

from __future__ import annotations

from typing import Any

from bench.vllm_cpu import MODEL

_WORDS = ("river", "ledger", "harbor", "quartz", "meadow", "signal", "copper", "lantern", "orbit", "velvet",
          "timber", "glacier", "beacon", "saffron", "compass", "mosaic")  # fmt: skip

SYSTEM = "You are a careful analyst. Answer in one short paragraph and cite the section you used."

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def document(seed: int, sections: int = 12) -> str:
    """A deterministic report of ``sections`` sections (about 45 tokens each); different seeds share no text."""
    lines = [f"Report {seed}: field notes."]
    for s in range(sections):
        words = " ".join(_WORDS[(seed * 7 + s * 3 + k) % len(_WORDS)] for k in range(18))
        lines.append(f"Section {s + 1} of report {seed}. {words.capitalize()}.")
    return "\n".join(lines)


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A chat body for the tiny model: a few tokens out, no EOS surprises."""
    return {"model": MODEL, "messages": messages, "max_tokens": 3, "ignore_eos": True, **extra}


def completion(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 3, "ignore_eos": True, **extra}


def ask(doc: str, question: str, system: bool = True) -> list[dict[str, Any]]:
    head = [{"role": "system", "content": SYSTEM}] if system else []
    return [*head, {"role": "user", "content": f"{doc}\n\nQuestion: {question}"}]
