/* tfrfs.format._records: the per-record loops of a shard walk, in C (SPEC 6's walk, SPEC 5's tally).
 *
 * Every command that touches every record (``index`` with its schema, ``verify``, ``reshard``,
 * ``repair``) walks a shard a block at a time. The Python walk (``salvage.Walk``) stays the
 * reference and judges every damage; these functions take the runs of sound records in between,
 * at the speed of the bytes, and hand back the few records they cannot vouch for:
 *
 * ``run(block, base, size, whole, kind)`` takes the sound records at the start of ``block`` (the
 * plain stream's bytes from offset ``base``; the stream is ``size`` bytes), as
 * ``salvage._sound_run`` does: header checksum, and a record that fits in the stream. With
 * ``whole``, only records wholly in ``block`` are taken, each data checksum is checked and, for
 * ``kind`` 1 (Example), each record is checked to parse: (offsets, next, failed, unsure,
 * data_bytes) with the offsets as u64 bytes, the records (numbered from 0 in this run) whose data
 * checksum fails, and those whose parse protobuf must decide (not the usual encoding).
 *
 * ``tally(block, start, offsets, check, skipped)`` reads the Examples whose header offsets are
 * ``offsets`` (a buffer of u32 or u64; the last is the end of the last record) in ``block`` (the
 * stream's bytes from ``start``) and counts them by the rows ``shardschema.Scanner`` gives them:
 * ({signature: records}, failed, unsure). A signature is the rows of one record's features, each
 * (u32 key length, key, u8 kind, u64 count, u8 suffix, u8 newline, u8 raw), in ``TALLY_SUFFIXES``'
 * numbering; ``shardschema`` reads it back. Records it cannot vouch for (an unusual encoding, a key
 * twice or not UTF-8, a record of a mebibyte or more, one cut short) are ``unsure`` and left to the
 * Python scanner, so a tally never depends on which path read it. ``skipped`` (a set or None) are
 * record numbers (from 0) checked but not counted.
 *
 * ``offsets_as(data, from, to, delta)`` converts offsets between u32 and u64 (index files, reshard).
 * ``crc32c(data, value=0)`` is the checksum itself (as the crc32c package's), for the tests.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_crc32c.h"
#include "_example_wire.h"

#define HEADER 12
#define OVERHEAD 16
#define LARGE (1 << 20)       /* shardschema.LARGE: such records are tallied by the Python scanner */
#define MAX_FEATURES 256      /* more features than this in a record: left to the Python path */

enum { SUF_TXT = N_MEDIA, SUF_BIN, SUF_JSON, SUF_LIST };

