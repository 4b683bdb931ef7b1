/* A record's folder put in the table at once (tfrfs.fuse._answer, included once by _answer.c):
 * ``Table.add_folder`` takes every entry of one folder of a record, packs each one's attributes
 * and the folder's whole readdirplus listing here, and adds them as ``add`` and ``add_page`` would,
 * under one taking of the lock. The Python side (answers.Sheets) gives only what a stat holds. */
#ifndef TFRFS_ANSWER_FOLDER_H
#define TFRFS_ANSWER_FOLDER_H

#include "_answer_table.h"

/* struct fuse_attr of a file or folder of a record, as requests.attr_fields packs the stat the
 * tree gives it (Operations._attrs: its three times are one), with no rdev and no flags. */
static void pack_attr(unsigned char *out, uint64_t ino, uint64_t size, uint64_t blocks, int64_t mtime_ns,
                      uint32_t mode, uint32_t nlink, uint32_t uid, uint32_t gid, uint32_t blksize) {
    int64_t sec = mtime_ns / 1000000000, nsec = mtime_ns % 1000000000;
    if (nsec < 0) {   /* (floored, as Python divides) */
        nsec += 1000000000;
        sec -= 1;
    }
    uint64_t q[6] = {ino, size, blocks, (uint64_t)sec, (uint64_t)sec, (uint64_t)sec};
    uint32_t i[10] = {(uint32_t)nsec, (uint32_t)nsec, (uint32_t)nsec, mode, nlink, uid, gid, 0, blksize, 0};
    memcpy(out, q, sizeof q);
    memcpy(out + sizeof q, i, sizeof i);
}

#define PLUS_HEAD 152   /* struct fuse_direntplus without its name */

/* A readdirplus entry at ``out`` (PLUS_HEAD + the name padded to 8 bytes, zeroed by the caller). */
static void pack_plus(unsigned char *out, uint64_t nodeid, uint64_t ev, uint32_t evn, uint64_t av, uint32_t avn,
                      const unsigned char *attr, uint64_t position, const char *name, uint32_t name_len) {
    uint64_t head[4] = {nodeid, 0, ev, av};
    uint32_t nsec[2] = {evn, avn};
    memcpy(out, head, sizeof head);
    memcpy(out + 32, nsec, sizeof nsec);
    memcpy(out + 40, attr, ATTR_SIZE);
    uint32_t mode;
    memcpy(&mode, attr + 48 + 12, 4);
    uint64_t dirent[2];
    memcpy(&dirent[0], attr, 8);   /* its inode number */
    dirent[1] = position;
    uint32_t tail[2] = {name_len, (mode & S_IFMT) >> 12};
    memcpy(out + 40 + ATTR_SIZE, dirent, sizeof dirent);
    memcpy(out + 40 + ATTR_SIZE + 16, tail, sizeof tail);
    memcpy(out + PLUS_HEAD, name, name_len);
}

static uint32_t plus_size(uint32_t name_len) { return PLUS_HEAD + ((name_len + 7) & ~7u); }

typedef struct {
    char *name;
    uint32_t name_len;
    uint64_t nodeid;
    unsigned char attr[ATTR_SIZE];
    source *content;
    int fd;
} row;

static void rows_free(row *rows, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        free(rows[i].name);
        free(rows[i].content);
    }
}

/* Row ``r`` from Python's tuple (its name and bytes copied): 0, or -1 with an exception set. */
static int row_of(PyObject *given, row *r, uint64_t *position, size_t *page_len) {
    unsigned long long pos, nodeid, ino, size, blocks, offset, length;
    long long mtime_ns;
    unsigned int mode, nlink, uid, gid, blksize;
    const char *name;
    Py_ssize_t name_len;
    PyObject *data;
    int fd;
    if (!PyArg_ParseTuple(given, "Ky#KKIKKLIIIIOiKK", &pos, &name, &name_len, &nodeid, &ino, &mode, &size, &blocks,
                          &mtime_ns, &nlink, &uid, &gid, &blksize, &data, &fd, &offset, &length))
        return -1;
    *position = pos;
    r->nodeid = nodeid;
    r->fd = fd;
    pack_attr(r->attr, ino, size, blocks, mtime_ns, mode, nlink, uid, gid, blksize);
    r->name = malloc(name_len ? name_len : 1);
    if (!r->name) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(r->name, name, name_len);
    r->name_len = (uint32_t)name_len;
    *page_len += plus_size((uint32_t)name_len);
    return source_of(data, fd, offset, length, &r->content);
}

