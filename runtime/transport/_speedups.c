/*
 * Optional C speedups for the two per-record hot paths. Everything here has a pure-Python
 * twin that produces the same result (runtime/transport/packing.py: pack_run, runtime/worker/decoding.py:
 * _records_py); the runtime uses these only after a start-up self-test shows
 * they agree, and tests/unit/test_speedups.py checks the two against each other.
 *
 *   supervisor: bind(message_type, unreadable_exception_class)
 *               pack_frame(head, messages, start, stop) -> bytes
 *       A run of consumed messages (one partition, offset order) -> one columnar msgpack
 *       batch frame, calling the message type's own no-argument C methods (offset, key,
 *       value, headers, timestamp) through their method table: no Python-level call and
 *       no intermediate row per record. Depends on the methods' documented results only,
 *       never on the message type's private struct layout.
 *
 *   worker: build_records(Record, topic, partition, first, offsets, keys, values,
 *                         headers, ts_types, timestamps) -> list[Record]
 *       A decoded frame's columns -> Record objects, filling their __slots__ directly
 *       instead of running Record.__init__ once per record.
 *           copy_records(Record, records) -> list[Record]
 *       Copies of Records for the plugin (runtime/execution/run.py), slot by slot.
 *
 *   both: load_acquire(buffer, index) -> int, store_release(buffer, index, value)
 *       One aligned 8-byte word of a shared-memory table (ring positions, a worker's board)
 *       read with acquire / written with release ordering (runtime/transport/ordered.py): a
 *       reader that sees a published position sees every byte written before it, on any CPU
 *       (x86-64 orders plain stores and loads this way by itself; arm64 does not).
 *
 *   supervisor: exit_later(seconds, code, message, paths), cancel_exit()
 *       Not a hot path: the stop's last resort (runtime/ops/backstop.py). A thread of C
 *       alone that, unless cancelled in time, writes message to stderr, unlinks paths and
 *       ends the process with _exit(code). It never takes the GIL, so it fires even while
 *       another thread holds it for good (confluent-kafka runs librdkafka's assign with the
 *       GIL held inside a rebalance callback, and during close() that call can wait for ever).
 *
 * The msgpack written here is byte-for-byte what msgpack-python's packb(use_bin_type=True)
 * writes for the same Python values (smallest integer form, bin for bytes, str for str).
 *
 * Whatever they are given, both return or raise; they never crash (issue 17; fuzzed against
 * their twins by tests/fuzz, the corpus replayed by tests/unit/test_speedups_corpus.py):
 *   - a message method that fails, or returns with an exception set (confluent-kafka's
 *     headers() for a header name that is not UTF-8), or whose result holds a NULL item (the
 *     list it cached on that failure) raises the bound unreadable(index, field, cause): the
 *     record is the input's fault, and the caller packs around it;
 *   - bind() and build_records() use a method or slot descriptor only when it belongs to the
 *     type (or a base), so a descriptor copied onto another class is refused, not obeyed;
 *   - offsets are computed without signed overflow, whatever integers a frame holds.
 *
 * Runs in: the supervisor (pack_frame) and the workers (build_records), with the GIL held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef PyObject *(*noargs_fn)(PyObject *, PyObject *);

/* The bound message type, its methods, and the exception raised for a record whose fields
 * the client cannot give (set by bind()). */
static PyTypeObject *msg_type = NULL;
static noargs_fn m_offset, m_key, m_value, m_headers, m_timestamp;
static PyObject *unreadable_exc = NULL;

/* ------------------------------------------------------------------ output buffer */

typedef struct {
    PyObject *bytes; /* a bytes object used as the buffer, shrunk to len at the end */
    char *base;
    Py_ssize_t len;
    Py_ssize_t cap;
} Out;

static int out_init(Out *o, Py_ssize_t cap) {
    if (cap < 64)
        cap = 64;
    o->bytes = PyBytes_FromStringAndSize(NULL, cap);
    if (o->bytes == NULL)
        return -1;
    o->base = PyBytes_AS_STRING(o->bytes);
    o->len = 0;
    o->cap = cap;
    return 0;
}

