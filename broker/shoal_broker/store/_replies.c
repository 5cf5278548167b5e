/*
 * The store lane's replies read in C: where each reply ends in the bytes Redis sent (Scanner),
 * and the entries of a plain XREADGROUP of one stream made straight from its bytes (entries).
 *
 * Why: a subscription fetching in bulk reads its new entries with a plain XREADGROUP, and
 * hiredis turned each entry of that reply into two lists and eight objects, which
 * store/replies.py's new_entries then turned into an Entry: ~0.6 us an entry, and the lists were
 * what the young collections examined while replies waited for the rest of their pipeline.
 * Fanned out to 1 000 subscriptions that is every delivery (docs/performance.md, "Entries read
 * in C"). Here an entry costs its Entry, its id and the two byte strings, none of them tracked by
 * the collector. Every other reply still goes through the connection's hiredis reader, which
 * redis-py set up with its own error classes: the lane feeds it one reply at a time, as far as
 * the Scanner says the reply goes, so that the lane always knows which reply comes next. An
 * entries reply not all there yet is gathered until it is (store/reply_reader.py); one of another
 * shape goes to hiredis as well.
 *
 * Built with the broker's C hot path (scripts/build_wire.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_entry_api.h"

static ShoalEntryAPI *entry_api;
static PyObject *short_reply; /* entries()'s answer for a reply that goes on past the data */

/* The bytes of `data` (bytes or bytearray) and their number; NULL with TypeError otherwise. */
static const char *bytes_of(PyObject *data, Py_ssize_t *size)
{
    if (PyBytes_Check(data)) {
        *size = PyBytes_GET_SIZE(data);
        return PyBytes_AS_STRING(data);
    }
    if (PyByteArray_Check(data)) {
        *size = PyByteArray_GET_SIZE(data);
        return PyByteArray_AS_STRING(data);
    }
    PyErr_SetString(PyExc_TypeError, "data must be bytes or bytearray");
    return NULL;
}

/* data, start and end of a call: the data's bytes, with 0 <= start <= end <= len(data). */
static const char *span_of(PyObject *const *args, Py_ssize_t *start, Py_ssize_t *end)
{
    Py_ssize_t size;
    const char *data = bytes_of(args[0], &size);
    if (data == NULL)
        return NULL;
    *start = PyLong_AsSsize_t(args[1]);
    *end = PyLong_AsSsize_t(args[2]);
    if ((*start == -1 || *end == -1) && PyErr_Occurred())
        return NULL;
    if (*start < 0 || *end > size || *start > *end) {
        PyErr_SetString(PyExc_IndexError, "start and end out of the data");
        return NULL;
    }
    return data;
}

/* -- where a reply ends ----------------------------------------------------------------------- */

#define MAX_DEPTH 64  /* nested aggregates: Redis's own replies nest a few deep */
#define MAX_DIGITS 18 /* a length or count past this is not a reply but a broken stream */

enum phase { TYPE, LINE, NUMBER, PAYLOAD, CR, LF };

typedef struct {
    PyObject_HEAD
    PyObject *error;        /* the exception type a broken stream raises */
    enum phase phase;
    char kind;              /* the type byte of the line being read (NUMBER) */
    int negative, digits;   /* of the number being read */
    long long number;
    long long skip;         /* bytes of a bulk payload still to pass (PAYLOAD) */
    int line_cr;            /* the last byte of the line read so far was CR */
    int depth;              /* aggregates open */
    long long left[MAX_DEPTH]; /* elements still to come in each */
} Scanner;

static void scanner_reset(Scanner *self)
{
    self->phase = TYPE;
    self->depth = 0;
    self->line_cr = 0;
}

/* An element ended: count it in the aggregates that hold it. True once the reply is whole. */
static int element_done(Scanner *self)
{
    while (self->depth > 0) {
        if (--self->left[self->depth - 1] > 0)
            return 0;
        self->depth--;
    }
    return 1;
}

static PyObject *broken(Scanner *self, const char *what, char byte)
{
    PyErr_Format(self->error, "Protocol error: %s (byte 0x%02x)", what, (unsigned char)byte);
    return NULL;
}

