"""A client cannot claim another tenant's class through real Envoy when the listener strips the tenant header
(``extproc envoy-config --strip-tenant-header H [--tenant T]``, ``docs/tenants.md``, "Trust").

One picker with a premium and a batch class behind three Envoys: one that sets every request's tenant to
``batch`` (strip and set), one that only strips, and one rendered without the option (the control: there the
claim is believed, so the test can tell). Each client request claims ``premium``; the picker's decision line
says which tenant it saw.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bench.cell_trace import decisions
from bench.stack import Stack
from extproc import wire
from tests.support.chat import chat
from tests.support.polling import until
from tests.support.stacks import GieStackFactory

CLASSES: dict[str, Any] = {"tenants": {"classes": {"premium": {"priority": 1}, "batch": {"priority": 0}}}}


def tenants_seen(stack: Stack) -> dict[str, str]:
    """``{request id: tenant}`` from the picker's decision lines."""
    assert stack.picker is not None
    return {rid: line["tenant"] for rid, line in decisions(stack.picker.log_text()).items()}


@pytest.mark.envoy
@pytest.mark.slow
async def test_a_client_claiming_another_tenant_is_not_believed(gie_stack: GieStackFactory) -> None:
    stack = gie_stack({"tenant_header": wire.TENANT_HEADER, "tenant": "batch"}, CLASSES)
    envoys = {"set": stack.envoy, "strip": stack.add_envoy(tenant_header=wire.TENANT_HEADER, tenant=None),
              "open": stack.add_envoy(tenant_header=None, tenant=None)}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        for name, envoy in envoys.items():
            claim = {wire.TENANT_HEADER: "premium", wire.REQUEST_ID_HEADER: f"claim-{name}"}
            status, body = await chat(session, envoy.url("/v1/chat/completions"),
                                      [{"role": "user", "content": "Whose request is this?"}], headers=claim)  # fmt: skip
            assert status == 200, body
    await until(lambda: len(tenants_seen(stack)) >= 3, what="three decision lines")
    seen = tenants_seen(stack)
    assert seen["claim-set"] == "batch", "the listener's tenant replaces the client's claim"
    assert seen["claim-strip"] == "", "the claim is stripped: the picker sees no tenant (the default class)"
    assert seen["claim-open"] == "premium", "control: without the strip the claim is believed"