static int out_reserve(Out *o, Py_ssize_t n) {
    if (o->len + n <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap * 2;
    if (cap < o->len + n)
        cap = o->len + n;
    if (_PyBytes_Resize(&o->bytes, cap) < 0)
        return -1; /* o->bytes is NULL now and the error is set */
    o->base = PyBytes_AS_STRING(o->bytes);
    o->cap = cap;
    return 0;
}

static PyObject *out_finish(Out *o) {
    if (_PyBytes_Resize(&o->bytes, o->len) < 0)
        return NULL;
    PyObject *b = o->bytes;
    o->bytes = NULL;
    return b;
}

static void out_abandon(Out *o) { Py_CLEAR(o->bytes); }

static inline void put1(Out *o, uint8_t b) { o->base[o->len++] = (char)b; }

static inline void put_be(Out *o, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--)
        o->base[o->len++] = (char)((v >> (8 * i)) & 0xff);
}

/* ------------------------------------------------------------------ msgpack writers */

static int pack_nil(Out *o) {
    if (out_reserve(o, 1) < 0)
        return -1;
    put1(o, 0xc0);
    return 0;
}

/* The smallest form, as msgpack-python's packer chooses it. */
static int pack_i64(Out *o, int64_t v) {
    if (out_reserve(o, 9) < 0)
        return -1;
    if (v >= 0) {
        uint64_t u = (uint64_t)v;
        if (u < 128) {
            put1(o, (uint8_t)u);
        } else if (u < 256) {
            put1(o, 0xcc); put_be(o, u, 1);
        } else if (u < 65536) {
            put1(o, 0xcd); put_be(o, u, 2);
        } else if (u < 4294967296ULL) {
            put1(o, 0xce); put_be(o, u, 4);
        } else {
            put1(o, 0xcf); put_be(o, u, 8);
        }
    } else if (v >= -32) {
        put1(o, (uint8_t)(int8_t)v);
    } else if (v >= -128) {
        put1(o, 0xd0); put_be(o, (uint64_t)v, 1);
    } else if (v >= -32768) {
        put1(o, 0xd1); put_be(o, (uint64_t)v, 2);
    } else if (v >= -2147483648LL) {
        put1(o, 0xd2); put_be(o, (uint64_t)v, 4);
    } else {
        put1(o, 0xd3); put_be(o, (uint64_t)v, 8);
    }
    return 0;
}

static int pack_array_header(Out *o, Py_ssize_t n) {
    if (out_reserve(o, 5) < 0)
        return -1;
    if (n < 16) {
        put1(o, (uint8_t)(0x90 | n));
    } else if (n < 65536) {
        put1(o, 0xdc); put_be(o, (uint64_t)n, 2);
    } else {
        put1(o, 0xdd); put_be(o, (uint64_t)n, 4);
    }
    return 0;
}

static int pack_raw(Out *o, const char *p, Py_ssize_t n, int is_str) {
    if (n > 0xffffffffLL) {
        PyErr_SetString(PyExc_ValueError, "value too large for a msgpack frame");
        return -1;
    }
    if (out_reserve(o, 5 + n) < 0)
        return -1;
    if (is_str && n < 32) {
        put1(o, (uint8_t)(0xa0 | n));
    } else if (n < 256) {
        put1(o, is_str ? 0xd9 : 0xc4); put_be(o, (uint64_t)n, 1);
    } else if (n < 65536) {
        put1(o, is_str ? 0xda : 0xc5); put_be(o, (uint64_t)n, 2);
    } else {
        put1(o, is_str ? 0xdb : 0xc6); put_be(o, (uint64_t)n, 4);
    }
    memcpy(o->base + o->len, p, (size_t)n);
    o->len += n;
    return 0;
}

/* PyLong_AsLongLongAndOverflow, not PyLong_AsLongLong: on 3.11 the latter converts every
 * multi-digit int (all offsets and timestamps) through _PyLong_AsByteArray, a slow path. */
static int as_i64(PyObject *v, int64_t *out) {
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "expected an int from the message");
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "integer out of the 64-bit range of a frame");
        return -1;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* None, int, bytes, str, list and tuple: all a frame ever holds. */
