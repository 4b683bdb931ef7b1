/* tfrfs.format._example: the feature files of an Example in the usual encoding (SPEC 3.2), in C.
 *
 * ``files(data, decode_raw)`` reads the Example encoded in ``data`` and gives, for each feature,
 * (key, kind, suffix, bytes): the file ``codec.render`` shows it as, byte for byte. A read-only
 * mount renders every record a reader looks into, and protobuf's parse, the values made Python
 * objects, and the render in Python cost most of that record's time in the daemon.
 *
 * Only what the Python path (``render.render``) shows as one file per feature is done here, and
 * only in the encoding protobuf serializers write (as ``wire.py`` follows it): anything else gives
 * None, and the record is parsed by protobuf and rendered in Python, which stays the reference.
 * None for: a field other than the expected one at any level (unknown fields, a ``features``
 * written twice), a map entry that is not key then value, a key given twice or not UTF-8, a
 * Feature with more than one list, a varint past 64 bits, a packed float list of a length not a
 * multiple of four; a bytes feature of several values not all text (a ``.list`` folder); a raw
 * pixel array (a PNG, SPEC 3.3). So what a record shows never depends on which path read it.
 *
 * ``values(data)`` reads the same encoding and gives the Example as ``codec.plain_values`` does
 * (``tfrfs.open(...).example``, SPEC 9): ``{key: list}``, the lists of int, float (the float32
 * value) or bytes, None for a feature with no kind; None where protobuf must decide, as above
 * (but any bytes values: no file is made of them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_example_wire.h"
#include "_float_text.h"

static PyObject *KIND[4], *JSON, *TXT, *BIN, *NULL_TEXT, *EMPTY_LIST;

/* The suffixes of ``MEDIA_NAMES`` (made once, at import). */
static PyObject *MEDIA[N_MEDIA];

