/* What routing/_entry.c offers other extensions of the broker, through a capsule: making an
 * Entry from field values that already have their exact types, without the checks and the
 * argument parsing of a call to the type (store/_replies.c makes one per entry it reads), and
 * reading its fields once its type is checked (metrics/_latency.c reads each accepted id).
 *
 *     ShoalEntryAPI *api = shoal_entry_api_import();
 *     PyObject *fields[SHOAL_ENTRY_FIELDS] = {id, band, header, rest, expiry_ms,
 *                                            delivery_count, origin, group};
 *     PyObject *entry = api->steal(fields);
 */
#ifndef SHOAL_ENTRY_API_H
#define SHOAL_ENTRY_API_H

#include <Python.h>

#define SHOAL_ENTRY_API "shoal_broker.routing._entry.API"
#define SHOAL_ENTRY_FIELDS 8 /* id, band, header, rest, expiry_ms, delivery_count, origin, group */

/* An Entry's layout: its fields in the order above, readable by whoever checked the type. */
typedef struct {
    PyObject_HEAD
    PyObject *fields[SHOAL_ENTRY_FIELDS];
} ShoalEntryObject;

typedef struct {
    PyTypeObject *type;
    /* A new Entry holding `fields` (str, int, bytes, bytes, int, int, str, str, exactly those
     * types: not checked), whose references it takes over: NULL (with an exception set) only
     * when the allocation fails, and then it has released them. */
    PyObject *(*steal)(PyObject *fields[SHOAL_ENTRY_FIELDS]);
} ShoalEntryAPI;

/* The API, for a module's init: NULL with the exception set if it cannot be had. Imports
 * routing._entry first, since PyCapsule_Import reaches the capsule through the package's
 * attributes. */
static inline ShoalEntryAPI *shoal_entry_api_import(void)
{
    PyObject *module = PyImport_ImportModule("shoal_broker.routing._entry");
    if (module == NULL)
        return NULL;
    Py_DECREF(module);
    return (ShoalEntryAPI *)PyCapsule_Import(SHOAL_ENTRY_API, 0);
}

#endif