static int pack_obj(Out *o, PyObject *v, int depth) {
    if (v == NULL) { /* a half-built container (see headers_intact()): refuse, never dereference */
        PyErr_SetString(PyExc_ValueError, "a container with a missing item cannot go in a frame");
        return -1;
    }
    if (v == Py_None)
        return pack_nil(o);
    if (PyBytes_CheckExact(v))
        return pack_raw(o, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), 0);
    if (PyLong_CheckExact(v)) {
        int64_t x;
        if (as_i64(v, &x) < 0)
            return -1;
        return pack_i64(o, x);
    }
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (s == NULL)
            return -1;
        return pack_raw(o, s, n, 1);
    }
    if (depth > 8) {
        PyErr_SetString(PyExc_ValueError, "nesting too deep for a frame");
        return -1;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        if (pack_array_header(o, n) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            if (pack_obj(o, items[i], depth + 1) < 0)
                return -1;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "cannot put %.100s in a frame", Py_TYPE(v)->tp_name);
    return -1;
}

/* ------------------------------------------------------------------ bind */

/* The method's C function, only if the descriptor is the type's own (or a base's): a
 * descriptor copied from another type into this one would be called on objects whose
 * layout it does not know. */
static int bind_method(PyObject *type, const char *name, noargs_fn *out) {
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL)
        return -1;
    int ok = Py_IS_TYPE(d, &PyMethodDescr_Type)
             && (((PyMethodDescrObject *)d)->d_method->ml_flags & ~METH_COEXIST) == METH_NOARGS
             && PyType_IsSubtype((PyTypeObject *)type, ((PyMethodDescrObject *)d)->d_common.d_type);
    if (ok)
        *out = (noargs_fn)(void (*)(void))((PyMethodDescrObject *)d)->d_method->ml_meth;
    Py_DECREF(d); /* the descriptor stays alive in the type's dict, which we keep */
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%.100s.%s is not a C method of the type without arguments",
                     ((PyTypeObject *)type)->tp_name, name);
        return -1;
    }
    return 0;
}

static PyObject *bind(PyObject *self, PyObject *args) {
    PyObject *type, *exc;
    /* The exception class is required: raising anything else for an unreadable record would
     * read as a bug of C, and the Python fallback would then touch the broken message. */
    if (!PyArg_ParseTuple(args, "OO:bind", &type, &exc))
        return NULL;
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the message type");
        return NULL;
    }
    if (!PyExceptionClass_Check(exc)) {
        PyErr_SetString(PyExc_TypeError, "bind(): the second argument must be an exception class");
        return NULL;
    }
    noargs_fn offset, key, value, headers, timestamp;
    if (bind_method(type, "offset", &offset) < 0 || bind_method(type, "key", &key) < 0
        || bind_method(type, "value", &value) < 0 || bind_method(type, "headers", &headers) < 0
        || bind_method(type, "timestamp", &timestamp) < 0)
        return NULL; /* nothing changed: a refused bind keeps the previous binding whole */
    m_offset = offset, m_key = key, m_value = value, m_headers = headers, m_timestamp = timestamp;
    Py_INCREF(type);
    Py_XSETREF(msg_type, (PyTypeObject *)type);
    Py_INCREF(exc);
    Py_XSETREF(unreadable_exc, exc);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ pack_frame */

typedef struct {
    PyObject *key;
    PyObject *value;
    PyObject *headers;
    int64_t offset;
    int64_t ts_type;
    int64_t ts;
} Row;



/* Raise unreadable_exc(index, field, cause) for a record, chained to the error the client
 * raised (if any): the record is the input's fault, and the caller sets it aside. */
#if defined(__GNUC__)
#define COLD __attribute__((cold, noinline))
#else
#define COLD
#endif

static COLD void raise_unreadable(Py_ssize_t index, const char *field, const char *what) {
    PyObject *type, *value, *tb, *cause = NULL, *exc;
    PyErr_Fetch(&type, &value, &tb);
    if (type != NULL) {
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
        if (text == NULL)
            PyErr_Clear();
        cause = PyUnicode_FromFormat("%s: %S", ((PyTypeObject *)type)->tp_name,
                                     text != NULL ? text : Py_None);
        Py_XDECREF(text);
    } else {
        cause = PyUnicode_FromString(what);
    }
    if (cause == NULL) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
        return; /* out of memory: that error stands */
    }
    exc = PyObject_CallFunction(unreadable_exc, "nsO", index, field, cause);
    Py_DECREF(cause);
    if (exc == NULL) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
        return;
    }
    if (value != NULL)
        PyException_SetCause(exc, value); /* steals value */
    Py_XDECREF(type), Py_XDECREF(tb);
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
}

/* A method's result, or NULL with unreadable_exc raised (the client raised). */
static inline PyObject *call_field(noargs_fn fn, PyObject *m, Py_ssize_t index, const char *field) {
    PyObject *v = fn(m, NULL);
    if (v == NULL)
        raise_unreadable(index, field, "the client returned nothing and raised nothing");
    return v;
}

