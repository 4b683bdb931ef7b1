/* The table of tfrfs.fuse._answer (_answer.c, which includes this file once): its entries, kept
 * in two hash tables (by parent and name, by node id) and used in turn (the oldest goes first), and
 * the bytes they answer reads with (in memory, or a range of an open file, each with a reference
 * count). Read and changed only while ``lock`` is held: by the Python side with the GIL held too,
 * by the answers without it (they never take the GIL while they hold the lock). */
#ifndef TFRFS_ANSWER_TABLE_H
#define TFRFS_ANSWER_TABLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define OP_LOOKUP 1
#define OP_GETATTR 3
#define OP_READ 15
#define OP_READDIRPLUS 44
#define NAMELESS UINT64_MAX    /* the parent of an entry held for its listing alone */
#define IN_SIZE 40
#define OUT_SIZE 16
#define ATTR_SIZE 88 /* struct fuse_attr */

/* An open file the table reads from: a duplicate of the caller's descriptor, one for every file
 * (found again by its device and inode numbers), closed with its last reference. */
typedef struct {
    long refs;
    int fd;
    dev_t dev;
    ino_t ino;
    long entries;       /* entries of the table that read from it (changed with the lock held) */
} handle;

/* A file's bytes: held in memory, or a range of an open file. */
typedef struct {
    long refs;
    handle *file;       /* NULL: the bytes follow */
    uint64_t offset;    /* in file */
    uint64_t length;
    char bytes[];
} source;

typedef struct {
    uint64_t parent, nodeid;
    char *name;
    uint32_t name_len;
    unsigned char attr[ATTR_SIZE];
    uint64_t entry_valid, attr_valid;
    uint32_t entry_nsec, attr_nsec;
    source *content;    /* NULL: a folder */
    uint64_t lookups;   /* lookups answered here that the kernel has not forgotten */
    int32_t next_name, next_node;  /* hash chains (-1: end) */
    int used;
    /* a folder's whole listing (fuse_direntplus entries), the position of its last entry, and
     * the node ids it hands the kernel (each one lookup, counted where the table holds it) */
    char *page;
    uint32_t page_len, n_children;
    uint64_t last_off;
    uint64_t *children;
} entry;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    int fd;
    int32_t cap, next;          /* entries are used in turn: the oldest goes first */
    int32_t count;
    entry *entries;
    int32_t *name_heads, *node_heads;
    uint32_t mask;
    uint64_t *evicted;          /* (nodeid, lookups) pairs not yet taken by evicted() */
    Py_ssize_t n_evicted, cap_evicted;
    handle **files;             /* the open files entries read from */
    Py_ssize_t n_files, cap_files;
} Table;

static __thread char *read_buf;
static __thread size_t read_buf_size;

static void handle_release(handle *h) {
    if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        close(h->fd);
        free(h);
    }
}

static void source_release(source *s) {
    if (s && __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        if (s->file)
            handle_release(s->file);
        free(s);
    }
}

/* The table's handle on the file open as ``fd`` (a new one if it has none), with one more
 * reference for the caller; NULL and an exception set on failure. GIL and lock held. */
static handle *file_of(Table *t, int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < t->n_files; i++) {
        handle *h = t->files[i];
        if (h->dev == st.st_dev && h->ino == st.st_ino) {
            __atomic_add_fetch(&h->refs, 1, __ATOMIC_ACQ_REL);
            h->entries++;
            return h;
        }
    }
    if (t->n_files == t->cap_files) {
        Py_ssize_t cap = t->cap_files ? 2 * t->cap_files : 16;
        handle **grown = realloc(t->files, cap * sizeof(handle *));
        if (!grown) {
            PyErr_NoMemory();
            return NULL;
        }
        t->files = grown;
        t->cap_files = cap;
    }
    handle *h = malloc(sizeof(handle));
    if (!h) {
        PyErr_NoMemory();
        return NULL;
    }
    h->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (h->fd < 0) {
        free(h);
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    h->dev = st.st_dev;
    h->ino = st.st_ino;
    h->refs = 2;        /* the table's, and the caller's */
    h->entries = 1;
    t->files[t->n_files++] = h;
    return h;
}

/* An entry reading from ``h`` is gone: the last one lets the table's handle go. Lock held. */
static void file_unused(Table *t, handle *h) {
    if (--h->entries > 0)
        return;
    for (Py_ssize_t i = 0; i < t->n_files; i++) {
        if (t->files[i] == h) {
            t->files[i] = t->files[--t->n_files];
            break;
        }
    }
    handle_release(h);
}

