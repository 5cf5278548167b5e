/*
 * routing.storage.Entry as a C type the cyclic garbage collector does not track.
 *
 * Why: every delivery is an Entry, alive from its fetch to its settlement; fanned out to 1 000
 * subscriptions, 100 000 of them are in flight at once. As a slotted dataclass each one was
 * tracked by the collector and examined by young collections while it lived: the collector
 * was ~10 % of the broker's CPU in that row (docs/performance.md, "Entries the collector does
 * not track"). Its fields are only str, bytes and int, which cannot refer back to anything, so
 * an Entry can never be part of a cycle and needs no tracking. The setters keep it that way:
 * each field takes its exact type, and a subclass of it (or a bytearray or memoryview for the
 * bytes) is converted to it, so nothing that could hold a reference gets in.
 *
 * It behaves as the dataclass did: positional or keyword construction with origin and group
 * defaulting to '', fields readable and writable, equality by fields, no hash, and `key`.
 *
 * Built with the broker's C hot path (scripts/build_wire.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>

#include "_entry_api.h"

enum { ID, BAND, HEADER, REST, EXPIRY_MS, DELIVERY_COUNT, ORIGIN, GROUP, FIELDS };
enum kind { TEXT, NUMBER, BYTES };

static const char *const names[FIELDS] = {
    "id", "band", "header", "rest", "expiry_ms", "delivery_count", "origin", "group",
};
static const enum kind kinds[FIELDS] = {
    TEXT, NUMBER, BYTES, BYTES, NUMBER, NUMBER, TEXT, TEXT,
};
#define REQUIRED 6 /* origin and group may be left out: '' */

typedef ShoalEntryObject Entry;

_Static_assert(FIELDS == SHOAL_ENTRY_FIELDS, "_entry_api.h names the fields in this order");

static PyObject *empty_text; /* the default of origin and group */

/* A new reference to `value` as its field's exact type, or NULL with TypeError set. */
static PyObject *coerce(int field, PyObject *value)
{
    switch (kinds[field]) {
    case TEXT:
        if (PyUnicode_CheckExact(value)) {
            Py_INCREF(value);
            return value;
        }
        if (PyUnicode_Check(value))
            return PyUnicode_FromObject(value);
        break;
    case NUMBER:
        if (PyLong_CheckExact(value)) {
            Py_INCREF(value);
            return value;
        }
        if (PyLong_Check(value))
            return PyNumber_Long(value);
        break;
    case BYTES:
        if (PyBytes_CheckExact(value)) {
            Py_INCREF(value);
            return value;
        }
        if (PyBytes_Check(value) || PyByteArray_Check(value) || PyMemoryView_Check(value))
            return PyBytes_FromObject(value);
        break;
    }
    PyErr_Format(PyExc_TypeError, "Entry.%s must be %s, not %.100s", names[field],
                 kinds[field] == TEXT ? "str" : kinds[field] == NUMBER ? "int" : "bytes",
                 Py_TYPE(value)->tp_name);
    return NULL;
}

static void entry_dealloc(Entry *self)
{
    for (int i = 0; i < FIELDS; i++)
        Py_XDECREF(self->fields[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t given = PyTuple_GET_SIZE(args);
    if (given > FIELDS) {
        PyErr_Format(PyExc_TypeError, "Entry takes at most %d arguments (%zd given)", FIELDS,
                     given);
        return NULL;
    }
    Entry *self = (Entry *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < given; i++) {
        if ((self->fields[i] = coerce((int)i, PyTuple_GET_ITEM(args, i))) == NULL)
            goto fail;
    }
    if (kwargs != NULL) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kwargs, &pos, &key, &value)) {
            int field = -1;
            for (int i = 0; i < FIELDS; i++) {
                if (PyUnicode_Check(key) && PyUnicode_CompareWithASCIIString(key, names[i]) == 0)
                    field = i;
            }
            if (field < 0) {
                PyErr_Format(PyExc_TypeError, "Entry got an unexpected keyword argument '%S'",
                             key);
                goto fail;
            }
            if (self->fields[field] != NULL) {
                PyErr_Format(PyExc_TypeError, "Entry got multiple values for argument '%s'",
                             names[field]);
                goto fail;
            }
            if ((self->fields[field] = coerce(field, value)) == NULL)
                goto fail;
        }
    }
    for (int i = 0; i < FIELDS; i++) {
        if (self->fields[i] != NULL)
            continue;
        if (i < REQUIRED) {
            PyErr_Format(PyExc_TypeError, "Entry missing required argument '%s'", names[i]);
            goto fail;
        }
        Py_INCREF(empty_text);
        self->fields[i] = empty_text;
    }
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

/* Fields are read through member descriptors (the interpreter specialises those reads) and
 * written here, where the type is checked; the descriptors themselves are read-only. */
static int entry_setattro(PyObject *self, PyObject *name, PyObject *value)
{
    for (int i = 0; i < FIELDS; i++) {
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, names[i]) != 0)
            continue;
        if (value == NULL) {
            PyErr_Format(PyExc_AttributeError, "Entry.%s cannot be deleted", names[i]);
            return -1;
        }
        PyObject *stored = coerce(i, value);
        if (stored == NULL)
            return -1;
        Py_SETREF(((Entry *)self)->fields[i], stored);
        return 0;
    }
    return PyObject_GenericSetAttr(self, name, value);
}

