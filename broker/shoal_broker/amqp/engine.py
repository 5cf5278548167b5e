"""
The one door to proton-c: its C API through python-qpid-proton's cffi module.

Why not the wrapper classes: they allocate ~16 Python objects per message and cost ~80 µs of
broker CPU per message against ~12 µs for direct calls (reference/engine-spike.md). The hot path
(transfer in, delivery out, disposition, flow) therefore calls ``lib.pn_*`` here; cold paths
(attach termini, capabilities, filters) may use proton's ``Data`` wrapper through the helpers
below.

The per-message work itself (a transfer out, a transfer in, a consumer's outcome, the bytes to
and from the socket) is one call each into ``_wire`` (amqp/_wire.c), which calls the same C
functions without a cffi crossing per call; it is handed their addresses here, once.

``cproton_ffi`` is the binding's internal module, not a public API, so the binding is pinned to
one minor version and importing this module on another version fails loudly.
"""

import ctypes
from typing import Any, Final

import cproton
import cproton_ffi
import proton
from cproton_ffi import ffi, lib

from shoal_broker.amqp import _wire  # type: ignore[attr-defined]

SUPPORTED_PROTON: Final = (0, 40)
if tuple(proton.VERSION[:2]) != SUPPORTED_PROTON:  # pragma: no cover - guarded by a test
    raise ImportError(
        f'shoal_broker.amqp.engine is written for python-qpid-proton '
        f'{SUPPORTED_PROTON[0]}.{SUPPORTED_PROTON[1]}.x, found {proton.VERSION}'
    )

__all__ = ['ffi', 'lib', 'wire']

NULL: Final = ffi.NULL
Ptr = Any
"""A cffi pointer to a proton object; hashable and comparable by address."""

WIRE_FUNCTIONS: Final = (  # the order of shoal_bind() in amqp/_wire.c
    'pn_delivery', 'pn_link_send', 'pn_link_recv', 'pn_link_advance', 'pn_delivery_settle',
    'pn_delivery_pending', 'pn_delivery_partial', 'pn_delivery_aborted', 'pn_delivery_settled',
    'pn_delivery_updated', 'pn_delivery_remote_state', 'pn_delivery_remote',
    'pn_disposition_is_failed', 'pn_disposition_is_undeliverable', 'pn_delivery_update',
    'pn_transport_capacity', 'pn_transport_push', 'pn_transport_pending', 'pn_transport_head',
    'pn_collector_peek', 'pn_collector_pop', 'pn_event_type',
    'pn_event_delivery', 'pn_delivery_link', 'pn_link_is_sender', 'pn_transport_tail',
    'pn_transport_process',
)  # fmt: skip
_proton_library = ctypes.CDLL(cproton_ffi.__file__)
"""The binding's module, loaded already: opening its path again returns the same library, whose
every ``pn_*`` symbol is exported, including those its cffi declarations leave out
(``pn_transport_head``)."""
_addresses = _wire.ffi.new(
    'void *[]',
    [
        _wire.ffi.cast('void *', ctypes.cast(getattr(_proton_library, name), ctypes.c_void_p).value)
        for name in WIRE_FUNCTIONS
    ],
)
wire: Any = _wire.lib
"""The C calls of amqp/_wire.c; proton pointers from ``lib`` pass as they are."""
_bound = wire.shoal_bind(_addresses, len(WIRE_FUNCTIONS), lib.PN_DELIVERY)
if _bound != 0:  # pragma: no cover - a build mismatch
    raise ImportError('shoal_broker.amqp._wire was built for another list of proton functions')

# shoal_pending's answers other than a size
IN_ABORTED: Final = -1
IN_TOO_BIG: Final = -2
IN_PARTIAL: Final = -3


RECEIVE_BUFFER_BYTES: Final = 256 * 1024
"""Messages up to this size are read into one buffer the loop reuses; a bigger one gets its own
(uncleared) memory. Either way, what routing keeps is sliced out of it as ``bytes``."""
_SCAN_IN_PYTHON: Final = 1  # shoal_scan and shoal_receive verdicts
_RECEIVED_SETTLED: Final = 2
_RECEIVED_SHORT: Final = 4
_TRANSACTIONAL: Final = 8
_receive_buffer = _wire.ffi.new('char[]', RECEIVE_BUFFER_BYTES)
_uncleared = _wire.ffi.new_allocator(should_clear_after_alloc=False)
OFFSETS: Final = 12
"""The section offsets shoal_scan writes (``OUT_SIZE`` in amqp/_wire.c; ``codec.view``'s ``at``)."""
_offsets = _wire.ffi.new('int64_t[]', OFFSETS)
_unpack = _wire.ffi.unpack
EVENT_SLOTS: Final = _wire.ffi.new('void *[]', 2)
"""Where ``wire.shoal_next_event`` puts an event's pointers. Every connection's loop shares it:
they are read out before anything else runs."""
ACCEPTS_CAP: Final = 256
ACCEPTS: Final = _wire.ffi.new('void *[]', 2 * ACCEPTS_CAP)
"""Where ``wire.shoal_next_event`` puts the consumers' plain accepts it settled on its way to the
next event: (delivery, link) pairs, ``ACCEPTS_TAKEN[0]`` of them. Shared like ``EVENT_SLOTS``."""
ACCEPTS_TAKEN: Final = _wire.ffi.new('size_t[1]')
ACCEPTS_FULL: Final = -1
"""``wire.shoal_next_event``'s answer when ``ACCEPTS`` filled up before the next event."""
_buffer = _wire.ffi.buffer