/* No NULL anywhere in a (nested) list or tuple: a half-built container must never be
 * dereferenced, and the Python packer would crash on it. */
static int intact(PyObject *v, int depth) {
    if (!(PyList_Check(v) || PyTuple_Check(v)))
        return 1;
    if (depth > 8)
        return 1; /* too deep for a frame anyway: pack_obj refuses it */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
    PyObject **items = PySequence_Fast_ITEMS(v);
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i] == NULL || !intact(items[i], depth + 1))
            return 0;
    return 1;
}

/* intact(), with the usual shape (a list of (str, bytes) pairs) checked inline. */
static inline int headers_intact(PyObject *h) {
    if (!PyList_CheckExact(h))
        return intact(h, 0);
    Py_ssize_t n = PyList_GET_SIZE(h);
    PyObject **items = PySequence_Fast_ITEMS(h);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = items[i];
        if (pair == NULL)
            return 0;
        if (PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2) {
            PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
            if (name == NULL || value == NULL)
                return 0;
            if (PyUnicode_CheckExact(name) && (PyBytes_CheckExact(value) || value == Py_None))
                continue;
        }
        if (!intact(pair, 1))
            return 0;
    }
    return 1;
}

static int read_row(PyObject *m, Row *r, Py_ssize_t index) {
    PyObject *v = call_field(m_offset, m, index, "offset");
    if (v == NULL)
        return -1;
    int rc = as_i64(v, &r->offset);
    Py_DECREF(v);
    if (rc < 0)
        return -1;
    PyObject *ts = call_field(m_timestamp, m, index, "timestamp");
    if (ts == NULL)
        return -1;
    if (!PyTuple_Check(ts) || PyTuple_GET_SIZE(ts) != 2) {
        Py_DECREF(ts);
        PyErr_SetString(PyExc_TypeError, "timestamp() did not return a (type, ms) pair");
        return -1;
    }
    rc = as_i64(PyTuple_GET_ITEM(ts, 0), &r->ts_type) < 0 || as_i64(PyTuple_GET_ITEM(ts, 1), &r->ts) < 0;
    Py_DECREF(ts);
    if (rc)
        return -1;
    if ((r->key = call_field(m_key, m, index, "key")) == NULL)
        return -1;
    if ((r->value = call_field(m_value, m, index, "value")) == NULL)
        return -1;
    if ((r->headers = call_field(m_headers, m, index, "headers")) == NULL)
        return -1;
    /* A client may return a result AND leave an exception set: confluent-kafka's headers()
     * does so for a header name that is not UTF-8 (its list then holds a tuple whose name is
     * NULL). Checked once per row, after the last call (an error left by any of the calls is
     * still set here; only headers() is known to leave one): ~1 ns, not 5. */
    if (PyErr_Occurred()) {
        raise_unreadable(index, "headers", "");
        return -1;
    }
    if (r->headers != Py_None && !headers_intact(r->headers)) {
        raise_unreadable(index, "headers", "the client returned headers with a missing item");
        return -1;
    }
    return 0;
}

/* How a column is written: nil (it can be derived), its first value (all are equal), or
 * an array of every row's value. */
enum column_form { NIL, FIRST, ARRAY };

static int pack_i64_column(Out *o, const Row *rows, Py_ssize_t n, size_t field, enum column_form form) {
    if (form == NIL)
        return pack_nil(o);
    if (form == FIRST)
        return pack_i64(o, *(const int64_t *)((const char *)&rows[0] + field));
    if (pack_array_header(o, n) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pack_i64(o, *(const int64_t *)((const char *)&rows[i] + field)) < 0)
            return -1;
    return 0;
}