static uint32_t name_hash(uint64_t parent, const char *name, uint32_t len) {
    uint64_t h = 1469598103934665603ULL ^ parent;
    for (uint32_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 1099511628211ULL;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static uint32_t node_hash(uint64_t nodeid) {
    uint64_t h = nodeid * 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(h >> 32);
}

static int32_t find_name(Table *t, uint64_t parent, const char *name, uint32_t len) {
    for (int32_t i = t->name_heads[name_hash(parent, name, len) & t->mask]; i >= 0; i = t->entries[i].next_name) {
        entry *e = &t->entries[i];
        if (e->parent == parent && e->name_len == len && memcmp(e->name, name, len) == 0)
            return i;
    }
    return -1;
}

static int32_t find_node(Table *t, uint64_t nodeid) {
    for (int32_t i = t->node_heads[node_hash(nodeid) & t->mask]; i >= 0; i = t->entries[i].next_node)
        if (t->entries[i].nodeid == nodeid)
            return i;
    return -1;
}

static void unchain(int32_t *head, entry *entries, int32_t k, int by_name) {
    int32_t *at = head;
    while (*at >= 0) {
        if (*at == k) {
            *at = by_name ? entries[k].next_name : entries[k].next_node;
            return;
        }
        at = by_name ? &entries[*at].next_name : &entries[*at].next_node;
    }
}

static int note_evicted(Table *t, uint64_t nodeid, uint64_t lookups) {
    if (t->n_evicted + 2 > t->cap_evicted) {
        Py_ssize_t cap = t->cap_evicted ? 2 * t->cap_evicted : 256;
        uint64_t *grown = realloc(t->evicted, cap * sizeof(uint64_t));
        if (!grown)
            return -1;
        t->evicted = grown;
        t->cap_evicted = cap;
    }
    t->evicted[t->n_evicted++] = nodeid;
    t->evicted[t->n_evicted++] = lookups;
    return 0;
}

static int drop(Table *t, int32_t k) {
    entry *e = &t->entries[k];
    if (!e->used)
        return 0;
    if (note_evicted(t, e->nodeid, e->lookups) < 0)
        return -1;
    if (e->parent != NAMELESS)
        unchain(&t->name_heads[name_hash(e->parent, e->name, e->name_len) & t->mask], t->entries, k, 1);
    unchain(&t->node_heads[node_hash(e->nodeid) & t->mask], t->entries, k, 0);
    free(e->name);
    free(e->page);
    free(e->children);
    if (e->content && e->content->file)
        file_unused(t, e->content->file);
    source_release(e->content);
    memset(e, 0, sizeof *e);
    t->count--;
    return 0;
}

/* What an entry answers reads with: a copy of ``data`` (not None), or ``length`` bytes at
 * ``offset`` of the file open as ``fd`` (>= 0); *content NULL for neither (a folder, or a file
 * Python reads). 0, or -1 with an exception set. GIL held, the table's lock not. */
static int source_of(PyObject *data, int fd, uint64_t offset, uint64_t length, source **content) {
    *content = NULL;
    if (data != Py_None) {
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
            return -1;
        *content = malloc(sizeof(source) + view.len);
        if (*content) {
            memcpy((*content)->bytes, view.buf, view.len);
            length = view.len;
            offset = 0;
        }
        PyBuffer_Release(&view);
    } else if (fd >= 0) {
        *content = malloc(sizeof(source));
    } else {
        return 0;
    }
    if (!*content) {
        PyErr_NoMemory();
        return -1;
    }
    (*content)->refs = 1;
    (*content)->file = NULL;
    (*content)->offset = offset;
    (*content)->length = length;
    return 0;
}

/* Whether the table was never set up (its __init__ failed or was not called): 1, an exception set. */
static int not_set_up(Table *self) {
    if (self->entries)
        return 0;
    PyErr_SetString(PyExc_ValueError, "the table is not set up");
    return 1;
}

/* Put an entry in the table, taking ``name`` and ``content`` (whose file, for ``fd`` >= 0, is
 * found here): 1; 0 if the name or the node is there already (the caller frees both); -1 with an
 * exception set. Lock held. */
static int add_entry(Table *self, uint64_t parent, char *name, uint32_t name_len, uint64_t nodeid,
                     const char *attr, uint64_t ev, uint32_t evn, uint64_t av, uint32_t avn, source *content, int fd) {
    if (find_name(self, parent, name, name_len) >= 0 || find_node(self, nodeid) >= 0)
        return 0;
    if (content && fd >= 0 && !(content->file = file_of(self, fd)))
        return -1;
    int32_t k = self->next;
    entry *e = &self->entries[k];
    if (drop(self, k) < 0) {
        if (content && content->file) {
            file_unused(self, content->file);
            handle_release(content->file);   /* the reference file_of gave for content */
            content->file = NULL;
        }
        PyErr_NoMemory();
        return -1;
    }
    self->next = (self->next + 1) % self->cap;
    e->name = name;
    e->name_len = name_len;
    e->parent = parent;
    e->nodeid = nodeid;
    memcpy(e->attr, attr, ATTR_SIZE);
    e->entry_valid = ev;
    e->entry_nsec = evn;
    e->attr_valid = av;
    e->attr_nsec = avn;
    e->content = content;
    e->lookups = 0;
    e->used = 1;
    uint32_t h = name_hash(parent, name, name_len) & self->mask;
    e->next_name = self->name_heads[h];
    self->name_heads[h] = k;
    h = node_hash(nodeid) & self->mask;
    e->next_node = self->node_heads[h];
    self->node_heads[h] = k;
    self->count++;
    return 1;
}

/* Give folder ``nodeid`` its whole listing ``page`` (taken, with ``ids``, the node ids it names):
 * 0; -1 if out of memory (the caller frees both). A folder the table holds no entry for (a
 * record's) gets one for its listing alone. Lock held. */
static int set_page(Table *self, uint64_t nodeid, char *page, uint32_t page_len, uint64_t last_off,
                    uint64_t *ids, uint32_t n) {
    int32_t k = find_node(self, nodeid);
    if (k < 0) {
        char *nameless = malloc(1);
        if (!nameless)
            return -1;
        k = self->next;
        entry *e = &self->entries[k];
        if (drop(self, k) < 0) {
            free(nameless);
            return -1;
        }
        self->next = (self->next + 1) % self->cap;
        e->name = nameless;
        e->name_len = 0;
        e->parent = NAMELESS;
        e->nodeid = nodeid;
        e->used = 1;
        uint32_t h = node_hash(nodeid) & self->mask;
        e->next_name = -1;
        e->next_node = self->node_heads[h];
        self->node_heads[h] = k;
        self->count++;
    }
    entry *e = &self->entries[k];
    free(e->page);
    free(e->children);
    e->page = page;
    e->page_len = page_len;
    e->last_off = last_off;
    e->children = ids;
    e->n_children = n;
    return 0;
}

#endif
