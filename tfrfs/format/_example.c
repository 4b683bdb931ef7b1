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

#include "_float_text.h"

enum { NONE, BYTES, FLOATS, INTS };

typedef struct {
    const uint8_t *p;
    size_t n;
} span;

typedef struct {
    span key;
    int kind;
    span list;        /* the list message's bytes */
    size_t count;     /* its values */
    int64_t one_int;  /* INTS with one value: it */
    span one_bytes;   /* BYTES with one value: it */
} feature;

static PyObject *KIND[4], *JSON, *TXT, *BIN, *NULL_TEXT, *EMPTY_LIST;

/* SPEC 3.2's image and sound suffixes, in ``media``'s numbering (made once, at import). */
static const char *MEDIA_NAMES[] = {".jpg", ".png", ".gif", ".bmp", ".webp", ".tif", ".wav", ".flac", ".mp3", ".ogg"};
enum { JPG, PNG, GIF, BMP, WEBP, TIF, WAV, FLAC, MP3, OGG, N_MEDIA };
static PyObject *MEDIA[N_MEDIA];

/* The varint at ``*pos``: 0 when it runs past ``end`` or past 64 bits. */
static int varint(const uint8_t *p, size_t end, size_t *pos, uint64_t *out) {
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (*pos >= end)
            return 0;
        uint8_t b = p[(*pos)++];
        if (i == 9 && b > 1)
            return 0;
        v |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* The length-delimited field with one-byte ``tag`` at ``*pos``: 0 when another is there. */
static int field(const uint8_t *p, size_t end, size_t *pos, uint8_t tag, span *out) {
    if (*pos >= end || p[*pos] != tag)
        return 0;
    (*pos)++;
    uint64_t len;
    if (!varint(p, end, pos, &len) || len > end - *pos)
        return 0;
    out->p = p + *pos;
    out->n = (size_t)len;
    *pos += (size_t)len;
    return 1;
}

/* Counts the values of list ``f->list`` of ``f->kind``: 0 when it is not in a form followed here. */
static int count_values(feature *f) {
    const uint8_t *p = f->list.p;
    size_t end = f->list.n, pos = 0;
    span s;
    uint64_t v;
    f->count = 0;
    while (pos < end) {
        uint8_t tag = p[pos];
        if (f->kind == BYTES) {
            if (!field(p, end, &pos, 0x0A, &s))
                return 0;
            f->one_bytes = s;
            f->count++;
        } else if (f->kind == FLOATS) {
            if (tag == 0x0D) {   /* one value, not packed */
                if (end - pos < 5)
                    return 0;
                pos += 5;
                f->count++;
            } else if (field(p, end, &pos, 0x0A, &s) && s.n % 4 == 0) {
                f->count += s.n / 4;
            } else {
                return 0;
            }
        } else {
            if (tag == 0x08) {   /* one value, not packed */
                pos++;
                if (!varint(p, end, &pos, &v))
                    return 0;
                f->one_int = (int64_t)v;
                f->count++;
            } else if (field(p, end, &pos, 0x0A, &s)) {
                size_t at = 0;
                while (at < s.n) {
                    if (!varint(s.p, s.n, &at, &v))
                        return 0;
                    f->one_int = (int64_t)v;
                    f->count++;
                }
            } else {
                return 0;
            }
        }
    }
    return 1;
}

/* The Feature message ``m``: 0 when it is not one list (or none) in the usual form. */
static int read_feature(span m, feature *f) {
    f->count = 0;
    if (m.n == 0) {
        f->kind = NONE;
        return 1;
    }
    static const uint8_t tags[] = {0x0A, 0x12, 0x1A};   /* bytes_list, float_list, int64_list */
    static const int kinds[] = {BYTES, FLOATS, INTS};
    for (int i = 0; i < 3; i++) {
        size_t pos = 0;
        if (m.p[0] == tags[i]) {
            if (!field(m.p, m.n, &pos, tags[i], &f->list) || pos != m.n)
                return 0;
            f->kind = kinds[i];
            return count_values(f);
        }
    }
    return 0;
}

/* Valid UTF-8 (as Python's strict decoder has it) with no NUL byte. */
static int is_text(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) {
            if (b == 0)
                return 0;
            i++;
            continue;
        }
        size_t more;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) {
            more = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            more = 2;
            if (b == 0xE0)
                lo = 0xA0;
            else if (b == 0xED)
                hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            more = 3;
            if (b == 0xF0)
                lo = 0x90;
            else if (b == 0xF4)
                hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i <= more)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k <= more; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += more + 1;
    }
    return 1;
}

static int starts(span v, size_t at, const char *want, size_t len) {
    return v.n >= at + len && memcmp(v.p + at, want, len) == 0;
}

/* The suffix of an image or sound by its magic bytes (shown_as.sniff_media), as its number in
 * MEDIA, or -1. */