static int pack_obj_column(Out *o, const Row *rows, Py_ssize_t n, size_t field, enum column_form form) {
    if (form == NIL)
        return pack_nil(o);
    if (pack_array_header(o, n) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (pack_obj(o, *(PyObject *const *)((const char *)&rows[i] + field), 0) < 0)
            return -1;
    return 0;
}

static Py_ssize_t raw_size(PyObject *v) {
    return PyBytes_Check(v) ? PyBytes_GET_SIZE(v) + 5 : 1;
}

static PyObject *pack_frame(PyObject *self, PyObject *args) {
    PyObject *head, *msgs;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!O!nn:pack_frame", &PyTuple_Type, &head, &PyList_Type, &msgs,
                          &start, &stop))
        return NULL;
    if (msg_type == NULL || unreadable_exc == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "pack_frame() before bind()");
        return NULL;
    }
    if (start < 0 || stop > PyList_GET_SIZE(msgs) || start >= stop) {
        PyErr_SetString(PyExc_IndexError, "empty or out-of-range run");
        return NULL;
    }
    Py_ssize_t n = stop - start;
    Row *rows = PyMem_Calloc((size_t)n, sizeof(Row));
    if (rows == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    Out o = {NULL, NULL, 0, 0};
    Py_ssize_t read = 0, estimate = 64 + 24 * n;
    int contiguous = 1, one_type = 1, any_headers = 0;

    for (Py_ssize_t i = 0; i < n; i++, read++) {
        PyObject *m = PyList_GET_ITEM(msgs, start + i);
        if (Py_TYPE(m) != msg_type) {
            PyErr_Format(PyExc_TypeError, "expected a message, got %.100s", Py_TYPE(m)->tp_name);
            goto done;
        }
        if (read_row(m, &rows[i], start + i) < 0) {
            read++; /* its references, if any, are released below */
            goto done;
        }
        /* Unsigned: well defined for any offsets a client returns (no signed overflow). */
        contiguous &= (uint64_t)rows[i].offset - (uint64_t)rows[0].offset == (uint64_t)i;
        one_type &= rows[i].ts_type == rows[0].ts_type;
        any_headers |= rows[i].headers != Py_None;
        estimate += raw_size(rows[i].key) + raw_size(rows[i].value);
    }
    if (out_init(&o, estimate) < 0)
        goto done;
    /* [*head, first, offsets|nil, keys, values, headers|nil, ts_type|ts_types, timestamps] */
    Py_ssize_t nhead = PyTuple_GET_SIZE(head);
    if (pack_array_header(&o, nhead + 7) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < nhead; i++)
        if (pack_obj(&o, PyTuple_GET_ITEM(head, i), 0) < 0)
            goto done;
    if (pack_i64(&o, rows[0].offset) < 0
        || pack_i64_column(&o, rows, n, offsetof(Row, offset), contiguous ? NIL : ARRAY) < 0
        || pack_obj_column(&o, rows, n, offsetof(Row, key), ARRAY) < 0
        || pack_obj_column(&o, rows, n, offsetof(Row, value), ARRAY) < 0
        || pack_obj_column(&o, rows, n, offsetof(Row, headers), any_headers ? ARRAY : NIL) < 0
        || pack_i64_column(&o, rows, n, offsetof(Row, ts_type), one_type ? FIRST : ARRAY) < 0
        || pack_i64_column(&o, rows, n, offsetof(Row, ts), ARRAY) < 0)
        goto done;
    result = out_finish(&o);

done:
    if (result == NULL)
        out_abandon(&o);
    for (Py_ssize_t i = 0; i < read; i++) {
        Py_XDECREF(rows[i].key);
        Py_XDECREF(rows[i].value);
        Py_XDECREF(rows[i].headers);
    }
    PyMem_Free(rows);
    return result;
}

/* ------------------------------------------------------------------ build_records */

#define N_SLOTS 7
static const char *slot_names[N_SLOTS] = {"topic", "partition", "offset", "key", "value",
                                          "headers", "timestamp"};
enum { S_TOPIC, S_PARTITION, S_OFFSET, S_KEY, S_VALUE, S_HEADERS, S_TIMESTAMP };
static PyTypeObject *record_type = NULL;
static Py_ssize_t slot_offsets[N_SLOTS];

/* Where each of Record's __slots__ lives in its instances, read from the member
 * descriptors CPython made for them. Refuses a type whose attributes are not plain
 * writable object slots (a property, a dict attribute...). */
