"""Which chat message a token offset falls in, read from the token ids alone (for the live path).

A chat template opens every message with the same special token (ChatML's ``<|im_start|>``, Llama 3's
``<|start_header_id|>``), followed by the role's token. Rendering a probe conversation once per model (at
start, through the picker's own preparer) finds that *marker* and the role tokens; a live request's message
at an offset is then the number of markers before it. Templates without such a marker (Mistral's ``[INST]``)
give no marker: the message stays unknown. Indexes count rendered messages (a template that injects a system
message shifts them by one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extproc.diagnostics.prefix_stability import MessageRef

PROBE_MESSAGES: tuple[Mapping[str, str], ...] = (
    {"role": "system", "content": "probe one"},
    {"role": "user", "content": "probe two"},
    {"role": "assistant", "content": "probe three"},
    {"role": "user", "content": "probe four"},
)
"""The probe conversation; render it without a generation prompt."""


@dataclass(frozen=True, slots=True)
class MessageMarkers:
    marker: int  # token id that opens every message
    roles: Mapping[int, str]  # the token after the marker -> role; empty when roles are not one token each

    @classmethod
    def from_probe(cls, tokens: Sequence[int]) -> MessageMarkers | None:
        """From ``PROBE_MESSAGES`` rendered and tokenized; None when no token opens each message once."""
        n = len(PROBE_MESSAGES)
        counts = Counter(tokens)
        firsts = [(tokens.index(t), t) for t, c in counts.items() if c == n]
        if not firsts:
            return None
        marker = min(firsts)[1]
        at = [i for i, t in enumerate(tokens) if t == marker]
        after = [tokens[i + 1] if i + 1 < len(tokens) else -1 for i in at]
        roles = {after[i]: m["role"] for i, m in enumerate(PROBE_MESSAGES)}
        consistent = len(roles) == len({m["role"] for m in PROBE_MESSAGES})
        return cls(marker, roles if consistent else {})

    def locate(self, tokens: Sequence[int], offset: int) -> MessageRef:
        """The message ``offset`` falls in: markers at or before it, less one (0 before the first)."""
        head = list(tokens[: offset + 1])
        count = head.count(self.marker)
        if not count:
            return MessageRef(0, "?")
        at = len(head) - 1 - head[::-1].index(self.marker)
        return MessageRef(count - 1, self.roles.get(tokens[at + 1], "?") if at + 1 < len(tokens) else "?")
