"""What rendering an agent's chat costs, piece by piece, on the router's own template path (``FastTemplate``).

    python bench/results/agent-render/template_floor.py [STEP]

The body of ``bench.picker_latency``'s agent cell at STEP (default 142: ~100K tokens, 286 messages). Printed, the
median of 60 of each, in one warm process: the JSON decode, the request parse, vLLM's conversation, transformers'
plain copies, the render; then the Qwen3 template against templates that do less of what it does (a loop alone,
the content, role and content, the loop variables, the reverse pass with a namespace), on the same messages.
"""

import json
import statistics
import sys
import time
from collections.abc import Callable

import msgspec
from transformers import AutoTokenizer

from bench.picker_latency import agent_messages
from extproc.prompt import openai, render
from extproc.prompt.templates import FastTemplate, _environment, _plain_message

CONSTRUCTS = {
    "loop only": "{% for m in messages %}x{% endfor %}",
    "content": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "role + content": "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}",
    "loop.index0 / loop.last": "{% for m in messages %}{% if loop.index0 > 3 and not loop.last %}{{ m.content }}"
    "{% endif %}{% endfor %}",
    "reverse pass, namespace": "{% set ns = namespace(a=true, b=messages|length - 1) %}{% for m in messages[::-1] %}"
    "{% set index = (messages|length - 1) - loop.index0 %}{% if ns.a and m.role == 'user' %}{% set ns.a = false %}"
    "{% endif %}{% endfor %}x",
}


def ms(f: Callable[[], object], n: int = 60) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main(step: int) -> None:
    tok = AutoTokenizer.from_pretrained("tokenizer_cache/Qwen/Qwen3-0.6B")
    info = render.TemplateInfo.of(tok.chat_template)
    body = json.dumps({"model": "m", "messages": agent_messages(step), "max_tokens": 1}).encode()
    parsed = openai.parse_request(body, "application/json", openai.RequestKind.CHAT)
    conversation = render.to_conversation(parsed.messages, info)
    plain = [_plain_message(m) for m in conversation]
    kwargs = render.template_kwargs(parsed, info)
    fast = FastTemplate(tok.chat_template, tok.special_tokens_map)
    decoder = msgspec.json.Decoder()
    print(f"step {step}: {len(body)} bytes, {len(conversation)} messages (ms, median of 60)")
    print(f"  JSON decode             {ms(lambda: decoder.decode(body)):.3f}")
    print(f"  parse_request           {ms(lambda: openai.parse_request(body, None, openai.RequestKind.CHAT)):.3f}")
    print(f"  to_conversation         {ms(lambda: render.to_conversation(parsed.messages, info)):.3f}")
    print(f"  plain copies            {ms(lambda: [_plain_message(m) for m in conversation]):.3f}")
    print(f"  FastTemplate.render     {ms(lambda: fast.render(conversation, **kwargs)):.3f}")
    env = _environment()
    for name, source in {**CONSTRUCTS, "the Qwen3 template": tok.chat_template}.items():
        template = env.from_string(source)
        print(f"  {name:24s}{ms(lambda t=template: t.render(messages=plain, add_generation_prompt=True)):.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 142)