static int bind_record_type(PyTypeObject *type) {
    if (type == record_type)
        return 0;
    Py_ssize_t offsets[N_SLOTS];
    for (int i = 0; i < N_SLOTS; i++) {
        PyObject *d = PyObject_GetAttrString((PyObject *)type, slot_names[i]);
        if (d == NULL)
            return -1;
        /* The descriptor must be the type's own (or a base's) and lie inside its instances: a
         * member descriptor copied from another class would point elsewhere. */
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
                 && !(((PyMemberDescrObject *)d)->d_member->flags & READONLY)
                 && PyType_IsSubtype(type, ((PyMemberDescrObject *)d)->d_common.d_type)
                 && ((PyMemberDescrObject *)d)->d_member->offset >= (Py_ssize_t)sizeof(PyObject)
                 && ((PyMemberDescrObject *)d)->d_member->offset + (Py_ssize_t)sizeof(PyObject *)
                        <= type->tp_basicsize;
        if (ok)
            offsets[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%.100s.%s is not a plain __slots__ attribute",
                         type->tp_name, slot_names[i]);
            return -1;
        }
    }
    memcpy(slot_offsets, offsets, sizeof(offsets));
    Py_INCREF(type);
    Py_XSETREF(record_type, type);
    return 0;
}

static inline void set_slot(PyObject *obj, int slot, PyObject *v) {
    /* v is a new reference; the slot is empty (tp_alloc zeroes the object). */
    *(PyObject **)((char *)obj + slot_offsets[slot]) = v;
}

static int check_list(PyObject *v, Py_ssize_t n, const char *what) {
    if (!PyList_Check(v) || PyList_GET_SIZE(v) != n) {
        PyErr_Format(PyExc_ValueError, "frame column %s does not hold one item per record", what);
        return -1;
    }
    return 0;
}

/* The i-th offset of a run without gaps: first + i, as Python's range() gives it (any
 * integer: a hostile frame may hold one beyond 64 bits, and first + i must not overflow). */
static PyObject *nth_offset(PyObject *first, long long first_ll, int small, Py_ssize_t i) {
    if (small)
        return PyLong_FromLongLong(first_ll + i);
    PyObject *di = PyLong_FromSsize_t(i);
    if (di == NULL)
        return NULL;
    PyObject *off = PyNumber_Add(first, di);
    Py_DECREF(di);
    return off;
}

