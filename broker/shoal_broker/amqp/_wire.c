/*
 * The per-message engine work in C: a transfer out, a transfer in, a consumer's outcome, the walk
 * over a received message's sections, the next engine event, and the bytes between the socket
 * and the engine.
 *
 * Why: in Python each of these was 5-10 calls through cffi plus the byte-level walk; here each is
 * one call, and the broker's CPU per message fell by a fifth (docs/performance.md#c-hot-path).
 * Everything that decides anything (routing, outcomes, caches, errors) stays in Python; this file
 * only moves bytes, reads flags and hands over the next event.
 *
 * proton's functions are not linked: python-qpid-proton's cffi module holds them (it exports
 * every pn_* symbol, but is loaded privately), so amqp/engine.py looks their addresses up by
 * name in that loaded library and hands them to shoal_bind() once.
 *
 * Built by scripts/build_wire.py (cffi, API mode) when the package is installed.
 */
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "_wire.h"
#include "_wire_outcomes.h" /* generated from amqp/outcome_codes.py */

typedef struct { size_t size; const char *start; } shoal_bytes_t; /* proton's pn_bytes_t */

static void *(*pn_delivery)(void *link, shoal_bytes_t tag);
static ssize_t (*pn_link_send)(void *link, const char *bytes, size_t n);
static ssize_t (*pn_link_recv)(void *link, char *bytes, size_t n);
static bool (*pn_link_advance)(void *link);
static void (*pn_delivery_settle)(void *delivery);
static size_t (*pn_delivery_pending)(void *delivery);
static bool (*pn_delivery_partial)(void *delivery);
static bool (*pn_delivery_aborted)(void *delivery);
static bool (*pn_delivery_settled)(void *delivery);
static bool (*pn_delivery_updated)(void *delivery);
static uint64_t (*pn_delivery_remote_state)(void *delivery);
static void *(*pn_delivery_remote)(void *delivery);
static bool (*pn_disposition_is_failed)(void *disposition);
static bool (*pn_disposition_is_undeliverable)(void *disposition);
static void (*pn_delivery_update)(void *delivery, uint64_t state);
static ssize_t (*pn_transport_capacity)(void *transport);
static ssize_t (*pn_transport_push)(void *transport, const char *bytes, size_t n);
static ssize_t (*pn_transport_pending)(void *transport);
static const char *(*pn_transport_head)(void *transport);
static char *(*pn_transport_tail)(void *transport);
static int (*pn_transport_process)(void *transport, size_t n);
static void *(*pn_collector_peek)(void *collector);
static bool (*pn_collector_pop)(void *collector);
static int (*pn_event_type)(void *event);
static void *(*pn_event_delivery)(void *event);
static void *(*pn_delivery_link)(void *delivery);
static bool (*pn_link_is_sender)(void *link);

#define FUNCTIONS 27
static int delivery_event; /* PN_DELIVERY's value in proton's pn_event_type_t */

static void init_layout(void);

/* The order of amqp/engine.py's WIRE_FUNCTIONS. */
int shoal_bind(void *const *f, size_t count, int delivery)
{
    if (count != FUNCTIONS)
        return -1;
    pn_delivery = f[0];
    pn_link_send = f[1];
    pn_link_recv = f[2];
    pn_link_advance = f[3];
    pn_delivery_settle = f[4];
    pn_delivery_pending = f[5];
    pn_delivery_partial = f[6];
    pn_delivery_aborted = f[7];
    pn_delivery_settled = f[8];
    pn_delivery_updated = f[9];
    pn_delivery_remote_state = f[10];
    pn_delivery_remote = f[11];
    pn_disposition_is_failed = f[12];
    pn_disposition_is_undeliverable = f[13];
    pn_delivery_update = f[14];
    pn_transport_capacity = f[15];
    pn_transport_push = f[16];
    pn_transport_pending = f[17];
    pn_transport_head = f[18];
    pn_collector_peek = f[19];
    pn_collector_pop = f[20];
    pn_event_type = f[21];
    pn_event_delivery = f[22];
    pn_delivery_link = f[23];
    pn_link_is_sender = f[24];
    pn_transport_tail = f[25];
    pn_transport_process = f[26];
    delivery_event = delivery;
    init_layout();
    return 0;
}

