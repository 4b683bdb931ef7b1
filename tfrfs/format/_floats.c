/* tfrfs.format._floats: float32 values as their shortest decimal (SPEC 3.2), in C.
 *
 * The same algorithm as tfrfs/format/jsontext.py (``py_format_float32``), which stays the reference
 * and the fallback where this is not built: the same candidates, tried in the same order, with
 * Python's own formatting and parsing (PyOS_double_to_string, PyOS_string_to_double), so every
 * text is byte for byte what the Python code writes. A numeric feature of a record (box
 * coordinates, scores) is rendered on the mount's hot path, and the Python search costs several
 * microseconds a value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_float_text.h"

static PyObject *format_float32(PyObject *Py_UNUSED(self), PyObject *arg) {
    double x = PyFloat_AsDouble(arg);
    if (x == -1.0 && PyErr_Occurred())
        return NULL;
    char buf[MAX_TEXT];
    size_t len = 0;
    if (append_float32(x, buf, &len) < 0)
        return NULL;
    return PyUnicode_DecodeASCII(buf, (Py_ssize_t)len, NULL);
}

/* "[v, v, ...]" of a sequence of floats, each as format_float32 writes it (jsontext.py_json_floats). */
static PyObject *json_floats(PyObject *Py_UNUSED(self), PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "json_floats takes a sequence of floats");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    char *buf = PyMem_Malloc((size_t)n * (MAX_TEXT + 2) + 3);
    if (!buf) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    size_t len = 0;
    buf[len++] = '[';
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = PyFloat_AsDouble(items[i]);
        if (x == -1.0 && PyErr_Occurred())
            goto done;
        if (i) {
            buf[len++] = ',';
            buf[len++] = ' ';
        }
        if (append_float32(x, buf, &len) < 0)
            goto done;
    }
    buf[len++] = ']';
    result = PyUnicode_DecodeASCII(buf, (Py_ssize_t)len, NULL);
done:
    PyMem_Free(buf);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"format_float32", format_float32, METH_O,
     "format_float32(x) -> str: the shortest decimal reading back to float32(x) (as jsontext's)."},
    {"json_floats", json_floats, METH_O,
     "json_floats(values) -> str: '[v, v, ...]', each value as format_float32 writes it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_floats", NULL, -1, methods};

PyMODINIT_FUNC PyInit__floats(void) { return PyModule_Create(&module); }
