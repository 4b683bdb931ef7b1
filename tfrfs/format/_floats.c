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

#include <math.h>
#include <stdint.h>
#include <string.h>

#define TWO_24 16777216.0
#define CAND 40   /* a candidate's text: "%.8e" of a float32 is at most 15 characters */

/* ``v`` rounded to float32 as struct.pack("<f") rounds it; 0 when that overflows (a finite
 * double past float32's range: Python raises OverflowError, and the candidate is skipped). */
static int to_f32(double v, float *out) {
    float y = (float)v;
    if (isinf(y) && !isinf(v))
        return 0;
    *out = y;
    return 1;
}

/* Whether the decimal ``text`` reads back to float32 ``a``; -1 on a Python error. */
static int reads_back(const char *text, float a) {
    double v = PyOS_string_to_double(text, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred())
        return -1;
    float y;
    return to_f32(v, &y) && y == a;
}

/* The decimal one unit in the last place above ``text`` ("%.{p}e" output), as
 * jsontext._next_decimal_up writes it. */
static void next_decimal_up(const char *text, int p, char *out) {
    uint64_t digits = 0;
    const char *c = text;
    for (; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9')
            digits = digits * 10 + (uint64_t)(*c - '0');
    int exponent = *c == 'e' ? atoi(c + 1) : 0;
    snprintf(out, CAND, "%llue%d", (unsigned long long)(digits + 1), exponent - p);
}

/* The nearest decimal of ``p`` + 1 significant digits reading back to ``a`` (or, at a power of two,
 * the one above it), into ``out``: 1 found, 0 not, -1 on a Python error. */
static int fits(double a, float af, int p, int asymmetric, char *out) {
    char *text = PyOS_double_to_string(a, 'e', p, 0, NULL);
    if (!text)
        return -1;
    snprintf(out, CAND, "%s", text);
    PyMem_Free(text);
    int got = reads_back(out, af);
    if (got != 0 || !asymmetric)
        return got;
    char up[CAND];
    next_decimal_up(out, p, up);
    got = reads_back(up, af);
    if (got == 1)
        memcpy(out, up, CAND);
    return got;
}

/* The shortest decimal reading back to the positive finite float32 ``af`` (jsontext._shortest_f32). */
static int shortest(float af, char *out) {
    double a = af;
    uint32_t bits;
    memcpy(&bits, &af, 4);
    int asymmetric = (bits & 0x7FFFFF) == 0 && a >= ldexp(1.0, -125);
    int got;
    if (a >= ldexp(1.0, -126)) {
        if ((got = fits(a, af, 5, asymmetric, out)) != 0)
            return got;
        char eight[CAND];
        if ((got = fits(a, af, 7, asymmetric, eight)) < 0)
            return -1;
        if (got == 0)
            return fits(a, af, 8, asymmetric, out);
        if ((got = fits(a, af, 6, asymmetric, out)) != 0)
            return got;
        memcpy(out, eight, CAND);
        return 1;
    }
    if ((got = fits(a, af, 0, asymmetric, out)) != 0)
        return got;
    int lo = 1, hi = 8, found = 0;
    char best[CAND], mid_text[CAND];
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if ((got = fits(a, af, mid, asymmetric, mid_text)) < 0)
            return -1;
        if (got == 0) {
            lo = mid + 1;
        } else {
            hi = mid;
            memcpy(best, mid_text, CAND);
            found = 1;
        }
    }
    if (!found)
        return fits(a, af, 8, asymmetric, out);
    memcpy(out, best, CAND);
    return 1;
}

/* Appends the text of ``x`` (jsontext.format_float32) to ``buf``; -1 on a Python error. */
static int append_float32(double x, char *buf, size_t *len) {
    char *text;
    if (x != x) {
        memcpy(buf + *len, "NaN", 3);
        *len += 3;
        return 0;
    }
    if (x > -TWO_24 && x < TWO_24 && x == floor(x)) {
        text = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    } else {
        float f = (float)x;
        if (isinf(f)) {
            const char *inf = f > 0 ? "Infinity" : "-Infinity";
            memcpy(buf + *len, inf, strlen(inf));
            *len += strlen(inf);
            return 0;
        }
        char digits[CAND];
        int got = shortest(fabsf(f), digits);
        if (got <= 0) {
            if (got == 0)
                PyErr_SetString(PyExc_AssertionError, "no decimal reads back");
            return -1;
        }
        double v = PyOS_string_to_double(digits, NULL, NULL);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
        text = PyOS_double_to_string(f < 0 ? -v : v, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    }
    if (!text)
        return -1;
    size_t n = strlen(text);
    memcpy(buf + *len, text, n);
    *len += n;
    PyMem_Free(text);
    return 0;
}

#define MAX_TEXT 32   /* one value's text: "-3.4028235e+38" is the longest */

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
