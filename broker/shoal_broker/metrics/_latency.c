/*
 * A subscription's accepted deliveries counted into its delivery-latency histogram and the
 * metric records' sketch, in C (metrics/hot.py's Counters.accepted_all).
 *
 * Why: every at-least-once delivery is counted here when its consumer accepts it. In Python,
 * its age from the stream id, one bisection of 83 bounds, a logarithm, two float updates and a
 * dict update were 0.45-1.25 us an entry (by how many a consumer accepted at once), the largest
 * part of the accept path that fan-out to 1 000 subscriptions pays per delivery
 * (docs/performance.md, "Latencies counted in C"). The arithmetic is the same, step for step
 * (an id's milliseconds / 1000 is correctly rounded either way, and sums are taken in the same
 * order), so the figures are those Python made; tests/unit/test_latency.py holds them equal.
 *
 * Built with the broker's C hot path (scripts/build_wire.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "_entry_api.h"

static ShoalEntryAPI *entry_api;
static double *bounds; /* the histogram's upper bounds, ascending */
static Py_ssize_t bound_count;
static double multiplier, min_seconds;
static long min_index;

/* configure(bounds, multiplier, min_seconds, min_index): the histogram's bounds and the
 * sketch's constants (records.SKETCH_*), once at import. */
static PyObject *configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(bounds: tuple, multiplier, min_seconds, min_index)");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(args[0]);
    double *made = PyMem_Malloc(sizeof(double) * (size_t)(count ? count : 1));
    if (made == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < count; i++) {
        made[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[0], i));
        if (made[i] == -1.0 && PyErr_Occurred()) {
            PyMem_Free(made);
            return NULL;
        }
        if (i && made[i] <= made[i - 1]) {
            PyMem_Free(made);
            PyErr_SetString(PyExc_ValueError, "configure: bounds must ascend");
            return NULL;
        }
    }
    double m = PyFloat_AsDouble(args[1]), least = PyFloat_AsDouble(args[2]);
    long index = PyLong_AsLong(args[3]);
    if (PyErr_Occurred()) {
        PyMem_Free(made);
        return NULL;
    }
    PyMem_Free(bounds);
    bounds = made;
    bound_count = count;
    multiplier = m;
    min_seconds = least;
    min_index = index;
    Py_RETURN_NONE;
}

/* The milliseconds an entry id starts with ("<ms>-<seq>"): -1 with ValueError if it does not. */
static long long id_ms(PyObject *id)
{
    if (!PyUnicode_Check(id) || PyUnicode_KIND(id) != PyUnicode_1BYTE_KIND) {
        PyErr_SetString(PyExc_ValueError, "an entry id is <ms>-<seq>");
        return -1;
    }
    const Py_UCS1 *c = PyUnicode_1BYTE_DATA(id);
    Py_ssize_t n = PyUnicode_GET_LENGTH(id);
    long long ms = 0;
    Py_ssize_t i = 0;
    for (; i < n && c[i] != '-'; i++) {
        if (c[i] < '0' || c[i] > '9' || i >= 18) {
            PyErr_Format(PyExc_ValueError, "an entry id is <ms>-<seq>, not %R", id);
            return -1;
        }
        ms = ms * 10 + (c[i] - '0');
    }
    return ms;
}

/* histogram[i] += amount, the list holding floats */
static int add(PyObject *histogram, Py_ssize_t i, double amount)
{
    double was = PyFloat_AsDouble(PyList_GET_ITEM(histogram, i));
    if (was == -1.0 && PyErr_Occurred())
        return -1;
    PyObject *now = PyFloat_FromDouble(was + amount);
    if (now == NULL)
        return -1;
    PyList_SetItem(histogram, i, now); /* steals `now`, releases the old float */
    return 0;
}

/* record(entries, now, histogram, sketch): each entry's seconds from its enqueue (its id's time)
 * to `now`, 0 if the clock stepped back, counted into `histogram` (its bucket by bisection of
 * the bounds, then the sum of seconds last) and into `sketch` (bucket index -> count). */
static PyObject *record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[2])
        || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "record(entries: list, now: float, histogram: list, sketch: dict)");
        return NULL;
    }
    if (bounds == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "record: configure() first");
        return NULL;
    }
    PyObject *entries = args[0], *histogram = args[2], *sketch = args[3];
    if (PyList_GET_SIZE(histogram) != bound_count + 2) {
        PyErr_SetString(PyExc_ValueError, "record: a histogram holds a count per bound, one "
                                          "past the last, and the sum");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    for (Py_ssize_t e = 0; e < PyList_GET_SIZE(entries); e++) {
        PyObject *entry = PyList_GET_ITEM(entries, e);
        if (Py_TYPE(entry) != entry_api->type) {
            PyErr_Format(PyExc_TypeError, "record: an Entry, not %.100s", Py_TYPE(entry)->tp_name);
            return NULL;
        }
        long long ms = id_ms(((ShoalEntryObject *)entry)->fields[0]);
        if (ms < 0)
            return NULL;
        double seconds = now - (double)ms / 1000.0;
        if (seconds < 0)
            seconds = 0.0;
        Py_ssize_t low = 0, high = bound_count; /* bisect_left */
        while (low < high) {
            Py_ssize_t middle = (low + high) / 2;
            if (bounds[middle] < seconds)
                low = middle + 1;
            else
                high = middle;
        }
        if (add(histogram, low, 1.0) < 0 || add(histogram, bound_count + 1, seconds) < 0)
            return NULL;
        long index = seconds > min_seconds ? (long)ceil(log(seconds) * multiplier) : min_index;
        PyObject *key = PyLong_FromLong(index);
        if (key == NULL)
            return NULL;
        PyObject *had = PyDict_GetItemWithError(sketch, key); /* borrowed */
        long count = 0;
        if (had != NULL) {
            count = PyLong_AsLong(had);
            if (count == -1 && PyErr_Occurred()) {
                Py_DECREF(key);
                return NULL;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(key);
            return NULL;
        }
        PyObject *counted = PyLong_FromLong(count + 1);
        int failed = counted == NULL || PyDict_SetItem(sketch, key, counted) < 0;
        Py_XDECREF(counted);
        Py_DECREF(key);
        if (failed)
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef functions[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "configure(bounds, multiplier, min_seconds, min_index): the histogram's bounds and the "
     "sketch's constants."},
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(entries, now, histogram, sketch): the entries' latencies counted."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shoal_broker.metrics._latency",
    .m_doc = "Accepted deliveries counted into a delivery-latency histogram and sketch, in C.",
    .m_size = -1,
    .m_methods = functions,
};

PyMODINIT_FUNC PyInit__latency(void)
{
    if ((entry_api = shoal_entry_api_import()) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
