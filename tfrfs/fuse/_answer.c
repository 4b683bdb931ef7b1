/* tfrfs.fuse._answer: a read-only mount's lookups, attributes and reads answered in C from a
 * table the Python side fills (see tfrfs/fuse/answers.py, which says what goes in and why).
 *
 * The kernel's requests and answers are laid out as linux/fuse.h has them: fuse_in_header
 * (len, opcode, unique, nodeid, uid, gid, pid, padding: 40 bytes), then the request's own struct;
 * fuse_out_header (len, error, unique: 16 bytes), then fuse_entry_out, fuse_attr_out or the bytes
 * read. Requests are answered without the GIL, by ``serve`` (a loop reading the device) or by
 * ``answer``; the table is read and changed with its lock held, and the bytes a read answers with
 * are kept alive by a reference count while they are read and written, the lock let go.
 */
#include "_answer_table.h"
#include "_answer_folder.h"

#include <poll.h>
#include <time.h>

/* -- answers -------------------------------------------------------------------------- */

static void send_answer(int fd, uint64_t unique, int error, const void *body, size_t size) {
    unsigned char head[OUT_SIZE];
    uint32_t len = (uint32_t)(OUT_SIZE + size);
    int32_t err = -error;
    memcpy(head, &len, 4);
    memcpy(head + 4, &err, 4);
    memcpy(head + 8, &unique, 8);
    struct iovec iov[2] = {{head, OUT_SIZE}, {(void *)body, size}};
    /* Errors are not the reader's: ENOENT is an interrupted request nobody waits for. */
    (void)!writev(fd, iov, size ? 2 : 1);
}

/* ``count`` bytes of file source ``s`` from ``offset``, into this thread's buffer (``read_buf``);
 * fewer at the file's end. 0, or an errno. Called with the GIL let go. */