/* -- events ------------------------------------------------------------------------------- */

#define ACCEPTS_FULL -1

/* The connection's next engine event, once the one before it is popped (``pop_first``): its type,
 * 0 (PN_EVENT_NONE) when there is none, or ACCEPTS_FULL when ``accepted`` filled up first (call
 * again without popping). out[0] is the event; for a delivery's event (two of every message's)
 * out[0] is the delivery and out[1] its link instead. One call where the loop made five. The
 * event stays in the collector, and so holds its delivery, until the next call.
 *
 * A consumer's plain accept, the most common event of all (one per at-least-once delivery: four
 * per message fanned out to four subscriptions), does not come back as an event: a delivery on
 * one of our sending links whose peer's state is accepted is settled here and appended, with its
 * link, to ``accepted`` (pairs, at most ``cap`` of them; *taken says how many), and the walk goes
 * on. Python applies them (acks, counts) before the event returned, so they keep their place
 * among the connection's events. Every other outcome, and anything transactional, comes back
 * as its event. */
int shoal_next_event(void *collector, int pop_first, void **out, void **accepted, size_t cap,
                     size_t *taken)
{
    size_t n = 0;
    if (pop_first)
        pn_collector_pop(collector);
    for (;;) {
        void *event = pn_collector_peek(collector);
        if (!event) {
            *taken = n;
            return 0;
        }
        int type = pn_event_type(event);
        if (type != delivery_event) {
            out[0] = event;
            out[1] = NULL;
            *taken = n;
            return type;
        }
        void *delivery = pn_event_delivery(event);
        void *link = pn_delivery_link(delivery);
        if (!pn_link_is_sender(link) || pn_delivery_remote_state(delivery) != PN_ACCEPTED ||
            !(pn_delivery_updated(delivery) || pn_delivery_settled(delivery))) {
            out[0] = delivery;
            out[1] = link;
            *taken = n;
            return type;
        }
        pn_delivery_settle(delivery); /* the pointer is only a key from here on */
        accepted[2 * n] = delivery;
        accepted[2 * n + 1] = link;
        n++;
        pn_collector_pop(collector);
        if (n == cap) {
            *taken = n;
            return ACCEPTS_FULL;
        }
    }
}

/* -- bytes between the socket and the engine ---------------------------------------------- */

/* Peer input into the transport, in the slices its capacity allows (pn_transport_push takes at
 * most that). How many bytes it took: fewer once it wants no more input (an error or a close). */
size_t shoal_push(void *transport, const char *data, size_t size)
{
    size_t offset = 0;
    while (offset < size) {
        ssize_t capacity = pn_transport_capacity(transport);
        if (capacity <= 0)
            break;
        size_t chunk = (size_t)capacity < size - offset ? (size_t)capacity : size - offset;
        pn_transport_push(transport, data + offset, chunk);
        offset += chunk;
    }
    return offset;
}

/* Where the engine takes input in place: how many bytes it has room for (pn_transport_capacity's
 * answer, negative once its input side has closed) and, when it has room, where (``*tail``,
 * valid until the transport is next used). A read into it is then shoal_input_read's. */
ssize_t shoal_input(void *transport, char **tail)
{
    ssize_t capacity = pn_transport_capacity(transport);
    if (capacity > 0)
        *tail = pn_transport_tail(transport);
    return capacity;
}

/* ``size`` bytes read into the engine's tail (shoal_input) handed to it. */
void shoal_input_read(void *transport, size_t size)
{
    pn_transport_process(transport, size);
}

