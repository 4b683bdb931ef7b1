/* The Example encoding as protobuf serializers write it (as ``wire.py`` follows it), read in C:
 * shared by ``_example.c`` (a record's files and values) and ``_records.c`` (the walk of a shard's
 * records: the parse check and the schema tally). Everything here answers 0 or -1 for what it does
 * not follow, and the caller then leaves that record to protobuf and the Python path. */
#ifndef TFRFS_EXAMPLE_WIRE_H
#define TFRFS_EXAMPLE_WIRE_H

#include <Python.h>

#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif


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

/* SPEC 3.2's image and sound suffixes, in ``media``'s numbering. */
static const char *MEDIA_NAMES[] = {".jpg", ".png", ".gif", ".bmp", ".webp", ".tif", ".wav", ".flac", ".mp3", ".ogg"};
enum { JPG, PNG, GIF, BMP, WEBP, TIF, WAV, FLAC, MP3, OGG, N_MEDIA };

/* ``varint`` of two bytes or more. */
static int varint_long(const uint8_t *p, size_t end, size_t *pos, uint64_t *out) {
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

/* The varint at ``*pos``: 0 when it runs past ``end`` or past 64 bits. (Most are one byte: that
 * case inline, the rest in ``varint_long``.) */
static inline int varint(const uint8_t *p, size_t end, size_t *pos, uint64_t *out) {
    size_t at = *pos;
    if (at < end && p[at] < 0x80) {
        *out = p[at];
        *pos = at + 1;
        return 1;
    }
    if (end - at >= 2 && p[at + 1] < 0x80) {   /* (p[at] has its high bit, or at == end) */
        *out = (uint64_t)(p[at] & 0x7F) | (uint64_t)p[at + 1] << 7;
        *pos = at + 2;
        return 1;
    }
    return varint_long(p, end, pos, out);
}

/* The length-delimited field with one-byte ``tag`` at ``*pos``: 0 when another is there. */
static inline int field(const uint8_t *p, size_t end, size_t *pos, uint8_t tag, span *out) {
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

/* Valid UTF-8 (as Python's strict decoder has it), with no NUL byte unless ``nul_ok`` (protobuf's
 * check of a string field allows one; a text file is not one with it). */
static int utf8_valid(const uint8_t *s, size_t n, int nul_ok) {
    size_t i = 0;
    while (i < n) {
#ifdef __SSE2__
        /* Sixteen ASCII bytes at a time (every x86-64 processor): no high bit, and no zero byte. */
        while (i + 16 <= n) {
            __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
            if (_mm_movemask_epi8(v) | _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128())))
                break;
            i += 16;
        }
#endif
        /* Eight ASCII bytes at a time: no high bit, and no zero byte. */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if ((w & 0x8080808080808080ull) || ((w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull))
                break;
            i += 8;
        }
        if (i >= n)
            break;
        uint8_t b = s[i];
        if (b < 0x80) {
            if (b == 0 && !nul_ok)
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

/* A key as protobuf's parse checks it (``utf8_valid`` with NUL allowed): a short ASCII one, the
 * usual case, at once. */
static inline int key_valid(const uint8_t *s, size_t n) {
    if (n <= 16) {
        uint8_t any = 0;
        for (size_t i = 0; i < n; i++)
            any |= s[i];
        if (!(any & 0x80))
            return 1;
    }
    return utf8_valid(s, n, 1);
}

/* Text as a file shows it (SPEC 3.2): valid UTF-8 with no NUL byte. */
static int is_text(const uint8_t *s, size_t n) {
    return utf8_valid(s, n, 0);
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

#endif