static PyObject *entry_key(Entry *self, void *closure)
{
    (void)closure;
    return PyTuple_Pack(2, self->fields[BAND], self->fields[ID]);
}

static PyObject *entry_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(b) != Py_TYPE(a))
        Py_RETURN_NOTIMPLEMENTED;
    for (int i = 0; i < FIELDS; i++) {
        int same = PyObject_RichCompareBool(((Entry *)a)->fields[i], ((Entry *)b)->fields[i],
                                            Py_EQ);
        if (same < 0)
            return NULL;
        if (!same)
            return PyBool_FromLong(op == Py_NE);
    }
    return PyBool_FromLong(op == Py_EQ);
}

static PyObject *entry_repr(Entry *self)
{
    PyObject *parts = PyList_New(FIELDS);
    if (parts == NULL)
        return NULL;
    for (int i = 0; i < FIELDS; i++) {
        PyObject *part = PyUnicode_FromFormat("%s=%R", names[i], self->fields[i]);
        if (part == NULL) {
            Py_DECREF(parts);
            return NULL;
        }
        PyList_SET_ITEM(parts, i, part);
    }
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *inner = sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(parts);
    if (inner == NULL)
        return NULL;
    PyObject *text = PyUnicode_FromFormat("Entry(%U)", inner);
    Py_DECREF(inner);
    return text;
}

static PyObject *entry_reduce(Entry *self, PyObject *unused)
{
    (void)unused;
    PyObject *args = PyTuple_New(FIELDS);
    if (args == NULL)
        return NULL;
    for (int i = 0; i < FIELDS; i++) {
        Py_INCREF(self->fields[i]);
        PyTuple_SET_ITEM(args, i, self->fields[i]);
    }
    return Py_BuildValue("(ON)", (PyObject *)Py_TYPE(self), args);
}

static PyMemberDef entry_members[] = {
    {"id", T_OBJECT_EX, offsetof(Entry, fields) + ID * sizeof(PyObject *), READONLY,
     "Stream entry id, unique within its band."},
    {"band", T_OBJECT_EX, offsetof(Entry, fields) + BAND * sizeof(PyObject *), READONLY,
     "The band (stream) the entry is in: 9 - priority."},
    {"header", T_OBJECT_EX, offsetof(Entry, fields) + HEADER * sizeof(PyObject *), READONLY,
     "The header section as stored."},
    {"rest", T_OBJECT_EX, offsetof(Entry, fields) + REST * sizeof(PyObject *), READONLY,
     "The message's other sections as stored."},
    {"expiry_ms", T_OBJECT_EX, offsetof(Entry, fields) + EXPIRY_MS * sizeof(PyObject *),
     READONLY, "Absolute expiry, ms since the epoch; 0 means never."},
    {"delivery_count", T_OBJECT_EX, offsetof(Entry, fields) + DELIVERY_COUNT * sizeof(PyObject *),
     READONLY, "Earlier delivery attempts that ended in a failure (AMQP header delivery-count)."},
    {"origin", T_OBJECT_EX, offsetof(Entry, fields) + ORIGIN * sizeof(PyObject *), READONLY,
     "Container-id of the publishing connection (no-local subscribers skip their own)."},
    {"group", T_OBJECT_EX, offsetof(Entry, fields) + GROUP * sizeof(PyObject *), READONLY,
     "The message group (properties.group-id); '': ungrouped."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef entry_getset[] = {
    {"key", (getter)entry_key, NULL, "(band, id): unique within the address.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef entry_methods[] = {
    {"__reduce__", (PyCFunction)entry_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shoal_broker.routing.storage.Entry",
    .tp_doc = "A stored message handed to one replica for delivery to one subscription.",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT, /* no Py_TPFLAGS_HAVE_GC: see the top of this file */
    .tp_new = entry_new,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_repr = (reprfunc)entry_repr,
    .tp_richcompare = entry_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_members = entry_members,
    .tp_getset = entry_getset,
    .tp_setattro = entry_setattro,
    .tp_methods = entry_methods,
};

static PyObject *entry_steal(PyObject *fields[FIELDS])
{
    Entry *self = (Entry *)EntryType.tp_alloc(&EntryType, 0);
    if (self == NULL) {
        for (int i = 0; i < FIELDS; i++)
            Py_DECREF(fields[i]);
        return NULL;
    }
    for (int i = 0; i < FIELDS; i++)
        self->fields[i] = fields[i];
    return (PyObject *)self;
}

static ShoalEntryAPI api = {&EntryType, entry_steal};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shoal_broker.routing._entry",
    .m_doc = "routing.storage.Entry as a C type the cyclic garbage collector does not track.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__entry(void)
{
    if (PyType_Ready(&EntryType) < 0)
        return NULL;
    if ((empty_text = PyUnicode_FromString("")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EntryType);
    if (PyModule_AddObject(m, "Entry", (PyObject *)&EntryType) < 0) {
        Py_DECREF(&EntryType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&api, SHOAL_ENTRY_API, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