/* Appends ``v`` to a JSON string as json.encoder.encode_basestring writes it (quotes included). */
static size_t json_text(span v, char *out) {
    size_t len = 0;
    out[len++] = '"';
    for (size_t i = 0; i < v.n; i++) {
        uint8_t c = v.p[i];
        switch (c) {
        case '"': out[len++] = '\\'; out[len++] = '"'; break;
        case '\\': out[len++] = '\\'; out[len++] = '\\'; break;
        case '\n': out[len++] = '\\'; out[len++] = 'n'; break;
        case '\r': out[len++] = '\\'; out[len++] = 'r'; break;
        case '\t': out[len++] = '\\'; out[len++] = 't'; break;
        case '\b': out[len++] = '\\'; out[len++] = 'b'; break;
        case '\f': out[len++] = '\\'; out[len++] = 'f'; break;
        default:
            if (c < 0x20)
                len += (size_t)sprintf(out + len, "\\u%04x", c);
            else
                out[len++] = (char)c;
        }
    }
    out[len++] = '"';
    return len;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static double float_at(const uint8_t *p) {
    uint32_t bits = le32(p);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The ``.json`` text of a numeric list, or of a bytes list whose values are all text (``texts``
 * set): "[v, v]\n". NULL with a Python error set. */
static PyObject *json_list(const feature *f) {
    size_t room = 4;
    const uint8_t *p = f->list.p;
    size_t end = f->list.n, pos;
    span s;
    if (f->kind == BYTES) {
        for (pos = 0; pos < end;) {
            field(p, end, &pos, 0x0A, &s);
            room += 4 + 6 * s.n;
        }
    } else {
        room += f->count * (f->kind == FLOATS ? MAX_TEXT + 2 : 24);
    }
    char *buf = PyMem_Malloc(room);
    if (!buf)
        return PyErr_NoMemory();
    size_t len = 0;
    int first = 1;
    buf[len++] = '[';
#define SEP() do { if (!first) { buf[len++] = ','; buf[len++] = ' '; } first = 0; } while (0)
    for (pos = 0; pos < end;) {
        if (f->kind == BYTES) {
            field(p, end, &pos, 0x0A, &s);
            SEP();
            len += json_text(s, buf + len);
        } else if (f->kind == FLOATS) {
            if (p[pos] == 0x0D) {
                SEP();
                if (append_float32(float_at(p + pos + 1), buf, &len) < 0)
                    goto failed;
                pos += 5;
                continue;
            }
            field(p, end, &pos, 0x0A, &s);
            for (size_t at = 0; at < s.n; at += 4) {
                SEP();
                if (append_float32(float_at(s.p + at), buf, &len) < 0)
                    goto failed;
            }
        } else {
            uint64_t v;
            if (p[pos] == 0x08) {
                pos++;
                varint(p, end, &pos, &v);
                SEP();
                len += (size_t)sprintf(buf + len, "%lld", (long long)(int64_t)v);
                continue;
            }
            field(p, end, &pos, 0x0A, &s);
            for (size_t at = 0; at < s.n;) {
                varint(s.p, s.n, &at, &v);
                SEP();
                len += (size_t)sprintf(buf + len, "%lld", (long long)(int64_t)v);
            }
        }
    }
#undef SEP
    buf[len++] = ']';
    buf[len++] = '\n';
    PyObject *out = PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
    PyMem_Free(buf);
    return out;
failed:
    PyMem_Free(buf);
    return NULL;
}

/* (suffix, bytes) of feature ``f`` as one file: 1 made, 0 not one file here, -1 Python error. */
static int file_of(const feature *fs, size_t n, const feature *f, int decode_raw, PyObject **suffix,
                   PyObject **body) {
    if (f->kind == NONE) {
        *suffix = Py_NewRef(JSON);
        *body = Py_NewRef(NULL_TEXT);
        return 1;
    }
    if (f->kind == BYTES && f->count == 1) {
        if (decode_raw && raw_pixels(fs, n, f))
            return 0;
        span v = f->one_bytes;
        int m = media(v);
        *suffix = Py_NewRef(m >= 0 ? MEDIA[m] : is_text(v.p, v.n) ? TXT : BIN);
        *body = PyBytes_FromStringAndSize((const char *)v.p, (Py_ssize_t)v.n);
        if (!*body) {
            Py_CLEAR(*suffix);
            return -1;
        }
        return 1;
    }
    if (f->kind == BYTES) {
        if (f->count == 0) {
            *suffix = Py_NewRef(JSON);
            *body = Py_NewRef(EMPTY_LIST);
            return 1;
        }
        span s;
        for (size_t pos = 0; pos < f->list.n;) {
            field(f->list.p, f->list.n, &pos, 0x0A, &s);
            if (!is_text(s.p, s.n))
                return 0;   /* a .list folder */
        }
    }
    *body = json_list(f);
    if (!*body)
        return -1;
    *suffix = Py_NewRef(JSON);
    return 1;
}

/* ``read_example`` of ``data``: the count of features to go on with, or below 0 with the answer
 * in ``*answer`` (None: an unusual encoding, left to protobuf) or an error set. */
static Py_ssize_t features_of(Py_buffer *data, feature **fs, PyObject **answer) {
    Py_ssize_t n = read_example(data->buf, (size_t)data->len, fs);
    if (n == -2)
        PyErr_NoMemory();
    else if (n == -1)
        *answer = Py_NewRef(Py_None);
    return n;
}

/* Feature ``f``'s key as text; NULL when it is not UTF-8 (``*answer`` None: protobuf refuses such
 * a key, and says why) or with an error set. */
static PyObject *key_of(const feature *f, PyObject **answer) {
    PyObject *key = PyUnicode_DecodeUTF8((const char *)f->key.p, (Py_ssize_t)f->key.n, "strict");
    if (!key && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        *answer = Py_NewRef(Py_None);
    }
    return key;
}

static PyObject *files(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    int decode_raw;
    if (!PyArg_ParseTuple(args, "y*p:files", &data, &decode_raw))
        return NULL;
    feature *fs;
    PyObject *result = NULL, *seen = NULL, *list = NULL;
    Py_ssize_t n = features_of(&data, &fs, &result);
    if (n < 0)
        goto done;
    seen = PySet_New(NULL);
    list = PyList_New(n);
    if (!seen || !list)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = key_of(&fs[i], &result);
        if (!key)
            goto done;
        int twice = PySet_Contains(seen, key);
        if (twice != 0 || PySet_Add(seen, key) < 0) {
            Py_DECREF(key);
            if (twice == 1)   /* protobuf keeps the last: left to it */
                result = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *suffix, *body;
        int made = file_of(fs, (size_t)n, &fs[i], decode_raw, &suffix, &body);
        if (made <= 0) {
            Py_DECREF(key);
            if (made == 0)
                result = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *item = PyTuple_Pack(4, key, KIND[fs[i].kind], suffix, body);
        Py_DECREF(key);
        Py_DECREF(suffix);
        Py_DECREF(body);
        if (!item)
            goto done;
        PyList_SET_ITEM(list, i, item);
    }
    result = Py_NewRef(list);
done:
    Py_XDECREF(seen);
    Py_XDECREF(list);
    PyMem_Free(fs);
    PyBuffer_Release(&data);
    return result;
}

/* The values of list ``f`` as a Python list (None for a feature with no kind); NULL with an error. */
static PyObject *plain_list(const feature *f) {
    if (f->kind == NONE)
        return Py_NewRef(Py_None);
    PyObject *list = PyList_New((Py_ssize_t)f->count), *v;
    if (!list)
        return NULL;
    const uint8_t *p = f->list.p;
    size_t end = f->list.n, pos = 0, i = 0;
    span s;
    uint64_t u;
    while (pos < end) {
        if (f->kind == BYTES) {
            field(p, end, &pos, 0x0A, &s);
            if (!(v = PyBytes_FromStringAndSize((const char *)s.p, (Py_ssize_t)s.n)))
                goto failed;
            PyList_SET_ITEM(list, i++, v);
        } else if (f->kind == FLOATS) {
            if (p[pos] == 0x0D) {
                s.p = p + pos + 1;
                s.n = 4;
                pos += 5;
            } else {
                field(p, end, &pos, 0x0A, &s);
            }
            for (size_t at = 0; at < s.n; at += 4) {
                if (!(v = PyFloat_FromDouble(float_at(s.p + at))))
                    goto failed;
                PyList_SET_ITEM(list, i++, v);
            }
        } else {
            if (p[pos] == 0x08) {
                pos++;
                varint(p, end, &pos, &u);
                if (!(v = PyLong_FromLongLong((long long)(int64_t)u)))
                    goto failed;
                PyList_SET_ITEM(list, i++, v);
                continue;
            }
            field(p, end, &pos, 0x0A, &s);
            for (size_t at = 0; at < s.n;) {
                varint(s.p, s.n, &at, &u);
                if (!(v = PyLong_FromLongLong((long long)(int64_t)u)))
                    goto failed;
                PyList_SET_ITEM(list, i++, v);
            }
        }
    }
    return list;
failed:
    Py_DECREF(list);
    return NULL;
}

static PyObject *values(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    feature *fs;
    PyObject *result = NULL, *dict = NULL;
    Py_ssize_t n = features_of(&data, &fs, &result);
    if (n < 0 || !(dict = PyDict_New()))
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = key_of(&fs[i], &result);
        if (!key)
            goto done;
        int twice = PyDict_Contains(dict, key);
        PyObject *list = twice == 0 ? plain_list(&fs[i]) : NULL;
        int stored = list ? PyDict_SetItem(dict, key, list) : -1;
        Py_DECREF(key);
        Py_XDECREF(list);
        if (twice == 1)   /* protobuf keeps the last: left to it */
            result = Py_NewRef(Py_None);
        if (stored < 0)
            goto done;
    }
    result = Py_NewRef(dict);
done:
    Py_XDECREF(dict);
    PyMem_Free(fs);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"files", files, METH_VARARGS,
     "files(data, decode_raw) -> [(key, kind, suffix, bytes), ...] or None: each feature of the Example in "
     "data as the one file codec.render shows it as; None where the Python path must decide (see the module)."},
    {"values", values, METH_O,
     "values(data) -> {key: list or None} or None: the Example in data as codec.plain_values gives it; None "
     "where protobuf must decide (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_example", NULL, -1, methods};

PyMODINIT_FUNC PyInit__example(void) {
    static const char *kinds[] = {"none", "bytes_list", "float_list", "int64_list"};
    for (int i = 0; i < 4; i++)
        if (!(KIND[i] = PyUnicode_InternFromString(kinds[i])))
            return NULL;
    for (int i = 0; i < N_MEDIA; i++)
        if (!(MEDIA[i] = PyUnicode_InternFromString(MEDIA_NAMES[i])))
            return NULL;
    if (!(JSON = PyUnicode_InternFromString(".json")) || !(TXT = PyUnicode_InternFromString(".txt")) ||
        !(BIN = PyUnicode_InternFromString(".bin")) || !(NULL_TEXT = PyBytes_FromString("null\n")) ||
        !(EMPTY_LIST = PyBytes_FromString("[]\n")))
        return NULL;
    return PyModule_Create(&module);
}