static int read_range(source *s, uint64_t offset, uint64_t count, size_t *got) {
    if (read_buf_size < count || !read_buf) {
        size_t grow = count < (1 << 17) ? (1 << 17) : count;
        char *b = realloc(read_buf, grow);
        if (!b)
            return ENOMEM;
        read_buf = b;
        read_buf_size = grow;
    }
    while (*got < count) {
        ssize_t r = pread(s->file->fd, read_buf + *got, count - *got, s->offset + offset + *got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return errno ? errno : EIO;
        if (r == 0)
            break;
        *got += r;
    }
    return 0;
}

/* 1: answered; 0: not in the table (Python answers). Called without the GIL; takes the lock
 * to find the entry and copy what the answer needs, and lets it go before the read and the write. */
static int answer(Table *t, const unsigned char *raw, size_t size) {
    if (size < IN_SIZE)
        return 0;
    uint32_t opcode;
    uint64_t unique, nodeid;
    memcpy(&opcode, raw + 4, 4);
    memcpy(&unique, raw + 8, 8);
    memcpy(&nodeid, raw + 16, 8);
    if (opcode == OP_LOOKUP) {
        const char *name = (const char *)raw + IN_SIZE;
        const char *end = memchr(name, 0, size - IN_SIZE);
        uint32_t len = (uint32_t)(end ? (size_t)(end - name) : size - IN_SIZE);
        unsigned char out[40 + ATTR_SIZE];   /* fuse_entry_out */
        pthread_mutex_lock(&t->lock);
        int32_t k = find_name(t, nodeid, name, len);
        if (k < 0) {
            pthread_mutex_unlock(&t->lock);
            return 0;
        }
        entry *e = &t->entries[k];
        uint64_t generation = 0;
        memcpy(out, &e->nodeid, 8);
        memcpy(out + 8, &generation, 8);
        memcpy(out + 16, &e->entry_valid, 8);
        memcpy(out + 24, &e->attr_valid, 8);
        memcpy(out + 32, &e->entry_nsec, 4);
        memcpy(out + 36, &e->attr_nsec, 4);
        memcpy(out + 40, e->attr, ATTR_SIZE);
        e->lookups++;
        pthread_mutex_unlock(&t->lock);
        send_answer(t->fd, unique, 0, out, sizeof out);
        return 1;
    }
    if (opcode == OP_GETATTR) {
        unsigned char out[16 + ATTR_SIZE];   /* fuse_attr_out */
        pthread_mutex_lock(&t->lock);
        int32_t k = find_node(t, nodeid);
        if (k < 0 || t->entries[k].parent == NAMELESS) {
            pthread_mutex_unlock(&t->lock);
            return 0;
        }
        entry *e = &t->entries[k];
        uint32_t dummy = 0;
        memcpy(out, &e->attr_valid, 8);
        memcpy(out + 8, &e->attr_nsec, 4);
        memcpy(out + 12, &dummy, 4);
        memcpy(out + 16, e->attr, ATTR_SIZE);
        pthread_mutex_unlock(&t->lock);
        send_answer(t->fd, unique, 0, out, sizeof out);
        return 1;
    }
    uint64_t offset = 0;   /* fuse_read_in (READ, READDIRPLUS): fh, offset, size */
    uint32_t want = 0;
    if (opcode == OP_READDIRPLUS || opcode == OP_READ) {
        if (size < IN_SIZE + 20)
            return 0;
        memcpy(&offset, raw + IN_SIZE + 8, 8);
        memcpy(&want, raw + IN_SIZE + 16, 4);
    }
    if (opcode == OP_READDIRPLUS) {
        char copy[4096];   /* (add_page holds pages of at most 4 KiB) */
        uint32_t length = 0;
        pthread_mutex_lock(&t->lock);
        int32_t k = find_node(t, nodeid);
        entry *e = k < 0 ? NULL : &t->entries[k];
        int found = e && e->page;
        if (found && offset == e->last_off) {   /* after the last entry: the end */
            pthread_mutex_unlock(&t->lock);
            send_answer(t->fd, unique, 0, NULL, 0);
            return 1;
        }
        int32_t held[64];
        found = found && offset == 0 && want >= e->page_len && e->n_children <= 64;
        for (uint32_t i = 0; found && i < e->n_children; i++) {   /* every node it names must be here */
            held[i] = find_node(t, e->children[i]);
            found = held[i] >= 0;
        }
        if (found) {
            for (uint32_t i = 0; i < e->n_children; i++)
                t->entries[held[i]].lookups++;
            length = e->page_len;
            memcpy(copy, e->page, length);
        }
        pthread_mutex_unlock(&t->lock);
        if (!found)
            return 0;
        send_answer(t->fd, unique, 0, copy, length);
        return 1;
    }
    if (opcode == OP_READ) {
        pthread_mutex_lock(&t->lock);
        int32_t k = find_node(t, nodeid);
        source *s = k < 0 ? NULL : t->entries[k].content;
        if (s)   /* kept while it is read, should the entry go meanwhile */
            __atomic_add_fetch(&s->refs, 1, __ATOMIC_ACQ_REL);
        pthread_mutex_unlock(&t->lock);
        if (!s)
            return 0;
        uint64_t count = offset >= s->length ? 0 : s->length - offset;
        if (count > want)
            count = want;
        if (!s->file) {
            send_answer(t->fd, unique, 0, count ? s->bytes + offset : NULL, count);
        } else {
            size_t got = 0;
            int error = read_range(s, offset, count, &got);
            send_answer(t->fd, unique, error, error ? NULL : read_buf, error ? 0 : got);
        }
        source_release(s);
        return 1;
    }
    return 0;
}

/* Read requests from the device into ``buf`` and answer those the table holds, until one it does
 * not hold (its size, for Python to answer), or the device fails: -errno (EINTR: a signal for
 * Python to handle), or 0 once the file system is unmounted. Before each read, with ``spin_us``,
 * watch the device that long for the next request rather than sleep in read() at once. Without
 * the GIL. */
/* How often watching the device found the next request in time, per worker, out of SPIN_FULL
 * (a moving average, an eighth for each watch). Watching costs the CPU it spins for, and pays only
 * where requests follow each other closely (a reader going through small files); where most come
 * later (a training loop decoding each image between its reads, which needs that CPU) the worker
 * sleeps at once, but for one watch now and then to find out whether that changed. */
#define SPIN_FULL 256
#define SPIN_WORTH (SPIN_FULL * 3 / 4)
static __thread int spin_found = SPIN_FULL;

static ssize_t serve(Table *t, unsigned char *buf, size_t size, long spin_us) {
    struct pollfd watch = {.fd = t->fd, .events = POLLIN};
    for (;;) {
        if (spin_us > 0 && spin_found < SPIN_WORTH) {
            spin_found += 2;   /* (sleeping at once: the next watch comes nearer) */
        } else if (spin_us > 0) {
            struct timespec now, until;
            int found = 0;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += spin_us * 1000;
            until.tv_sec += until.tv_nsec / 1000000000;
            until.tv_nsec %= 1000000000;
            do {
                if (poll(&watch, 1, 0) != 0) {
                    found = 1;
                    break;
                }
                clock_gettime(CLOCK_MONOTONIC, &now);
            } while (now.tv_sec < until.tv_sec || (now.tv_sec == until.tv_sec && now.tv_nsec < until.tv_nsec));
            spin_found += (found ? SPIN_FULL / 8 : 0) - spin_found / 8;
        }
        ssize_t n = read(t->fd, buf, size);
        if (n < 0) {
            if (errno == ENOENT)   /* a request interrupted before it was read: the next */
                continue;
            return errno == ENODEV ? 0 : -errno;
        }
        if (n == 0)
            return 0;
        if (!answer(t, buf, (size_t)n))
            return n;
    }
}

/* -- the Python type ------------------------------------------------------------------- */

static int Table_init(Table *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"fd", "capacity", NULL};
    int fd, cap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ii", names, &fd, &cap))
        return -1;
    if (cap < 1 || cap > (1 << 26)) {
        PyErr_SetString(PyExc_ValueError, "capacity: 1 to 2**26 entries");
        return -1;
    }
    uint32_t slots = 1;
    while (slots < (uint32_t)cap * 2)
        slots <<= 1;
    if (self->entries) {
        PyErr_SetString(PyExc_ValueError, "the table is set up already");
        return -1;
    }
    pthread_mutex_init(&self->lock, NULL);
    self->fd = fd;
    self->cap = cap;
    self->entries = calloc(cap, sizeof(entry));
    self->name_heads = malloc(slots * sizeof(int32_t));
    self->node_heads = malloc(slots * sizeof(int32_t));
    if (!self->entries || !self->name_heads || !self->node_heads) {
        PyErr_NoMemory();
        return -1;
    }
    memset(self->name_heads, 0xff, slots * sizeof(int32_t));
    memset(self->node_heads, 0xff, slots * sizeof(int32_t));
    self->mask = slots - 1;
    return 0;
}