/* The engine's output, in place: how many bytes to take, at most ``cap`` (pn_transport_pending's
 * answer: 0 when none, negative once the output side has closed) and, when there are some, where
 * they start (``*head``, valid until the transport is next used). The caller copies them out
 * once and pops them: pn_transport_pop moves what it leaves to the front of the buffer, which a
 * big transfer taken 256 KiB at a time paid at every piece.
 *
 * proton grows the buffer, doubling, each time output is asked for while it is full, and a pop
 * that empties it asks: so a run of big transfers soon leaves a frame at a time, and the buffer
 * holds at most twice ``cap`` (a take below the cap empties it; one at the cap does not). */
ssize_t shoal_output(void *transport, const char **head, size_t cap)
{
    ssize_t pending = pn_transport_pending(transport);
    if (pending <= 0)
        return pending;
    *head = pn_transport_head(transport);
    return (size_t)pending < cap ? pending : (ssize_t)cap;
}

/* -- out ---------------------------------------------------------------------------------- */

/* One transfer: a new delivery tagged with ``tag`` (8 bytes, little-endian, as before), the
 * header then the rest of the message, and the link advanced. A presettled delivery is settled
 * at once and NULL returned: nothing may refer to it afterwards. */
void *shoal_send(void *link, uint64_t tag, const char *header, size_t header_size,
                 const char *rest, size_t rest_size, int settle)
{
    char tag_bytes[8];
    for (int i = 0; i < 8; i++)
        tag_bytes[i] = (char)(tag >> (8 * i));
    shoal_bytes_t t = {8, tag_bytes};
    void *delivery = pn_delivery(link, t);
    if (header_size)
        pn_link_send(link, header, header_size);
    if (rest_size)
        pn_link_send(link, rest, rest_size);
    pn_link_advance(link);
    if (settle) {
        pn_delivery_settle(delivery);
        return NULL;
    }
    return delivery;
}

/* An outcome chosen by the broker for a peer's transfer: set and settled. */
void shoal_settle_with(void *delivery, uint64_t state)
{
    pn_delivery_update(delivery, state);
    pn_delivery_settle(delivery);
}

/* -- in ----------------------------------------------------------------------------------- */

#define IN_ABORTED -1
#define IN_TOO_BIG -2
#define IN_PARTIAL -3

/* What a delivery event on a receiving link holds: the size of a complete message, or why there
 * is nothing to read yet (the checks in the order the broker makes them). */
int64_t shoal_pending(void *delivery, int64_t max_size)
{
    if (pn_delivery_aborted(delivery))
        return IN_ABORTED;
    size_t pending = pn_delivery_pending(delivery);
    if ((int64_t)pending > max_size)
        return IN_TOO_BIG;
    if (pn_delivery_partial(delivery))
        return IN_PARTIAL;
    return (int64_t)pending;
}

/* -- the section walk (codec.parse's loop; amqp/codec.py is the reference) ----------------- */

#define MAX_DEPTH 64
#define L_INVALID 0
#define L_DESCRIBED -1
#define L_SIZE1 -2
#define L_SIZE4 -5

static signed char layout[256]; /* filled by shoal_bind: until then every byte is invalid */

static void init_layout(void)
{
    static const unsigned char valid[] = {
        0x00, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56,
        0x60, 0x61, 0x70, 0x71, 0x72, 0x73, 0x74, 0x80, 0x81, 0x82, 0x83, 0x84, 0x94, 0x98,
        0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3, 0xC0, 0xC1, 0xD0, 0xD1, 0xE0, 0xF0};
    static const int fixed[16] = {-1, -1, -1, -1, 0, 1, 2, 4, 8, 16, -1, -1, -1, -1, -1, -1};
    for (size_t i = 0; i < sizeof valid; i++) {
        unsigned char code = valid[i];
        int family = code >> 4;
        if (code == 0x00)
            layout[code] = L_DESCRIBED;
        else if (fixed[family] >= 0)
            layout[code] = (signed char)(1 + fixed[family]);
        else if (family == 0xA || family == 0xC || family == 0xE)
            layout[code] = L_SIZE1;
        else
            layout[code] = L_SIZE4;
    }
}

