"""
The one door to proton-c: its C API through python-qpid-proton's cffi module.

Why not the wrapper classes: they allocate ~16 Python objects per message and cost ~80 µs of
broker CPU per message against ~12 µs for direct calls (reference/engine-spike.md). The hot path
(transfer in, delivery out, disposition, flow) therefore calls ``lib.pn_*`` here; cold paths
(attach termini, capabilities, filters) may use proton's ``Data`` wrapper through the helpers
below.

``cproton_ffi`` is the binding's internal module, not a public API, so the binding is pinned to
one minor version and importing this module on another version fails loudly.
"""

from typing import Any, Final

import cproton
import proton
from cproton_ffi import ffi, lib

SUPPORTED_PROTON: Final = (0, 40)
if tuple(proton.VERSION[:2]) != SUPPORTED_PROTON:  # pragma: no cover - guarded by a test
    raise ImportError(
        f'shoal_broker.amqp.engine is written for python-qpid-proton '
        f'{SUPPORTED_PROTON[0]}.{SUPPORTED_PROTON[1]}.x, found {proton.VERSION}'
    )

__all__ = ['ffi', 'lib']

NULL: Final = ffi.NULL
Ptr = Any
"""A cffi pointer to a proton object; hashable and comparable by address."""


def link_name(link: Ptr) -> str:
    return str(cproton.pn_link_name(link))


def terminus_address(terminus: Ptr) -> str | None:
    address = cproton.pn_terminus_get_address(terminus)
    return str(address) if address is not None else None


def set_terminus_address(terminus: Ptr, address: str) -> None:
    cproton.pn_terminus_set_address(terminus, address)


def data_object(data: Ptr) -> Any:
    """Decode a proton ``pn_data_t`` (capabilities, filters, properties) into Python values."""
    d = proton.Data(data)
    d.rewind()
    if not d.next():
        return None
    return d.get_object()


def symbols(data: Ptr) -> list[str]:
    """A capability field: a single symbol or an array of symbols, as strings."""
    value = data_object(data)
    if value is None:
        return []
    if isinstance(value, str):
        return [str(value)]
    if isinstance(value, proton.Array):
        return [str(v) for v in value.elements]
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return []


def put_symbols(data: Ptr, values: list[str]) -> None:
    d = proton.Data(data)
    d.clear()
    descriptor: Any = proton.UNDESCRIBED  # proton's annotation omits its own sentinel
    d.put_object(proton.Array(descriptor, proton.Data.SYMBOL, *map(proton.symbol, values)))


def put_map(data: Ptr, values: dict[str, Any]) -> None:
    d = proton.Data(data)
    d.clear()
    d.put_object({proton.symbol(k): v for k, v in values.items()})


JMS_SELECTOR_DESCRIPTOR: Final = 0x0000468C00000004


def put_filter(data: Ptr, selector: str) -> None:
    """A source filter set holding a JMS selector, as Qpid JMS and Artemis encode it."""
    d = proton.Data(data)
    d.clear()
    d.put_object(
        {
            proton.symbol('jms-selector'): proton.Described(
                proton.ulong(JMS_SELECTOR_DESCRIPTOR), selector
            )
        }
    )


def set_condition_info(condition: Ptr, info: dict[str, str]) -> None:
    """Symbol-keyed, symbol-valued error info (e.g. ``{invalid-field: container-id}``)."""
    d = proton.Data(lib.pn_condition_info(condition))
    d.clear()
    d.put_object({proton.symbol(k): proton.symbol(v) for k, v in info.items()})


def set_condition(condition: Ptr, name: str, description: str) -> None:
    cproton.pn_condition_set_name(condition, name)
    cproton.pn_condition_set_description(condition, description)


def condition_text(condition: Ptr) -> str | None:
    if not lib.pn_condition_is_set(condition):
        return None
    name = cproton.pn_condition_get_name(condition)
    description = cproton.pn_condition_get_description(condition)
    return f'{name}: {description}' if description else str(name)


def set_container(connection: Ptr, container_id: str) -> None:
    cproton.pn_connection_set_container(connection, container_id)


def remote_container(connection: Ptr) -> str | None:
    value = cproton.pn_connection_remote_container(connection)
    return str(value) if value is not None else None


def allow_mechanisms(transport: Ptr, mechanisms: str) -> None:
    lib.pn_sasl_allowed_mechs(lib.pn_sasl(transport), mechanisms.encode())