static int media(span v) {
    if (starts(v, 0, "\xff\xd8\xff", 3)) return JPG;
    if (starts(v, 0, "\x89PNG\r\n\x1a\n", 8)) return PNG;
    if (starts(v, 0, "GIF87a", 6) || starts(v, 0, "GIF89a", 6)) return GIF;
    if (starts(v, 0, "BM", 2) && v.n >= 6) {
        uint32_t len = (uint32_t)v.p[2] | (uint32_t)v.p[3] << 8 | (uint32_t)v.p[4] << 16 | (uint32_t)v.p[5] << 24;
        if (len == v.n)
            return BMP;
    }
    if (starts(v, 0, "RIFF", 4) && starts(v, 8, "WEBP", 4)) return WEBP;
    if (starts(v, 0, "II*\x00", 4) || starts(v, 0, "MM\x00*", 4)) return TIF;
    if (starts(v, 0, "RIFF", 4) && starts(v, 8, "WAVE", 4)) return WAV;
    if (starts(v, 0, "fLaC", 4)) return FLAC;
    if (starts(v, 0, "ID3", 3)) return MP3;
    if (starts(v, 0, "OggS", 4)) return OGG;
    return -1;
}

/* The one int64 value of feature PREFIX + ``name`` (shown_as._one_int): 1 found, 0 not. */
static int one_int(const feature *fs, size_t n, span prefix, const char *name, int64_t *out) {
    size_t len = strlen(name);
    for (size_t i = 0; i < n; i++) {
        const feature *f = &fs[i];
        if (f->key.n == prefix.n + len && memcmp(f->key.p, prefix.p, prefix.n) == 0 &&
            memcmp(f->key.p + prefix.n, name, len) == 0)
            return f->kind == INTS && f->count == 1 ? (*out = f->one_int, 1) : 0;
    }
    return 0;
}

/* Whether one-value bytes feature ``f`` is a raw pixel array (shown_as.raw_shape). */
static int raw_pixels(const feature *fs, size_t n, const feature *f) {
    span prefix = {f->key.p, 0};
    for (size_t i = f->key.n; i > 0; i--)
        if (f->key.p[i - 1] == '/') {
            prefix.n = i;
            break;
        }
    int64_t h, w, c;
    if (!one_int(fs, n, prefix, "height", &h) || !one_int(fs, n, prefix, "width", &w) || h <= 0 || w <= 0)
        return 0;
    int tried[5] = {0};   /* channel counts to try: 1, 3, 4 (the others never fit) */
    int declared = 0;
    if (one_int(fs, n, prefix, "depth", &c)) {
        declared = 1;
        if (c == 1 || c == 3 || c == 4) tried[c] = 1;
    }
    if (one_int(fs, n, prefix, "channels", &c)) {
        declared = 1;
        if (c == 1 || c == 3 || c == 4) tried[c] = 1;
    }
    if (!declared)
        tried[1] = tried[3] = tried[4] = 1;
    int fitting = 0;
    for (int k = 1; k <= 4; k++) {
        uint64_t hw, all;
        if (tried[k] && !__builtin_mul_overflow((uint64_t)h, (uint64_t)w, &hw) &&
            !__builtin_mul_overflow(hw, (uint64_t)k, &all) && all == f->one_bytes.n)
            fitting++;
    }
    return fitting == 1;
}

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

/* The features of the Example ``data``, into ``*out`` (PyMem): their count, or -1 when the
 * encoding is not the usual one. */
static Py_ssize_t read_example(const uint8_t *data, size_t size, feature **out) {
    *out = NULL;
    if (size == 0)
        return 0;
    size_t pos = 0;
    span features, entry, key, value;
    if (!field(data, size, &pos, 0x0A, &features) || pos != size)
        return -1;   /* a field after ``features``: protobuf would merge or keep it */
    size_t room = 16, n = 0;
    feature *fs = PyMem_Malloc(room * sizeof(feature));
    if (!fs)
        return -2;
    for (pos = 0; pos < features.n;) {
        size_t at = 0;
        if (!field(features.p, features.n, &pos, 0x0A, &entry) || !field(entry.p, entry.n, &at, 0x0A, &key) ||
            !field(entry.p, entry.n, &at, 0x12, &value) || at != entry.n)
            goto unusual;
        if (n == room) {
            feature *more = PyMem_Realloc(fs, 2 * room * sizeof(feature));
            if (!more) {
                PyMem_Free(fs);
                return -2;
            }
            fs = more;
            room *= 2;
        }
        fs[n].key = key;
        if (!read_feature(value, &fs[n]))
            goto unusual;
        n++;
    }
    *out = fs;
    return (Py_ssize_t)n;
unusual:
    PyMem_Free(fs);
    return -1;
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