/* One folder of a record at once: every entry of ``rows`` put in the table (as add() would), and
 * the folder's whole listing ("." and ".." first) made from them (as add_page() takes it). */
static PyObject *Table_add_folder(Table *self, PyObject *args) {
    unsigned long long folder, dot, dotdot, ev, av;
    unsigned int evn, avn;
    PyObject *given;
    if (!PyArg_ParseTuple(args, "KKKO(KIKI)", &folder, &dot, &dotdot, &given, &ev, &evn, &av, &avn)
            || not_set_up(self))
        return NULL;
    PyObject *seq = PySequence_Fast(given, "rows: a sequence of tuples");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *left = NULL;   /* the node ids not added (there already, or no room): the caller
                                gives those lookups back */
    unsigned char *page = NULL;
    uint64_t *ids = NULL;
    row *rows = calloc(n ? n : 1, sizeof(row));   /* (zeroed: a row not reached frees nothing) */
    uint64_t *positions = malloc((n ? n : 1) * sizeof(uint64_t));
    size_t page_len = plus_size(1) + plus_size(2);
    if (!rows || !positions) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)   /* names and bytes copied before the lock is taken */
        if (row_of(PySequence_Fast_GET_ITEM(seq, i), &rows[i], &positions[i], &page_len) < 0)
            goto done;
    if (page_len <= 4096 && n <= 64) {   /* the listing, unless too large to hold (Python lists it) */
        page = calloc(1, page_len);
        ids = malloc((n ? n : 1) * sizeof(uint64_t));
        if (!page || !ids) {
            PyErr_NoMemory();
            goto done;
        }
        unsigned char attr[ATTR_SIZE];
        size_t at = 0;
        uint64_t ends[2] = {dot, dotdot};
        for (int k = 0; k < 2; k++) {   /* "." and ".." as readdir packs them */
            pack_attr(attr, ends[k], 0, 0, 0, S_IFDIR, 1, 0, 0, 0);
            pack_plus(page + at, 0, ev, evn, av, avn, attr, k + 1, "..", k + 1);
            at += plus_size(k + 1);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            pack_plus(page + at, rows[i].nodeid, ev, evn, av, avn, rows[i].attr, positions[i], rows[i].name,
                      rows[i].name_len);
            at += plus_size(rows[i].name_len);
            ids[i] = rows[i].nodeid;
        }
    }
    if (!(left = PyList_New(0)))
        goto done;
    pthread_mutex_lock(&self->lock);
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        row *r = &rows[i];
        int added = add_entry(self, folder, r->name, r->name_len, r->nodeid, (const char *)r->attr, ev, evn, av, avn,
                              r->content, r->fd);
        if (added > 0) {   /* taken by the table */
            r->name = NULL;
            r->content = NULL;
        }
        failed = added < 0;   /* out of memory, or the file cannot be held open: the rest to Python */
    }
    uint64_t last = n ? positions[n - 1] : 2;
    if (page && !failed && set_page(self, folder, (char *)page, (uint32_t)page_len, last, ids, (uint32_t)n) == 0) {
        page = NULL;
        ids = NULL;
    }
    pthread_mutex_unlock(&self->lock);
    if (failed)
        PyErr_Clear();
    for (Py_ssize_t i = 0; i < n && left; i++) {
        if (rows[i].name) {   /* not added */
            PyObject *id = PyLong_FromUnsignedLongLong(rows[i].nodeid);
            if (!id || PyList_Append(left, id) < 0)
                Py_CLEAR(left);
            Py_XDECREF(id);
        }
    }
done:
    Py_DECREF(seq);
    free(page);
    free(ids);
    if (rows)
        rows_free(rows, n);
    free(rows);
    free(positions);
    return left;
}

#endif