static void Table_dealloc(Table *self) {
    if (self->entries) {
        for (int32_t k = 0; k < self->cap; k++) {
            if (self->entries[k].used) {
                free(self->entries[k].name);
                source_release(self->entries[k].content);
            }
        }
    }
    for (Py_ssize_t i = 0; i < self->n_files; i++)
        handle_release(self->files[i]);
    free(self->files);
    free(self->entries);
    free(self->name_heads);
    free(self->node_heads);
    free(self->evicted);
    if (self->entries)
        pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Table_add(Table *self, PyObject *args) {
    unsigned long long parent, nodeid, ev, av, offset, length;
    unsigned int evn, avn;
    const char *name, *attr;
    Py_ssize_t name_len, attr_len;
    PyObject *data;
    int fd;
    if (!PyArg_ParseTuple(args, "Ky#Ky#KIKIOiKK", &parent, &name, &name_len, &nodeid, &attr, &attr_len,
                          &ev, &evn, &av, &avn, &data, &fd, &offset, &length))
        return NULL;
    if (attr_len != ATTR_SIZE) {
        PyErr_SetString(PyExc_ValueError, "attr: a packed fuse_attr of 88 bytes");
        return NULL;
    }
    if (not_set_up(self))
        return NULL;
    source *content;   /* the bytes copied before the lock is taken */
    if (source_of(data, fd, offset, length, &content) < 0)
        return NULL;
    char *copy = malloc(name_len ? name_len : 1);
    if (!copy) {
        free(content);
        return PyErr_NoMemory();
    }
    memcpy(copy, name, name_len);
    pthread_mutex_lock(&self->lock);
    int added = add_entry(self, parent, copy, (uint32_t)name_len, nodeid, attr, ev, evn, av, avn, content, fd);
    pthread_mutex_unlock(&self->lock);
    if (added <= 0) {
        free(copy);
        free(content);
    }
    if (added < 0)
        return NULL;
    return PyBool_FromLong(added);
}

static PyObject *Table_add_page(Table *self, PyObject *args) {
    unsigned long long nodeid, last_off;
    const char *page;
    Py_ssize_t page_len;
    PyObject *children;
    if (!PyArg_ParseTuple(args, "Ky#KO", &nodeid, &page, &page_len, &last_off, &children))
        return NULL;
    if (not_set_up(self))
        return NULL;
    PyObject *seq = PySequence_Fast(children, "children: a sequence of node ids");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (page_len > 4096 || n > 64) {
        Py_DECREF(seq);
        Py_RETURN_FALSE;   /* answered by Python */
    }
    uint64_t *ids = malloc((n ? n : 1) * sizeof(uint64_t));
    char *copy = malloc(page_len ? page_len : 1);
    if (!ids || !copy) {
        free(ids);
        free(copy);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ids[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (PyErr_Occurred()) {
            free(ids);
            free(copy);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    memcpy(copy, page, page_len);
    pthread_mutex_lock(&self->lock);
    int set = set_page(self, nodeid, copy, (uint32_t)page_len, last_off, ids, (uint32_t)n);
    pthread_mutex_unlock(&self->lock);
    if (set < 0) {
        free(ids);
        free(copy);
        return PyErr_NoMemory();
    }
    Py_RETURN_TRUE;
}

static PyObject *Table_answer(Table *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int done = 0;
    if (self->entries) {
        Py_BEGIN_ALLOW_THREADS
        done = answer(self, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(done);
}

static PyObject *Table_answer_at(Table *self, PyObject *args) {
    unsigned long long address;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "Kn", &address, &size))
        return NULL;
    if (!self->entries || !address || size < 0)
        Py_RETURN_FALSE;
    int done;
    Py_BEGIN_ALLOW_THREADS
    done = answer(self, (const unsigned char *)(uintptr_t)address, (size_t)size);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(done);
}

static PyObject *Table_serve(Table *self, PyObject *args) {
    unsigned long long address;
    Py_ssize_t size;
    long spin_us;
    if (!PyArg_ParseTuple(args, "Knl", &address, &size, &spin_us))
        return NULL;
    if (!self->entries || !address || size < 8192) {
        PyErr_SetString(PyExc_ValueError, "serve: a table set up, and a buffer of at least 8 KiB");
        return NULL;
    }
    ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = serve(self, (unsigned char *)(uintptr_t)address, (size_t)size, spin_us);
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(n);
}

static PyObject *Table_forget(Table *self, PyObject *args) {
    unsigned long long nodeid, count;
    if (!PyArg_ParseTuple(args, "KK", &nodeid, &count))
        return NULL;
    if (!self->entries)
        return PyLong_FromLong(0);
    uint64_t taken = 0;
    pthread_mutex_lock(&self->lock);
    int32_t k = find_node(self, nodeid);
    if (k >= 0) {
        entry *e = &self->entries[k];
        taken = count < e->lookups ? count : e->lookups;
        e->lookups -= taken;
    }
    pthread_mutex_unlock(&self->lock);
    return PyLong_FromUnsignedLongLong(taken);
}

static PyObject *Table_evicted(Table *self, PyObject *Py_UNUSED(ignored)) {
    /* taken with the lock held, made into Python objects after (which may run Python code) */
    pthread_mutex_lock(&self->lock);
    Py_ssize_t n = self->n_evicted / 2;
    uint64_t *pairs = self->evicted;
    self->evicted = NULL;
    self->n_evicted = self->cap_evicted = 0;
    pthread_mutex_unlock(&self->lock);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)pairs[2 * i], (unsigned long long)pairs[2 * i + 1]);
        if (!pair)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, pair);
    }
    free(pairs);
    return out;
}

