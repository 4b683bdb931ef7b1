/* float32 values as their shortest decimal (SPEC 3.2), in C: the search ``_floats.c`` and
 * ``_example.c`` share (``append_float32``). The same algorithm as tfrfs/format/jsontext.py
 * (``py_format_float32``), with Python's own formatting and parsing (PyOS_double_to_string,
 * PyOS_string_to_double), so every text is byte for byte what the Python code writes. */
#ifndef TFRFS_FLOAT_TEXT_H
#define TFRFS_FLOAT_TEXT_H

#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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

#endif