static int64_t skip(const unsigned char *b, int64_t n, int64_t pos, int depth)
{
    if (depth > MAX_DEPTH || pos >= n)
        return -1;
    int lay = layout[b[pos]];
    int64_t end;
    if (lay > 0) {
        end = pos + lay;
    } else if (lay == L_SIZE1) {
        if (pos + 1 >= n)
            return -1;
        end = pos + 2 + b[pos + 1];
    } else if (lay == L_SIZE4) {
        if (pos + 5 > n)
            return -1;
        end = pos + 5 + (((int64_t)b[pos + 1] << 24) | ((int64_t)b[pos + 2] << 16) |
                         ((int64_t)b[pos + 3] << 8) | (int64_t)b[pos + 4]);
    } else if (lay == L_DESCRIBED) {
        int64_t descriptor_end = skip(b, n, pos + 1, depth + 1);
        return descriptor_end < 0 ? -1 : skip(b, n, descriptor_end, depth + 1);
    } else {
        return -1;
    }
    return end > n ? -1 : end;
}

/* The end of the value at ``pos``, or -1 where codec.skip raises DecodeError. */
int64_t shoal_skip(const char *data, size_t size, size_t pos)
{
    return skip((const unsigned char *)data, (int64_t)size, (int64_t)pos, 0);
}

enum {
    OUT_HEADER_START, OUT_HEADER_END, OUT_HEADER_VALUE, OUT_REST_START, OUT_ANNOTATIONS_VALUE,
    OUT_ANNOTATIONS_END, OUT_TO, OUT_TO_END, OUT_EXPIRY, OUT_EXPIRY_END, OUT_GROUP, OUT_GROUP_END, OUT_SIZE
};

#define SCAN_OK 0
#define SCAN_IN_PYTHON 1 /* well-formed or not, codec.parse decides (and says why) */

/* The properties list's ``to`` (index 2), absolute-expiry-time (8) and group-id (10): where each
 * starts and ends, or -1 when absent or null. codec._list_items is the reference. */
static int scan_properties(const unsigned char *b, int64_t pos, int64_t end, int64_t *out)
{
    unsigned char code = b[pos];
    if (code == 0x45)
        return SCAN_OK;
    if (code != 0xC0 && code != 0xD0)
        return SCAN_IN_PYTHON;
    int64_t p, count;
    if (code == 0xD0) {
        if (pos + 9 > end)
            return SCAN_IN_PYTHON;
        p = pos + 9;
        count = ((int64_t)b[pos + 5] << 24) | (b[pos + 6] << 16) | (b[pos + 7] << 8) | b[pos + 8];
    } else {
        if (pos + 3 > end)
            return SCAN_IN_PYTHON;
        p = pos + 3;
        count = b[pos + 2];
    }
    for (int64_t index = 0; index < count && index <= 10; index++) {
        if (p >= end)
            return SCAN_IN_PYTHON;
        if (b[p] == 0x40) {
            p += 1;
            continue;
        }
        int64_t start = p;
        p = skip(b, end, p, 0);
        if (p < 0)
            return SCAN_IN_PYTHON;
        if (index == 2) {
            out[OUT_TO] = start;
            out[OUT_TO_END] = p;
        } else if (index == 8) {
            out[OUT_EXPIRY] = start;
            out[OUT_EXPIRY_END] = p;
        } else if (index == 10) {
            out[OUT_GROUP] = start;
            out[OUT_GROUP_END] = p;
        }
    }
    return SCAN_OK;
}

/* Where the parts routing needs lie (``OUT_*``), for a message whose sections all carry the
 * small-ulong descriptors every client we know writes; anything else goes to codec.parse. */