static PyObject *Table_clear(Table *self, PyObject *Py_UNUSED(ignored)) {
    int failed = 0;
    if (self->entries) {
        pthread_mutex_lock(&self->lock);
        for (int32_t k = 0; k < self->cap && !failed; k++)
            failed = drop(self, k) < 0;
        self->next = 0;
        pthread_mutex_unlock(&self->lock);
    }
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static Py_ssize_t Table_len(Table *self) { return self->count; }

static PyObject *Table_files(Table *self, PyObject *Py_UNUSED(ignored)) { return PyLong_FromSsize_t(self->n_files); }

static PyMethodDef Table_methods[] = {
    {"add", (PyCFunction)Table_add, METH_VARARGS,
     "add(parent, name, nodeid, attr, entry_valid, entry_nsec, attr_valid, attr_nsec, data, fd, offset, length)"
     " -> False if the name or the node is there already"},
    {"add_page", (PyCFunction)Table_add_page, METH_VARARGS,
     "add_page(nodeid, page, last_offset, children): a folder's whole listing (fuse_direntplus entries) -> "
     "False if too large to hold"},
    {"add_folder", (PyCFunction)Table_add_folder, METH_VARARGS,
     "add_folder(folder, dot_ino, dotdot_ino, rows, (entry_valid, entry_nsec, attr_valid, attr_nsec)): rows of "
     "(position, name, nodeid, ino, mode, size, blocks, mtime_ns, nlink, uid, gid, blksize, data, fd, offset, "
     "length) added, with the folder's listing -> [node ids not added]"},
    {"answer", (PyCFunction)Table_answer, METH_O, "answer(request bytes) -> True if answered"},
    {"answer_at", (PyCFunction)Table_answer_at, METH_VARARGS, "answer_at(address, size): answer, from memory"},
    {"serve", (PyCFunction)Table_serve, METH_VARARGS,
     "serve(address, size, spin_us): read requests from the device into the buffer at address and answer "
     "those held here, until one that is not (its size), an error (-errno) or the unmount (0)"},
    {"forget", (PyCFunction)Table_forget, METH_VARARGS, "forget(nodeid, count) -> the lookups of count answered here"},
    {"evicted", (PyCFunction)Table_evicted, METH_NOARGS, "[(nodeid, lookups)] of entries dropped since the last call"},
    {"clear", (PyCFunction)Table_clear, METH_NOARGS, "drop every entry (each then in evicted())"},
    {"files", (PyCFunction)Table_files, METH_NOARGS, "how many open files the table holds"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Table_seq = {.sq_length = (lenfunc)Table_len};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tfrfs.fuse._answer.Table",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Entries of a read-only mount, answered from C: Table(fd, capacity)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
    .tp_as_sequence = &Table_seq,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_answer", .m_size = -1};

PyMODINIT_FUNC PyInit__answer(void) {
    if (PyType_Ready(&TableType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