/* scan(data, start, end): pass over data[start:end], the continuation of what earlier calls
 * passed over. The offset just past the end of the reply when it ends there, -1 when it goes
 * on past `end` (the scanner keeps its place). */
static PyObject *scanner_scan(Scanner *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(data, start, end)");
        return NULL;
    }
    Py_ssize_t start, end;
    const char *data = span_of(args, &start, &end);
    if (data == NULL)
        return NULL;
    const char *p = data + start, *stop = data + end;
    while (p < stop) {
        switch (self->phase) {
        case TYPE: {
            char c = *p++;
            switch (c) {
            case '+': case '-': case ':': case '_': case ',': case '#': case '(':
                self->phase = LINE;
                self->line_cr = 0;
                break;
            case '$': case '!': case '=': case '*': case '%': case '~': case '>': case '|':
                self->phase = NUMBER;
                self->kind = c;
                self->negative = self->digits = 0;
                self->number = 0;
                self->line_cr = 0;
                break;
            default:
                return broken(self, "unknown type", c);
            }
            break;
        }
        case LINE: { /* up to CRLF: as for hiredis, a lone CR or LF is part of the line */
            const char *lf = memchr(p, '\n', (size_t)(stop - p));
            if (lf == NULL) {
                self->line_cr = stop[-1] == '\r';
                p = stop;
                break;
            }
            int ended = lf > p ? lf[-1] == '\r' : self->line_cr;
            p = lf + 1;
            self->line_cr = 0;
            if (!ended)
                break;
            self->phase = TYPE;
            if (element_done(self))
                goto whole;
            break;
        }
        case NUMBER: {
            char c = *p++;
            if (self->line_cr) {
                if (c != '\n')
                    return broken(self, "CR without LF", c);
                long long n = self->negative ? -self->number : self->number;
                if (self->digits == 0)
                    return broken(self, "a length without digits", c);
                if (n < -1 || (self->negative && n == 0)) /* as hiredis: -1 (null) only */
                    return broken(self, "a negative length", c);
                self->phase = TYPE;
                if (self->kind == '$' || self->kind == '!' || self->kind == '=') {
                    if (n >= 0) {
                        self->phase = PAYLOAD;
                        self->skip = n;
                    } else if (element_done(self)) {
                        goto whole;
                    }
                } else {
                    /* a map's and an attribute's elements are pairs; hiredis hands an
                     * attribute back as a reply of its own, so it is one here as well */
                    long long elements = self->kind == '%' || self->kind == '|' ? 2 * n : n;
                    if (elements > 0) {
                        if (self->depth == MAX_DEPTH)
                            return broken(self, "aggregates nested too deep", c);
                        self->left[self->depth++] = elements;
                    } else if (element_done(self)) {
                        goto whole;
                    }
                }
            } else if (c == '\r') {
                self->line_cr = 1;
            } else if (c == '-' && self->digits == 0 && !self->negative) {
                self->negative = 1;
            } else if (c >= '0' && c <= '9' && self->digits < MAX_DIGITS
                       && !(self->digits == 1 && self->number == 0)) { /* no leading zero */
                self->number = self->number * 10 + (c - '0');
                self->digits++;
            } else {
                return broken(self, "a bad length", c);
            }
            break;
        }
        case PAYLOAD: {
            long long here = stop - p;
            if (self->skip > here) {
                self->skip -= here;
                p = stop;
                break;
            }
            p += self->skip;
            self->phase = CR;
            break;
        }
        case CR:
            if (*p++ != '\r')
                return broken(self, "a bulk string not ended by CRLF", p[-1]);
            self->phase = LF;
            break;
        case LF:
            if (*p++ != '\n')
                return broken(self, "a bulk string not ended by CRLF", p[-1]);
            self->phase = TYPE;
            if (element_done(self))
                goto whole;
            break;
        }
    }
    return PyLong_FromLong(-1);
whole:
    scanner_reset(self);
    return PyLong_FromSsize_t(p - data);
}