static PyObject *build_records(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *topic, *partition, *first_arg, *offsets, *keys, *values, *headers, *ts_types, *ts;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOO:build_records", &PyType_Type, &type, &topic,
                          &partition, &first_arg, &offsets, &keys, &values, &headers, &ts_types, &ts))
        return NULL;
    if (bind_record_type(type) < 0)
        return NULL;
    if (!PyList_Check(values)) {
        PyErr_SetString(PyExc_ValueError, "frame column values is not a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (check_list(keys, n, "keys") < 0 || check_list(ts, n, "timestamps") < 0
        || (offsets != Py_None && check_list(offsets, n, "offsets") < 0)
        || (headers != Py_None && check_list(headers, n, "headers") < 0)
        || (!PyLong_Check(ts_types) && check_list(ts_types, n, "timestamp types") < 0))
        return NULL;
    PyObject *first = NULL; /* only read when the offsets are first, first + 1, ... */
    long long first_ll = 0;
    int small = 0;
    if (offsets == Py_None) {
        if ((first = PyNumber_Index(first_arg)) == NULL)
            return NULL;
        int overflow = 0;
        first_ll = PyLong_AsLongLongAndOverflow(first, &overflow);
        if (first_ll == -1 && PyErr_Occurred()) {
            Py_DECREF(first);
            return NULL;
        }
        small = !overflow && first_ll <= LLONG_MAX - n;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = type->tp_alloc(type, 0);
        if (r == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, r); /* owned by the list from here, also on failure */
        PyObject *off = offsets == Py_None ? nth_offset(first, first_ll, small, i)
                                           : Py_NewRef(PyList_GET_ITEM(offsets, i));
        if (off == NULL)
            goto fail;
        PyObject *tt = PyLong_Check(ts_types) ? ts_types : PyList_GET_ITEM(ts_types, i);
        PyObject *stamp = PyTuple_Pack(2, tt, PyList_GET_ITEM(ts, i));
        if (stamp == NULL) {
            Py_DECREF(off);
            goto fail;
        }
        set_slot(r, S_TOPIC, Py_NewRef(topic));
        set_slot(r, S_PARTITION, Py_NewRef(partition));
        set_slot(r, S_OFFSET, off);
        set_slot(r, S_KEY, Py_NewRef(PyList_GET_ITEM(keys, i)));
        set_slot(r, S_VALUE, Py_NewRef(PyList_GET_ITEM(values, i)));
        set_slot(r, S_HEADERS, Py_NewRef(headers == Py_None ? Py_None : PyList_GET_ITEM(headers, i)));
        set_slot(r, S_TIMESTAMP, stamp);
    }
    Py_XDECREF(first);
    return out;
fail:
    Py_XDECREF(first);
    Py_XDECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ copy_records */

/* copy_records(Record, records) -> list[Record]: what the plugin is handed (issue 29): new
 * Records with the same field objects (str, int, bytes, tuples: immutable) and a headers
 * list of their own (list(h), or None), so that nothing a plugin does to its records
 * reaches the runtime's. Twin: runtime/execution/run.py _copy_records_py. */
static PyObject *copy_records(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    PyObject *records;
    if (!PyArg_ParseTuple(args, "O!O!:copy_records", &PyType_Type, &type, &PyList_Type, &records))
        return NULL;
    if (bind_record_type(type) < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *src = PyList_GET_ITEM(records, i);
        if (!PyObject_TypeCheck(src, type)) {
            PyErr_Format(PyExc_TypeError, "copy_records: item %zd is a %.100s, not a %.100s", i,
                         Py_TYPE(src)->tp_name, type->tp_name);
            goto fail;
        }
        PyObject *r = type->tp_alloc(type, 0);
        if (r == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, r); /* owned by the list from here, also on failure */
        for (int s = 0; s < N_SLOTS; s++) {
            PyObject *v = *(PyObject **)((char *)src + slot_offsets[s]);
            if (v == NULL) {
                PyErr_Format(PyExc_AttributeError, "copy_records: item %zd has no %s", i, slot_names[s]);
                goto fail;
            }
            if (s == S_HEADERS && v != Py_None) {
                v = PySequence_List(v);
                if (v == NULL)
                    goto fail;
            } else {
                Py_INCREF(v);
            }
            set_slot(r, s, v);
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ ordered words */

/* The word at `index` of a writable buffer viewed as 8-byte words; NULL (an exception set)
 * when it is out of range or not 8-byte aligned (an atomic access must be). */
static int64_t *word_at(Py_buffer *b, Py_ssize_t index) {
    if (index < 0 || index > b->len / 8 - 1) {
        PyErr_SetString(PyExc_IndexError, "word index out of range");
        return NULL;
    }
    char *p = (char *)b->buf + index * 8;
    if (((uintptr_t)p & 7) != 0) {
        PyErr_SetString(PyExc_ValueError, "word not 8-byte aligned");
        return NULL;
    }
    return (int64_t *)p;
}

static PyObject *load_acquire(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "w*n", &b, &index)) return NULL;
    int64_t *w = word_at(&b, index);
    PyObject *out = w == NULL ? NULL : PyLong_FromLongLong(__atomic_load_n(w, __ATOMIC_ACQUIRE));
    PyBuffer_Release(&b);
    return out;
}

static PyObject *store_release(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t index;
    long long value;
    if (!PyArg_ParseTuple(args, "w*nL", &b, &index, &value)) return NULL;
    int64_t *w = word_at(&b, index);
    if (w != NULL) __atomic_store_n(w, (int64_t)value, __ATOMIC_RELEASE);
    PyBuffer_Release(&b);
    if (w == NULL) return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ last resort */

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    unsigned long generation;
    struct timespec deadline; /* CLOCK_MONOTONIC */
    int code;
    char *message;
    Py_ssize_t message_len;
    char **paths;
    Py_ssize_t npaths;
} exit_job;

static pthread_mutex_t exit_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t exit_cond;
static int exit_cond_ready = 0;
static unsigned long exit_generation = 0; /* each exit_later and cancel_exit moves it on */

static void exit_job_free(exit_job *job) {
    for (Py_ssize_t i = 0; i < job->npaths; i++) free(job->paths[i]);
    free(job->paths);
    free(job->message);
    free(job);
}

static void *exit_watch(void *arg) {
    exit_job *job = arg;
    int fire = 0;
    pthread_mutex_lock(&exit_lock);
    while (exit_generation == job->generation) {
        if (pthread_cond_timedwait(&exit_cond, &exit_lock, &job->deadline) == ETIMEDOUT) {
            fire = exit_generation == job->generation;
            break;
        }
    }
    pthread_mutex_unlock(&exit_lock);
    if (fire) { /* async-signal-safe calls only from here: the rest of the process is stuck */
        Py_ssize_t done = 0;
        while (done < job->message_len) {
            ssize_t n = write(2, job->message + done, (size_t)(job->message_len - done));
            if (n <= 0 && errno != EINTR) break;
            if (n > 0) done += n;
        }
        for (Py_ssize_t i = 0; i < job->npaths; i++) unlink(job->paths[i]);
        _exit(job->code);
    }
    exit_job_free(job);
    return NULL;
}

static char *copy_bytes(PyObject *b, Py_ssize_t *len) {
    char *data;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(b, &data, &n) < 0) return NULL;
    char *out = malloc((size_t)n + 1);
    if (out == NULL) { PyErr_NoMemory(); return NULL; }
    memcpy(out, data, (size_t)n);
    out[n] = '\0';
    if (len != NULL) *len = n;
    return out;
}

static PyObject *exit_later(PyObject *self, PyObject *args) {
    double seconds;
    int code;
    PyObject *message, *paths;
    if (!PyArg_ParseTuple(args, "diSO!", &seconds, &code, &message, &PyList_Type, &paths)) return NULL;
    if (!(seconds >= 0 && seconds < 1e9)) {
        PyErr_SetString(PyExc_ValueError, "exit_later: seconds must be >= 0");
        return NULL;
    }
    exit_job *job = calloc(1, sizeof(exit_job));
    if (job == NULL) return PyErr_NoMemory();
    Py_ssize_t n = PyList_GET_SIZE(paths);
    job->paths = calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    if (job->paths == NULL) { exit_job_free(job); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(paths, i);
        if (!PyBytes_Check(p)) {
            PyErr_SetString(PyExc_TypeError, "exit_later: paths must be bytes");
            exit_job_free(job);
            return NULL;
        }
        if ((job->paths[i] = copy_bytes(p, NULL)) == NULL) { exit_job_free(job); return NULL; }
        job->npaths = i + 1;
    }
    if ((job->message = copy_bytes(message, &job->message_len)) == NULL) { exit_job_free(job); return NULL; }
    job->code = code;
    clock_gettime(CLOCK_MONOTONIC, &job->deadline);
    double whole = (double)(long long)seconds;
    job->deadline.tv_sec += (time_t)whole;
    job->deadline.tv_nsec += (long)((seconds - whole) * 1e9);
    if (job->deadline.tv_nsec >= 1000000000L) {
        job->deadline.tv_sec += 1;
        job->deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&exit_lock);
    if (!exit_cond_ready) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&exit_cond, &attr);
        pthread_condattr_destroy(&attr);
        exit_cond_ready = 1;
    }
    job->generation = ++exit_generation; /* an earlier one armed is cancelled */
    pthread_cond_broadcast(&exit_cond);
    pthread_mutex_unlock(&exit_lock);
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&thread, &attr, exit_watch, job);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        exit_job_free(job);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *cancel_exit(PyObject *self, PyObject *noargs) {
    pthread_mutex_lock(&exit_lock);
    exit_generation++;
    if (exit_cond_ready) pthread_cond_broadcast(&exit_cond);
    pthread_mutex_unlock(&exit_lock);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(message_type, unreadable): the type whose C methods pack_frame calls, and the "
     "exception class it raises as unreadable(index, field, cause) for a record the type cannot read."},
    {"pack_frame", pack_frame, METH_VARARGS,
     "pack_frame(head, messages, start, stop) -> bytes: a columnar msgpack batch frame."},
    {"build_records", build_records, METH_VARARGS,
     "build_records(Record, topic, partition, first, offsets, keys, values, headers, "
     "ts_types, timestamps) -> list of Record."},
    {"copy_records", copy_records, METH_VARARGS,
     "copy_records(Record, records) -> list of Record: copies with headers lists of their own."},
    {"load_acquire", load_acquire, METH_VARARGS,
     "load_acquire(buffer, index) -> int: the 8-byte word at index, read with acquire ordering."},
    {"store_release", store_release, METH_VARARGS,
     "store_release(buffer, index, value): the 8-byte word at index, written with release ordering."},
    {"exit_later", exit_later, METH_VARARGS,
     "exit_later(seconds, code, message, paths): unless cancel_exit() comes first, write message "
     "to stderr, unlink paths and _exit(code) after seconds, from a thread that never takes the GIL."},
    {"cancel_exit", cancel_exit, METH_NOARGS, "cancel_exit(): what exit_later armed does not happen."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "runtime._speedups",
                                    "C speedups for the per-record hot paths (optional).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
