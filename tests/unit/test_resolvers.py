"""``TenantResolver``: a tenant id → its class's promises, every setting carried by name."""

from extproc.config import TenantClass, TenantsConfig
from extproc.resolvers import TenantResolver
from extproc.types import Tenant


def test_tenant_classes_and_the_default() -> None:
    resolve = TenantResolver(
        TenantsConfig(classes={"batch": TenantClass(priority=-1, ttft_target_s=5.0)}, default=TenantClass(priority=1))
    )
    assert resolve("batch") == Tenant("batch", priority=-1, ttft_target_s=5.0, cls="batch")
    assert resolve("someone") == Tenant("someone", priority=1, ttft_target_s=None, cls="default")
    assert resolve("") == Tenant("", priority=1, cls="default")