int shoal_scan(const char *data, size_t size, int64_t *out)
{
    const unsigned char *b = (const unsigned char *)data;
    int64_t n = (int64_t)size, pos = 0;
    int seen_properties = 0;
    for (int i = 0; i < OUT_SIZE; i++)
        out[i] = -1;
    while (pos < n) {
        if (pos + 2 >= n || b[pos] != 0x00 || b[pos + 1] != 0x53 || b[pos + 2] < 0x70 ||
            b[pos + 2] > 0x78)
            return SCAN_IN_PYTHON;
        unsigned char code = b[pos + 2];
        int64_t value = pos + 3;
        int64_t end = skip(b, n, value, 0);
        if (end < 0)
            return SCAN_IN_PYTHON;
        /* codec.parse decodes every header, annotations and properties section it meets; a
         * message repeating one (no client does) is left to it, errors and all */
        if (code == 0x70) { /* header */
            if (out[OUT_HEADER_START] >= 0)
                return SCAN_IN_PYTHON;
            out[OUT_HEADER_START] = pos;
            out[OUT_HEADER_END] = end;
            out[OUT_HEADER_VALUE] = value;
        } else if (code != 0x71) { /* all but delivery annotations are kept */
            if (out[OUT_REST_START] < 0)
                out[OUT_REST_START] = pos;
            if (code == 0x72) {
                if (out[OUT_ANNOTATIONS_VALUE] >= 0)
                    return SCAN_IN_PYTHON;
                out[OUT_ANNOTATIONS_VALUE] = value;
                out[OUT_ANNOTATIONS_END] = end;
            } else if (code == 0x73) {
                if (seen_properties++)
                    return SCAN_IN_PYTHON;
                if (scan_properties(b, value, end, out) != SCAN_OK)
                    return SCAN_IN_PYTHON;
            }
        }
        pos = end;
    }
    return SCAN_OK;
}

#define RECEIVED_SETTLED 2
#define RECEIVED_SHORT 4
#define RECEIVED_TRANSACTIONAL 8

/* A complete incoming message, ``shoal_pending`` bytes, read into ``data``, the link advanced
 * and the sections walked into ``out``: shoal_scan's verdict, plus RECEIVED_SETTLED if the peer
 * sent it settled, RECEIVED_TRANSACTIONAL if it is sent inside a transaction, and
 * RECEIVED_SHORT if proton gave fewer bytes than it said it held (never seen; ``data`` may hold
 * an earlier message's bytes past them, so it must not be read). */
int shoal_receive(void *link, void *delivery, char *data, size_t size, int64_t *out)
{
    ssize_t got = pn_link_recv(link, data, size);
    pn_link_advance(link);
    int flags = pn_delivery_settled(delivery) ? RECEIVED_SETTLED : 0;
    if (pn_delivery_remote_state(delivery) == TRANSACTIONAL_STATE)
        flags |= RECEIVED_TRANSACTIONAL;
    if (got != (ssize_t)size)
        return SCAN_IN_PYTHON | RECEIVED_SHORT | flags;
    return shoal_scan(data, size, out) | flags;
}

/* -- a consumer's outcome ------------------------------------------------------------------ */

/* The codes (OUTCOME_*, PN_*, SHOAL_OUTCOMES) come from the table in amqp/outcome_codes.py. */

/* The peer's outcome for one of our transfers: settled here unless it is transactional or
 * not final yet. A settlement with no outcome counts as accepted (the peer is done with it). */
int shoal_outcome(void *delivery)
{
    bool settled = pn_delivery_settled(delivery);
    if (!pn_delivery_updated(delivery) && !settled)
        return OUTCOME_NONE;
    uint64_t state = pn_delivery_remote_state(delivery);
    int outcome;
    switch (state) {
    case TRANSACTIONAL_STATE:
        return OUTCOME_TRANSACTIONAL;
#define OUTCOME_CASE(descriptor, code)                                                            \
    case descriptor:                                                                              \
        outcome = code;                                                                           \
        break;
        SHOAL_OUTCOMES(OUTCOME_CASE)
#undef OUTCOME_CASE
    default:
        if (!settled)
            return OUTCOME_NONE;
        outcome = OUTCOME_ACCEPTED;
    }
    if (outcome == OUTCOME_MODIFIED) {
        void *remote = pn_delivery_remote(delivery);
        if (pn_disposition_is_failed(remote))
            outcome |= MODIFIED_FAILED;
        if (pn_disposition_is_undeliverable(remote))
            outcome |= MODIFIED_UNDELIVERABLE;
    }
    pn_delivery_settle(delivery);
    return outcome;
}