def receive(link: Ptr, delivery: Ptr, size: int) -> tuple[Any | None, list[int] | None, bool, bool]:
    """Read a complete message of ``size`` bytes (``wire.shoal_pending``) and advance the link.

    Returns the message as a buffer whose slices are ``bytes`` (valid until the next receive;
    None if proton gave fewer bytes than it said it held), the section offsets ``codec.view``
    takes (None when ``codec.parse`` must walk it instead), whether the peer sent it settled,
    and whether it is sent inside a transaction."""
    memory = _receive_buffer if size <= RECEIVE_BUFFER_BYTES else _uncleared('char[]', size)
    verdict = wire.shoal_receive(link, delivery, memory, size, _offsets)
    settled, transactional = bool(verdict & _RECEIVED_SETTLED), bool(verdict & _TRANSACTIONAL)
    if verdict & _RECEIVED_SHORT:  # what follows in memory is not this message's
        return None, None, settled, transactional
    offsets = None if verdict & _SCAN_IN_PYTHON else _unpack(_offsets, OFFSETS)
    return _buffer(memory, size), offsets, settled, transactional


READ_BUFFER_BYTES: Final = 256 * 1024
_read_buffer = _wire.ffi.new('char[]', READ_BUFFER_BYTES)
READ_BUFFER: Final = _wire.ffi.buffer(_read_buffer)
"""Where a connection's read goes when not into its engine (``read_room``): every connection's
loop shares it, since a read is handed over before any other runs (``push_read``)."""
DIRECT_READ_BYTES: Final = 64 * 1024
"""A read goes straight into the engine's input buffer when it has room for this many bytes:
once a frame bigger than that is on its way, proton has grown the buffer to hold it, and a big
message no longer crosses a buffer of ours and the event loop's ``bytes`` first. Below it, one
read of up to ``READ_BUFFER_BYTES`` into the shared buffer, then pushed in, beats many small
reads (proton starts with 8 KiB of room)."""
_tail = _wire.ffi.new('char *[1]')


def read_room(transport: Ptr) -> Any | None:
    """The engine's own input buffer as a writable buffer, when it has room for
    ``DIRECT_READ_BYTES`` or more; None otherwise (read into ``READ_BUFFER``, then
    ``push_read``). Bytes read into it are handed over with ``wire.shoal_input_read``."""
    room = wire.shoal_input(transport, _tail)
    return _buffer(_tail[0], room) if room >= DIRECT_READ_BYTES else None


def push_read(transport: Ptr, size: int) -> None:
    """The first ``size`` bytes of ``READ_BUFFER`` into the engine (in slices of its room)."""
    wire.shoal_push(transport, _read_buffer, size)


OUTPUT_MOST_BYTES: Final = 4 * 1024 * 1024
"""The most ``take_output`` takes at once. proton's output buffer then holds at most twice this
(amqp/_wire.c's ``shoal_output``): a connection with that much to write (a consumer far behind,
whose peer sets no max-frame-size) keeps no more than 8 MiB of it there, beside the frames it
encoded, where 256 KiB pieces kept it at 512 KiB."""
_output_head = _wire.ffi.new('const char *[1]')
_pop = lib.pn_transport_pop


def take_output(transport: Ptr) -> bytes | None:
    """What the engine has to write, up to ``OUTPUT_MOST_BYTES``, moved out of it in one copy;
    None when there is none (or its output side has closed: ``pn_transport_pending`` then says
    which)."""
    size = wire.shoal_output(transport, _output_head, OUTPUT_MOST_BYTES)
    if size <= 0:
        return None
    output: bytes = _unpack(_output_head[0], size)
    _pop(transport, size)
    return output


def scan(message: bytes) -> list[int] | None:
    """The section offsets ``codec.view`` takes, as ``receive`` finds them, or None where
    ``codec.parse`` must walk the message itself (the fuzz harness and tests compare the two)."""
    if wire.shoal_scan(message, len(message), _offsets):
        return None
    return _unpack(_offsets, OFFSETS)  # type: ignore[no-any-return]


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