static uint64_t le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static uint32_t le32u(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ``read_example`` into ``fs`` (room for MAX_FEATURES): the count, or -1 when the record is not
 * in the usual encoding, has more features than that, or a key that is not UTF-8. */
static Py_ssize_t example_features(const uint8_t *data, size_t size, feature *fs) {
    if (size == 0)
        return 0;
    size_t pos = 0, n = 0;
    span features, entry;
    if (!field(data, size, &pos, 0x0A, &features) || pos != size)
        return -1;
    for (pos = 0; pos < features.n; n++) {
        size_t at = 0;
        span value;
        if (n == MAX_FEATURES || !field(features.p, features.n, &pos, 0x0A, &entry) ||
            !field(entry.p, entry.n, &at, 0x0A, &fs[n].key) || !field(entry.p, entry.n, &at, 0x12, &value) ||
            at != entry.n || !read_feature(value, &fs[n]) || !key_valid(fs[n].key.p, fs[n].key.n))
            return -1;
    }
    return (Py_ssize_t)n;
}

/* Whether two features share a key (protobuf keeps the last: left to it). */
static int key_twice(const feature *fs, size_t n) {
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (fs[i].key.n == fs[j].key.n && memcmp(fs[i].key.p, fs[j].key.p, fs[i].key.n) == 0)
                return 1;
    return 0;
}

static int append_index(PyObject *list, Py_ssize_t i) {
    PyObject *v = PyLong_FromSsize_t(i);
    if (!v)
        return -1;
    int rc = PyList_Append(list, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *run(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer block;
    long long base, size;
    int whole, kind;
    if (!PyArg_ParseTuple(args, "y*LLpi", &block, &base, &size, &whole, &kind))
        return NULL;
    const uint8_t *b = block.buf;
    Py_ssize_t len = block.len;
    PyObject *failed = PyList_New(0), *unsure = PyList_New(0), *result = NULL;
    uint64_t *offs = NULL;
    feature *fs = NULL;
    if (!failed || !unsure)
        goto done;
    size_t cap = (size_t)(len / OVERHEAD + 1);
    offs = PyMem_Malloc(cap * sizeof(uint64_t));
    fs = kind == 1 ? PyMem_Malloc(MAX_FEATURES * sizeof(feature)) : NULL;
    if (!offs || (kind == 1 && !fs)) {
        PyErr_NoMemory();
        goto done;
    }
    long long room = size - base - OVERHEAD;   /* a record at p fits when p + length <= room */
    uint64_t last_len = UINT64_MAX;
    uint32_t last_crc = 0;
    Py_ssize_t p = 0, n = 0;
    unsigned long long data_bytes = 0;
    while (p <= len - HEADER) {
        uint64_t length = le64(b + p);
        uint32_t hcrc = le32u(b + p + 8);
        if (length != last_len) {
            uint32_t c = masked_crc(b + p, 8);
            if (c != hcrc)
                break;
            last_len = length;
            last_crc = c;
        } else if (last_crc != hcrc) {
            break;
        }
        if (room - p < 0 || length > (uint64_t)(room - p))
            break;
        if (whole) {
            Py_ssize_t avail = len - p - OVERHEAD;
            if (avail < 0 || length > (uint64_t)avail)
                break;   /* not wholly in the block: the caller reads it */
            const uint8_t *data = b + p + HEADER;
            if (masked_crc(data, (size_t)length) != le32u(data + length)) {
                if (append_index(failed, n) < 0)
                    goto done;
            } else if (kind == 1 && example_features(data, (size_t)length, fs) < 0) {
                if (append_index(unsure, n) < 0)
                    goto done;
            }
            data_bytes += length;
        }
        offs[n++] = (uint64_t)(base + p);
        p += OVERHEAD + (Py_ssize_t)length;
    }
    PyObject *packed = PyBytes_FromStringAndSize((const char *)offs, n * (Py_ssize_t)sizeof(uint64_t));
    if (packed)
        result = Py_BuildValue("(NLOOK)", packed, (long long)(base + p), failed, unsure, data_bytes);
done:
    PyMem_Free(offs);
    PyMem_Free(fs);
    Py_XDECREF(failed);
    Py_XDECREF(unsure);
    PyBuffer_Release(&block);
    return result;
}

/* --- the tally -------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, room;
} sigbuf;

static int sig_put(sigbuf *s, const void *data, size_t n) {
    if (s->n + n > s->room) {
        size_t room = s->room ? s->room : 256;
        while (room < s->n + n)
            room *= 2;
        uint8_t *more = PyMem_Realloc(s->p, room);
        if (!more) {
            PyErr_NoMemory();
            return -1;
        }
        s->p = more;
        s->room = room;
    }
    if (data) {
        memcpy(s->p + s->n, data, n);
        s->n += n;
    }
    return 0;
}

/* The suffix, newline and raw flags of feature ``f`` as the Python scanner's row has them. */
static void row_of(const feature *fs, size_t n, const feature *f, uint8_t *suffix, uint8_t *newline, uint8_t *raw) {
    *suffix = SUF_JSON;
    *newline = *raw = 0;
    if (f->kind != BYTES || f->count == 0)
        return;
    if (f->count == 1) {
        span v = f->one_bytes;
        int m = media(v);
        *suffix = (uint8_t)(m >= 0 ? m : is_text(v.p, v.n) ? SUF_TXT : SUF_BIN);
        *newline = v.n && v.p[v.n - 1] == '\n';
        *raw = (uint8_t)raw_pixels(fs, n, f);
        return;
    }
    span s;
    for (size_t pos = 0; pos < f->list.n;) {
        field(f->list.p, f->list.n, &pos, 0x0A, &s);
        if (!is_text(s.p, s.n))
            *suffix = SUF_LIST;
        if (s.n && s.p[s.n - 1] == '\n')
            *newline = 1;
    }
}

typedef uint8_t row3[3];   /* suffix, newline, raw */

/* The signature of a record's features (``rows``: theirs) into ``s`` (emptied first). */
static int signature(sigbuf *s, const feature *fs, const row3 *rows, size_t n) {
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += 4 + fs[i].key.n + 12;
    s->n = 0;
    if (need > s->room && sig_put(s, NULL, need) < 0)
        return -1;
    uint8_t *out = s->p;
    for (size_t i = 0; i < n; i++) {
        const feature *f = &fs[i];
        uint32_t klen = (uint32_t)f->key.n;
        uint64_t count = f->count;
        memcpy(out, &klen, 4);
        memcpy(out + 4, f->key.p, klen);
        out += 4 + klen;
        out[0] = (uint8_t)f->kind;
        memcpy(out + 1, &count, 8);
        memcpy(out + 9, rows[i], 3);
        out += 12;
    }
    s->n = need;
    return 0;
}

/* Whether two records' features give the same rows (their signatures would be equal). */
static int same_rows(const feature *a, const row3 *ra, const feature *b, const row3 *rb, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (a[i].key.n != b[i].key.n || a[i].kind != b[i].kind || a[i].count != b[i].count ||
            ra[i][0] != rb[i][0] || ra[i][1] != rb[i][1] || ra[i][2] != rb[i][2])
            return 0;
        const uint8_t *x = a[i].key.p, *y = b[i].key.p;
        for (size_t k = 0; k < a[i].key.n; k++)   /* (keys are short: no call) */
            if (x[k] != y[k])
                return 0;
    }
    return 1;
}

/* Adds ``weight`` records of signature ``s`` to ``counts``. */
static int count_sig(PyObject *counts, const sigbuf *s, Py_ssize_t weight) {
    if (weight == 0)
        return 0;
    PyObject *key = PyBytes_FromStringAndSize((const char *)s->p, (Py_ssize_t)s->n);
    if (!key)
        return -1;
    PyObject *had = PyDict_GetItemWithError(counts, key);
    Py_ssize_t before = 0;
    if (had)
        before = PyLong_AsSsize_t(had);
    else if (PyErr_Occurred())
        before = -1;
    PyObject *now = before < 0 && PyErr_Occurred() ? NULL : PyLong_FromSsize_t(before + weight);
    int rc = now ? PyDict_SetItem(counts, key, now) : -1;
    Py_XDECREF(now);
    Py_DECREF(key);
    return rc;
}

static PyObject *tally(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer block, offsets;
    long long start;
    int check;
    PyObject *skipped;
    if (!PyArg_ParseTuple(args, "y*Ly*pO", &block, &start, &offsets, &check, &skipped))
        return NULL;
    PyObject *counts = PyDict_New(), *failed = PyList_New(0), *unsure = PyList_New(0), *result = NULL;
    /* This record's features and rows, and those of the run of records before it that give the same. */
    feature *fs = PyMem_Malloc(2 * MAX_FEATURES * sizeof(feature)), *prev = fs ? fs + MAX_FEATURES : NULL;
    row3 *rows = PyMem_Malloc(2 * MAX_FEATURES * sizeof(row3)), *prev_rows = rows ? rows + MAX_FEATURES : NULL;
    size_t prev_n = 0;
    Py_ssize_t run_n = 0;   /* records of the run, not yet in ``counts`` */
    sigbuf sig = {0};
    if (!counts || !failed || !unsure)
        goto done;
    if (!fs || !rows) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t item = offsets.itemsize;
    if ((item != 4 && item != 8) || offsets.len % item) {
        PyErr_SetString(PyExc_ValueError, "offsets: a buffer of u32 or u64 values");
        goto done;
    }
    Py_ssize_t records = offsets.len / item - 1;
    const uint8_t *b = block.buf, *ob = offsets.buf;
    Py_ssize_t len = block.len;
    for (Py_ssize_t k = 0; k < records; k++) {
        uint64_t off;
        if (item == 8) {
            memcpy(&off, ob + k * 8, 8);
        } else {
            uint32_t o;
            memcpy(&o, ob + k * 4, 4);
            off = o;
        }
        long long head = (long long)off - start;
        if (head < 0 || head + HEADER > len) {
            PyErr_SetString(PyExc_ValueError, "an offset outside the block");
            goto done;
        }
        uint64_t length = le64(b + head);
        long long avail = len - head - OVERHEAD;
        int whole = avail >= 0 && length <= (uint64_t)avail;
        const uint8_t *data = b + head + HEADER;
        if (check && (!whole || masked_crc(data, (size_t)length) != le32u(data + length)))
            if (append_index(failed, k) < 0)
                goto done;
        if (skipped != Py_None && PySet_GET_SIZE(skipped)) {
            PyObject *kk = PyLong_FromSsize_t(k);
            int in = kk ? PySet_Contains(skipped, kk) : -1;
            Py_XDECREF(kk);
            if (in < 0)
                goto done;
            if (in)
                continue;
        }
        Py_ssize_t n = -1;
        if (whole && length < LARGE)
            n = example_features(data, (size_t)length, fs);
        if (n >= 0)
            for (Py_ssize_t i = 0; i < n; i++)
                row_of(fs, (size_t)n, &fs[i], &rows[i][0], &rows[i][1], &rows[i][2]);
        if (n >= 0 && run_n && (size_t)n == prev_n && same_rows(fs, rows, prev, prev_rows, (size_t)n)) {
            run_n++;   /* (the same keys as the run's, so no key twice) */
            continue;
        }
        if (n < 0 || key_twice(fs, (size_t)n)) {
            if (append_index(unsure, k) < 0)
                goto done;
            continue;
        }
        if (run_n && (signature(&sig, prev, prev_rows, prev_n) < 0 || count_sig(counts, &sig, run_n) < 0))
            goto done;
        feature *tf = prev;
        prev = fs;
        fs = tf;
        row3 *tr = prev_rows;
        prev_rows = rows;
        rows = tr;
        prev_n = (size_t)n;
        run_n = 1;
    }
    if (run_n && (signature(&sig, prev, prev_rows, prev_n) < 0 || count_sig(counts, &sig, run_n) < 0))
        goto done;
    result = PyTuple_Pack(3, counts, failed, unsure);
done:
    PyMem_Free(fs < prev ? fs : prev);
    PyMem_Free(rows < prev_rows ? rows : prev_rows);
    PyMem_Free(sig.p);
    Py_XDECREF(counts);
    Py_XDECREF(failed);
    Py_XDECREF(unsure);
    PyBuffer_Release(&block);
    PyBuffer_Release(&offsets);
    return result;
}

/* Offsets converted between u32 and u64 (native order), each plus ``delta``. */
static PyObject *offsets_as(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    int from, to;
    long long delta = 0;
    if (!PyArg_ParseTuple(args, "y*ii|L", &data, &from, &to, &delta))
        return NULL;
    PyObject *out = NULL;
    if ((from != 4 && from != 8) || (to != 4 && to != 8) || data.len % from) {
        PyErr_SetString(PyExc_ValueError, "offsets of 4 or 8 bytes each");
        goto done;
    }
    Py_ssize_t n = data.len / from;
    out = PyBytes_FromStringAndSize(NULL, n * to);
    if (!out)
        goto done;
    const uint8_t *src = data.buf;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t v;
        if (from == 8) {
            memcpy(&v, src + 8 * i, 8);
        } else {
            uint32_t w;
            memcpy(&w, src + 4 * i, 4);
            v = w;
        }
        v += (uint64_t)delta;
        if (to == 8) {
            memcpy(dst + 8 * i, &v, 8);
        } else {
            uint32_t w = (uint32_t)v;
            memcpy(dst + 4 * i, &w, 4);
        }
    }
done:
    PyBuffer_Release(&data);
    return out;
}

static PyObject *crc(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &value))
        return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS
    c = crc32c(value, data.buf, (size_t)data.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(block, base, size, whole, kind) -> (offsets, next, failed, unsure, data_bytes): the sound records at "
     "the start of block (see the module)."},
    {"tally", tally, METH_VARARGS,
     "tally(block, start, offsets, check, skipped) -> ({signature: records}, failed, unsure): the Examples at "
     "offsets counted by their rows (see the module)."},
    {"offsets_as", offsets_as, METH_VARARGS,
     "offsets_as(data, from, to, delta=0) -> bytes: offsets of from bytes each (4 or 8, native order) as "
     "offsets of to bytes each, each plus delta."},
    {"crc32c", crc, METH_VARARGS, "crc32c(data, value=0) -> int: CRC-32C of data, carried on from value."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

PyMODINIT_FUNC PyInit__records(void) {
    const char *pure = getenv("TFRFS_CRC_TABLES");   /* the tests: the table path on any processor */
    crc32c_init(pure != NULL && *pure);
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "HARDWARE_CRC", crc32c != crc32c_tables) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