static PyObject *scanner_midway(Scanner *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->phase != TYPE || self->depth > 0);
}

static PyObject *scanner_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *error;
    if (PyTuple_GET_SIZE(args) != 1 || (kwargs && PyDict_GET_SIZE(kwargs))
        || !PyExceptionClass_Check(error = PyTuple_GET_ITEM(args, 0))) {
        PyErr_SetString(PyExc_TypeError, "Scanner(error): the exception type a broken stream "
                                         "raises");
        return NULL;
    }
    Scanner *self = (Scanner *)type->tp_alloc(type, 0);
    if (self != NULL) {
        Py_INCREF(error);
        self->error = error;
        scanner_reset(self);
    }
    return (PyObject *)self;
}

static void scanner_dealloc(Scanner *self)
{
    Py_XDECREF(self->error);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef scanner_methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scanner_scan, METH_FASTCALL,
     "scan(data, start, end): the offset past the reply's end if it ends in data[start:end], "
     "else -1 (the place is kept for the next call)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef scanner_getset[] = {
    {"midway", (getter)scanner_midway, NULL, "Part of a reply has been passed over.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal_broker.store._replies.Scanner",
    .tp_doc = "Where each reply of a Redis connection ends, read as the bytes come.",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = scanner_new,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
    .tp_getset = scanner_getset,
};

/* -- the entries of a plain XREADGROUP -------------------------------------------------------- */

enum { FOUND = 0, SHORT = -1, OTHER = -2, FAILED = -3 };
/* FOUND: read, and moved past. SHORT: the reply goes on past the data. OTHER: not the shape
 * read here. FAILED: out of memory, the exception set. */

/* A line "<kind><number>\r\n" at *p: its number, *p moved past it. */
static int read_number(const char **p, const char *stop, char kind, long long *out)
{
    const char *q = *p;
    if (q >= stop)
        return SHORT;
    if (*q != kind)
        return OTHER;
    q++;
    int negative = 0, digits = 0;
    long long n = 0;
    if (q < stop && *q == '-') {
        negative = 1;
        q++;
    }
    while (q < stop && *q >= '0' && *q <= '9') {
        if (++digits > MAX_DIGITS || (digits == 2 && n == 0)) /* hiredis: no leading zero */
            return OTHER;
        n = n * 10 + (*q++ - '0');
    }
    if (stop - q < 2)
        return SHORT;
    if (digits == 0 || q[0] != '\r' || q[1] != '\n' || (negative && n != 1))
        return OTHER;
    *p = q + 2;
    *out = negative ? -n : n;
    return FOUND;
}

/* A bulk string at *p: where its bytes start and how many, *p moved past it. */
static int read_bulk(const char **p, const char *stop, const char **start, Py_ssize_t *size)
{
    const char *q = *p;
    long long n;
    int found = read_number(&q, stop, '$', &n);
    if (found != FOUND)
        return found;
    if (n < 0)
        return OTHER;
    if (stop - q < n + 2)
        return SHORT;
    if (q[n] != '\r' || q[n + 1] != '\n')
        return OTHER;
    *start = q;
    *size = (Py_ssize_t)n;
    *p = q + n + 2;
    return FOUND;
}

/* The last origin and group read, kept: a topic's entries mostly come from one connection. */
static PyObject *last_origin, *last_group;

static PyObject *text(PyObject **last, const char *start, Py_ssize_t size)
{
    if (*last != NULL) {
        Py_ssize_t had;
        const char *was = PyUnicode_AsUTF8AndSize(*last, &had);
        if (was != NULL && had == size && memcmp(was, start, (size_t)size) == 0) {
            Py_INCREF(*last);
            return *last;
        }
        PyErr_Clear();
    }
    PyObject *made = PyUnicode_DecodeUTF8(start, size, "strict");
    if (made != NULL) {
        Py_INCREF(made);
        Py_XSETREF(*last, made);
    }
    return made;
}

static PyObject *empty_text;

static PyObject *empty(void)
{
    Py_INCREF(empty_text);
    return empty_text;
}

static int is_name(const char *start, Py_ssize_t size, char name)
{
    return size == 1 && start[0] == name;
}

/* One entry, "*2" then its id and "*<2k>" fields, as append_entries.lua writes them: h and r
 * first, then x (expiry), c (origin) and g (group) where present. A new Entry in *entry. */
static int read_entry(const char **p, const char *stop, PyObject *band, PyObject **entry)
{
    const char *q = *p, *id, *name, *value;
    Py_ssize_t id_size, name_size, value_size;
    long long pair, fields;
    int found;
    if ((found = read_number(&q, stop, '*', &pair)) != FOUND)
        return found;
    if (pair != 2)
        return OTHER;
    if ((found = read_bulk(&q, stop, &id, &id_size)) != FOUND)
        return found;
    if ((found = read_number(&q, stop, '*', &fields)) != FOUND)
        return found;
    if (fields < 4 || fields % 2)
        return OTHER;
    const char *header = NULL, *rest = NULL, *expiry = NULL, *origin = NULL, *group = NULL;
    Py_ssize_t header_size = 0, rest_size = 0, expiry_size = 0, origin_size = 0, group_size = 0;
    for (long long i = 0; i < fields; i += 2) {
        if ((found = read_bulk(&q, stop, &name, &name_size)) != FOUND)
            return found;
        if ((found = read_bulk(&q, stop, &value, &value_size)) != FOUND)
            return found;
        if (i == 0 || i == 2) {
            if (!is_name(name, name_size, i == 0 ? 'h' : 'r'))
                return OTHER;
            if (i == 0) {
                header = value;
                header_size = value_size;
            } else {
                rest = value;
                rest_size = value_size;
            }
        } else if (is_name(name, name_size, 'x')) {
            if (expiry != NULL)
                return OTHER; /* twice: new_entries reads each, and says what is wrong */
            expiry = value;
            expiry_size = value_size;
        } else if (is_name(name, name_size, 'c')) {
            if (origin != NULL)
                return OTHER;
            origin = value;
            origin_size = value_size;
        } else if (is_name(name, name_size, 'g')) {
            if (group != NULL)
                return OTHER;
            group = value;
            group_size = value_size;
        }
    }
    long long expiry_ms = 0;
    if (expiry != NULL) {
        const char *e = expiry, *end = expiry + expiry_size;
        int negative = e < end && *e == '-';
        e += negative;
        if (e == end || end - e > MAX_DIGITS)
            return OTHER;
        for (; e < end; e++) {
            if (*e < '0' || *e > '9')
                return OTHER;
            expiry_ms = expiry_ms * 10 + (*e - '0');
        }
        expiry_ms = negative ? -expiry_ms : expiry_ms;
    }
    PyObject *values[SHOAL_ENTRY_FIELDS] = {NULL};
    int made = 0;
    if ((values[made] = PyUnicode_DecodeASCII(id, id_size, "strict")) == NULL)
        goto failed;
    Py_INCREF(band);
    values[++made] = band;
    if ((values[++made] = PyBytes_FromStringAndSize(header, header_size)) == NULL)
        goto failed;
    if ((values[++made] = PyBytes_FromStringAndSize(rest, rest_size)) == NULL)
        goto failed;
    if ((values[++made] = PyLong_FromLongLong(expiry_ms)) == NULL)
        goto failed;
    if ((values[++made] = PyLong_FromLong(0)) == NULL)
        goto failed;
    values[++made] = origin != NULL ? text(&last_origin, origin, origin_size) : empty();
    if (values[made] == NULL)
        goto failed;
    values[++made] = group != NULL ? text(&last_group, group, group_size) : empty();
    if (values[made] == NULL)
        goto failed;
    if ((*entry = entry_api->steal(values)) == NULL)
        return FAILED;
    *p = q;
    return FOUND;
failed:
    while (made > 0)
        Py_XDECREF(values[--made]);
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear(); /* left to hiredis and new_entries, which say what is wrong with it */
        return OTHER;
    }
    return FAILED;
}

