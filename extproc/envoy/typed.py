"""Small helpers over ``envoy_data_plane``'s betterproto2 classes: Any packing, addresses, durations."""

from __future__ import annotations

import datetime
import ipaddress
from typing import Any as AnyValue

import betterproto2
from envoy_data_plane.envoy.config.core.v3 import Address, SocketAddress, TypedExtensionConfig
from envoy_data_plane.google.protobuf import Any


def pack(message: betterproto2.Message) -> Any:
    """Wrap ``message`` in ``google.protobuf.Any``; ``to_dict`` renders it with its ``@type`` URL."""
    return Any.pack(message)


def extension(name: str, message: betterproto2.Message) -> TypedExtensionConfig:
    """A named ``TypedExtensionConfig`` (load-balancing policies, resource monitors)."""
    return TypedExtensionConfig(name=name, typed_config=pack(message))


def seconds(value_s: float) -> datetime.timedelta:
    """A protobuf ``Duration`` from seconds (betterproto2 maps Duration to ``timedelta``)."""
    return datetime.timedelta(seconds=value_s)


def address(host: str, port: int) -> Address:
    """A TCP socket address."""
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def is_ip(host: str) -> bool:
    """True for an IP literal (STATIC clusters need one; names need STRICT_DNS)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def plain(message: betterproto2.Message) -> dict[str, AnyValue]:
    """``message`` as proto-JSON with snake_case keys, the spelling Envoy's docs and YAML configs use."""
    return message.to_dict(casing=betterproto2.Casing.SNAKE)