/* What a read of the reply's beginning says: go on (FOUND), or answer the caller. */
static PyObject *answer(int read)
{
    if (read == SHORT) {
        Py_INCREF(short_reply);
        return short_reply;
    }
    Py_RETURN_NONE; /* OTHER */
}

/* entries(data, start, end, band): the entries of the XREADGROUP reply at data[start:end] and
 * the offset past it; SHORT when the reply goes on past `end`; None when it is not that shape
 * (an error, a reply of more than one stream, fields not as append_entries.lua writes them). */
static PyObject *entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyLong_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "entries(data, start, end, band: int)");
        return NULL;
    }
    Py_ssize_t start, end;
    const char *data = span_of(args, &start, &end);
    if (data == NULL)
        return NULL;
    const char *p = data + start, *stop = data + end, *name;
    Py_ssize_t name_size;
    long long count;
    int read;
    if (p == stop)
        return answer(SHORT);
    if (*p == '_') { /* RESP3 null: no entries */
        if (stop - p < 3)
            return answer(SHORT);
        if (p[1] != '\r' || p[2] != '\n')
            return answer(OTHER);
        PyObject *none = PyList_New(0);
        return none == NULL ? NULL : Py_BuildValue("(Nn)", none, (Py_ssize_t)(p + 3 - data));
    }
    if (*p == '%') { /* RESP3: a map of one stream to its entries */
        if ((read = read_number(&p, stop, '%', &count)) != FOUND || count != 1)
            return answer(read == FOUND ? OTHER : read);
    } else { /* RESP2: an array of one [stream, entries] pair, or a null array */
        if ((read = read_number(&p, stop, '*', &count)) != FOUND)
            return answer(read);
        if (count == -1) {
            PyObject *none = PyList_New(0);
            return none == NULL ? NULL : Py_BuildValue("(Nn)", none, (Py_ssize_t)(p - data));
        }
        if (count != 1)
            return answer(OTHER);
        if ((read = read_number(&p, stop, '*', &count)) != FOUND || count != 2)
            return answer(read == FOUND ? OTHER : read);
    }
    if ((read = read_bulk(&p, stop, &name, &name_size)) != FOUND)
        return answer(read);
    if ((read = read_number(&p, stop, '*', &count)) != FOUND || count < 0)
        return answer(read == FOUND ? OTHER : read);
    if (count > (stop - p) / 8) /* each entry takes more than 8 bytes: not all there */
        return answer(SHORT);
    PyObject *found = PyList_New((Py_ssize_t)count);
    if (found == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)count; i++) {
        PyObject *entry;
        if ((read = read_entry(&p, stop, args[3], &entry)) != FOUND) {
            Py_DECREF(found); /* the entries made so far go with the list */
            return read == FAILED ? NULL : answer(read);
        }
        PyList_SET_ITEM(found, i, entry);
    }
    return Py_BuildValue("(Nn)", found, (Py_ssize_t)(p - data));
}

/* -- the module ------------------------------------------------------------------------------- */

static PyMethodDef functions[] = {
    {"entries", (PyCFunction)(void (*)(void))entries, METH_FASTCALL,
     "entries(data, start, end, band): ([Entry, ...], end of the reply) for the plain "
     "XREADGROUP reply at data[start:end]; SHORT if it goes on past end; None for a reply "
     "of another shape."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shoal_broker.store._replies",
    .m_doc = "The store lane's replies read in C: where each ends, and a plain XREADGROUP's "
             "entries.",
    .m_size = -1,
    .m_methods = functions,
};

PyMODINIT_FUNC PyInit__replies(void)
{
    if ((entry_api = shoal_entry_api_import()) == NULL)
        return NULL;
    if ((empty_text = PyUnicode_FromStringAndSize(NULL, 0)) == NULL)
        return NULL;
    if ((short_reply = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)) == NULL)
        return NULL;
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(short_reply);
    if (PyModule_AddObject(m, "SHORT", short_reply) < 0) {
        Py_DECREF(short_reply);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
