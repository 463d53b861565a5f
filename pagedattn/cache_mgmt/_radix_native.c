/* C helpers for the radix prefix cache's request path (radix_cache.py, radix_insert.py) and
 * for its token pools' alloc and free (token_pool.py).
 *
 * Built at first use with the C compiler Python was built with (native.py), like Triton's
 * launcher stubs; without a compiler the cache and the pools run the pure-Python path, which
 * gives the same results. Each function replaces one Python helper and keeps its contract:
 *
 *   encode(seq)                           radix_node.encode_tokens for a list or tuple
 *   find(kids, keys, pb, ps, node, key, pos, n)   RadixCache._find (+ _common)
 *   claim(state, new, ps)                 radix_insert._check_new_slots + the CACHED mark
 *   release(state, slots, ps, stack, top, pstate)   TokenPool.free: checks, FREE, the push
 *   release_cached(same arguments)        TokenPool._release_cached (evict's free)
 *   hold(state, ps, stack, top, k, pstate)   TokenPool.alloc: the pop, slots, HELD
 *
 * Keys and values are bytes of native int64 (8 bytes a token or slot). Nothing here keeps a
 * reference past a call or holds the GIL's protection open across Python code, except where
 * `encode` calls __index__ on a non-int token (see there).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define TB 8 /* bytes per token in a key */

/* One token -> int64; -1 with an exception set on failure (ValueError: out of range). */
static int token_value(PyObject *x, Py_ssize_t i, long long *out) {
    int overflow = 0;
    long long v;
    if (PyLong_CheckExact(x)) {
        v = PyLong_AsLongLongAndOverflow(x, &overflow);
    } else {
        PyObject *ix = PyNumber_Index(x); /* bool, numpy integers; TypeError for the rest */
        if (ix == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
            PyErr_Format(PyExc_TypeError,
                         "tokens: expected int64 token ids (token %zd is a %.100s)", i,
                         Py_TYPE(x)->tp_name);
            return -1;
        }
        v = PyLong_AsLongLongAndOverflow(ix, &overflow);
        Py_DECREF(ix);
    }
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "tokens: expected int64 token ids (token %zd is out of "
                     "range)", i);
        return -1;
    }
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

/* The value of an exact int that fits one digit (every token id), without a call: 1 when set.
 * NOTE: CPython's documented unstable API from 3.12; before that, the digit layout that
 * Cython's fast paths read too. */
static inline int compact_value(PyObject *x, long long *v) {
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)x)) return 0;
    *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)x);
    return 1;
#else
    Py_ssize_t size = Py_SIZE(x);
    if (size < -1 || size > 1) return 0;
    *v = size * (long long)((PyLongObject *)x)->ob_digit[0];
    return 1;
#endif
}

/* encode(seq: list | tuple) -> bytes of int64 tokens.
 * NOTE: __index__ of a non-int token is Python code that may change a list; the list is read
 * again after each such call, and a change of length is an error. */
static PyObject *encode(PyObject *self, PyObject *seq) {
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq)) {
        PyErr_Format(PyExc_TypeError, "tokens: expected a list or tuple, got %.100s",
                     Py_TYPE(seq)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * TB);
    if (out == NULL) return NULL;
    int64_t *dst = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PySequence_Fast_ITEMS(seq)[i];
        long long v;
        if (!PyLong_CheckExact(x) || !compact_value(x, &v)) {
            Py_INCREF(x);                   /* __index__ may drop the list's reference */
            int rc = token_value(x, i, &v);
            Py_DECREF(x);
            if (rc) goto fail;
            if (PySequence_Fast_GET_SIZE(seq) != n) {
                PyErr_SetString(PyExc_RuntimeError, "tokens: the list changed size while it "
                                "was encoded");
                goto fail;
            }
        }
        dst[i] = (int64_t)v;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* Tokens (8-byte words) of the common prefix of a[0:lim) and b[0:lim), lim in words. */
static Py_ssize_t common_words(const char *a, const char *b, Py_ssize_t lim) {
    Py_ssize_t i = 0;
    while (i < lim && memcmp(a + i * TB, b + i * TB, TB) == 0) i++;
    return i;
}

/* The child of children table `ch` ({first-page bytes: child id}) whose first page is
 * page[0:pb], or NULL (an exception set only on failure). A few children are compared in place
 * (no key object to make and hash: a 16-token page is 128 bytes); more are looked up. */
#define SCAN_CHILDREN 8
static PyObject *child(PyObject *ch, const char *page, Py_ssize_t pb) {
    if (PyDict_GET_SIZE(ch) <= SCAN_CHILDREN) {
        Py_ssize_t it = 0;
        PyObject *k, *v;
        while (PyDict_Next(ch, &it, &k, &v))
            if (PyBytes_CheckExact(k) && PyBytes_GET_SIZE(k) == pb &&
                memcmp(PyBytes_AS_STRING(k), page, pb) == 0)
                return v;
        return NULL;
    }
    PyObject *first = PyBytes_FromStringAndSize(page, pb);
    if (first == NULL) return NULL;
    PyObject *c = PyDict_GetItemWithError(ch, first);
    Py_DECREF(first);
    return c;
}

/* find(kids, keys, pb, ps, node, key, pos, n) -> (path, node, pos, cut, m): RadixCache._find.
 * kids: {node id: {first-page bytes: child id}} (sparse); keys: {node id: key bytes};
 * pb = page bytes, ps = page size in tokens; pos and n are page-aligned byte offsets in key.
 * A child found by its first page matches at least that page, so m >= pb when cut != 0. */
static PyObject *find(PyObject *self, PyObject *args) {
    PyObject *kids, *keys, *node, *key;
    Py_ssize_t pb, ps, pos, n;
    if (!PyArg_ParseTuple(args, "O!O!nnOO!nn", &PyDict_Type, &kids, &PyDict_Type, &keys, &pb,
                          &ps, &node, &PyBytes_Type, &key, &pos, &n))
        return NULL;
    if (pb != ps * TB || ps < 1 || pos < 0 || n > PyBytes_GET_SIZE(key) || pos % pb ||
        n % pb) {
        PyErr_SetString(PyExc_ValueError, "find: inconsistent page or key bounds");
        return NULL;
    }
    const char *kb = PyBytes_AS_STRING(key);
    PyObject *path = PyList_New(0);
    if (path == NULL) return NULL;
    while (pos < n) {
        PyObject *ch = PyDict_GetItemWithError(kids, node); /* borrowed */
        if (ch == NULL) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        if (!PyDict_CheckExact(ch)) {
            PyErr_SetString(PyExc_TypeError, "find: a children table is not a dict");
            goto fail;
        }
        PyObject *c = child(ch, kb + pos, pb); /* borrowed */
        if (c == NULL) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        PyObject *ck = PyDict_GetItemWithError(keys, c);
        if (ck == NULL || !PyBytes_Check(ck)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "find: a child without a key");
            goto fail;
        }
        Py_ssize_t lk = PyBytes_GET_SIZE(ck);
        if (lk <= n - pos && memcmp(kb + pos, PyBytes_AS_STRING(ck), lk) == 0) {
            if (PyList_Append(path, c)) goto fail;
            pos += lk;
            node = c;
            continue;
        }
        Py_ssize_t lim = (lk < n - pos ? lk : n - pos) / TB;
        Py_ssize_t i = common_words(PyBytes_AS_STRING(ck), kb + pos, lim);
        Py_ssize_t m = (i - i % ps) * TB;
        return Py_BuildValue("(NOnOn)", path, node, pos, c, m);
    }
    return Py_BuildValue("(NOnin)", path, node, pos, 0, (Py_ssize_t)0);
fail:
    Py_DECREF(path);
    return NULL;
}

enum { HELD = 0, FREE = 1, CACHED = 2, MARK = 3 }; /* token_pool.py's states + a mark */

/* Move whole pages of slots from state `from` to `to` in the pool's per-slot `state`: 0, or an
 * error code with nothing changed: 1 the slots are not whole pages, each in order, 2 a slot out
 * of range, 3 a page listed twice, 4 a slot not in `from`. The Python checks then name the
 * error: the code only says that there is one (and a paged pool's free also takes pages whose
 * slots come out of order, which it sorts).
 * A page's first slot stands for the page (token_pool.py): `check_all` 0 checks only it,
 * `set_all` 0 sets only it. A page under check has its first slot marked, so a second
 * occurrence is seen at once; on an error the marks are undone.
 *   claim           HELD -> CACHED, first slot checked and set
 *   release         HELD -> FREE, every slot checked and set
 *   release_cached  CACHED -> FREE, first slot checked (the rest stay HELD under a cached
 *                   page), every slot set */
static Py_ssize_t take_pages(unsigned char *st, Py_ssize_t size, const int64_t *s,
                             Py_ssize_t count, Py_ssize_t ps, unsigned char from,
                             unsigned char to, int check_all, int set_all) {
    Py_ssize_t r, code = 0;
    if (ps < 1 || count % ps || size < ps) return 1;
    for (r = 0; r < count; r += ps) {
        int64_t h = s[r];
        if (h < 0 || h > size - ps) { code = 2; break; }
        if (ps > 1 && h % ps) { code = 1; break; }
        for (Py_ssize_t j = 1; j < ps; j++)         /* h + j < size: no overflow */
            if (s[r + j] != h + j) { code = 1; break; }
        if (code) break;
        if (st[h] == MARK) { code = 3; break; }
        if (st[h] != from) { code = 4; break; }
        for (Py_ssize_t j = 1; j < (check_all ? ps : 1); j++)
            if (st[h + j] != from) { code = 4; break; }
        if (code) break;
        st[h] = MARK;
    }
    for (Py_ssize_t q = 0; q < r; q += ps) {
        if (code) st[s[q]] = from;
        else if (set_all && ps > 1) memset(st + s[q], to, ps);
        else st[s[q]] = to;
    }
    return code;
}

/* A pool's free stack (token_pool.py): int64 entries `stack`, `top` of them in use; with
 * `pstate` (a paged pool: its pages' states, one byte a page) the pages' own marks. Checks that
 * the stack and the page states fit a pool of `size` slots in pages of `ps`; 0 or -1 with
 * ValueError. */
static int check_stack(const Py_buffer *stack, Py_ssize_t top, PyObject *pstate, Py_ssize_t size,
                       Py_ssize_t ps) {
    Py_ssize_t len = stack->len / TB;
    if (ps < 1 || stack->len % TB || top < 0 || top > len || size % ps || len != size / ps ||
        (pstate != Py_None && (!PyByteArray_CheckExact(pstate) ||
                               PyByteArray_GET_SIZE(pstate) != size / ps)) ||
        (pstate == Py_None && ps != 1)) {
        PyErr_SetString(PyExc_ValueError, "pool: inconsistent free stack or page states");
        return -1;
    }
    return 0;
}

/* claim(state: bytearray, new: bytes, ps) -> code: insert's new pages, HELD -> CACHED
 * (radix_insert._check_new_slots + the CACHED mark). */
static PyObject *claim(PyObject *self, PyObject *args) {
    PyObject *state;
    Py_buffer nb;
    Py_ssize_t ps;
    if (!PyArg_ParseTuple(args, "O!y*n", &PyByteArray_Type, &state, &nb, &ps)) return NULL;
    Py_ssize_t code = nb.len % TB ? 1 : take_pages(
        (unsigned char *)PyByteArray_AS_STRING(state), PyByteArray_GET_SIZE(state),
        (const int64_t *)nb.buf, nb.len / TB, ps, HELD, CACHED, 0, 0);
    PyBuffer_Release(&nb);
    return PyLong_FromSsize_t(code);
}

/* (state: bytearray, slots: int64 buffer, ps, stack, top, pstate) -> code: whole pages from
 * `from` to FREE (take_pages' codes); on 0 the pages (each page's first slot // ps, in the order
 * given) are pushed at stack[top:] and marked FREE in `pstate`: the caller adds
 * len(slots) // ps to its top. Anything else changes nothing. */
static PyObject *free_pages(PyObject *args, unsigned char from, int check_all) {
    PyObject *state, *pstate, *out = NULL;
    Py_buffer nb, sb;
    Py_ssize_t ps, top;
    if (!PyArg_ParseTuple(args, "O!y*nw*nO", &PyByteArray_Type, &state, &nb, &ps, &sb, &top,
                          &pstate))
        return NULL;
    Py_ssize_t size = PyByteArray_GET_SIZE(state), count = nb.len / TB;
    const int64_t *s = (const int64_t *)nb.buf;
    if (check_stack(&sb, top, pstate, size, ps)) goto done;
    Py_ssize_t code = nb.len % TB || count % ps || count / ps > sb.len / TB - top ? 1 :
        take_pages((unsigned char *)PyByteArray_AS_STRING(state), size, s, count, ps, from, FREE,
                   check_all, 1);
    if (code == 0) {
        int64_t *stack = (int64_t *)sb.buf + top;
        Py_ssize_t k = count / ps;
        if (ps == 1)                                /* a slot is its page: no division */
            memmove(stack, s, count * TB);
        else
            for (Py_ssize_t i = 0; i < k; i++) stack[i] = s[i * ps] / ps;  /* page starts */
        if (pstate != Py_None) {
            unsigned char *pst = (unsigned char *)PyByteArray_AS_STRING(pstate);
            for (Py_ssize_t i = 0; i < k; i++) pst[stack[i]] = FREE;
        }
    }
    out = PyLong_FromSsize_t(code);
done:
    PyBuffer_Release(&nb);
    PyBuffer_Release(&sb);
    return out;
}

/* release(...) -> code: a pool's free (TokenPool.free's checks), every slot HELD -> FREE. */
static PyObject *release(PyObject *self, PyObject *args) { return free_pages(args, HELD, 1); }

/* release_cached(...) -> code: the slots of evicted nodes (TokenPool._release_cached): each
 * page's first slot CACHED, then every slot FREE. */
static PyObject *release_cached(PyObject *self, PyObject *args) {
    return free_pages(args, CACHED, 0);
}

/* hold(state: bytearray, ps, stack, top, k, pstate) -> bytearray: a pool's alloc. The slots of
 * the `k` pages on top of the free stack (stack[top-1], stack[top-2], ..., the order
 * TokenPool._take hands them out; each page's ps slots in order), all marked HELD, and the
 * pages marked HELD in `pstate`: the caller takes k off its top. A page outside the pool or k
 * outside [0, top] raises ValueError, changing nothing. */
static PyObject *hold(PyObject *self, PyObject *args) {
    PyObject *state, *pstate, *out = NULL;
    Py_buffer sb;
    Py_ssize_t ps, top, k;
    if (!PyArg_ParseTuple(args, "O!ny*nnO", &PyByteArray_Type, &state, &ps, &sb, &top, &k,
                          &pstate))
        return NULL;
    Py_ssize_t size = PyByteArray_GET_SIZE(state);
    unsigned char *st = (unsigned char *)PyByteArray_AS_STRING(state);
    if (check_stack(&sb, top, pstate, size, ps)) goto done;
    if (k < 0 || k > top) {
        PyErr_Format(PyExc_ValueError, "hold: %zd pages asked, %zd on the free stack", k, top);
        goto done;
    }
    const int64_t *pages = (const int64_t *)sb.buf + top - k;   /* taken from the end */
    uint64_t npages = (uint64_t)(size / ps);
    for (Py_ssize_t i = 0; i < k; i++)
        if ((uint64_t)pages[i] >= npages) {               /* a negative page wraps past it */
            PyErr_Format(PyExc_ValueError, "hold: page %lld outside the pool",
                         (long long)pages[i]);
            goto done;
        }
    out = PyByteArray_FromStringAndSize(NULL, k * ps * TB);
    if (out == NULL) goto done;
    int64_t *slots = (int64_t *)PyByteArray_AS_STRING(out);
    unsigned char *pst = pstate == Py_None ? NULL : (unsigned char *)PyByteArray_AS_STRING(pstate);
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t page = pages[k - 1 - i], base = page * ps;
        for (Py_ssize_t j = 0; j < ps; j++) slots[i * ps + j] = base + j;
        if (ps == 1) st[base] = HELD;
        else memset(st + base, HELD, ps);
        if (pst) pst[page] = HELD;
    }
done:
    PyBuffer_Release(&sb);
    return out;
}

static PyMethodDef methods[] = {
    {"encode", encode, METH_O, "list or tuple of int tokens -> bytes of int64"},
    {"find", find, METH_VARARGS, "RadixCache._find: the read-only descent"},
    {"claim", claim, METH_VARARGS, "check new slots and mark their pages CACHED"},
    {"release", release, METH_VARARGS, "check slots a caller frees and mark them FREE"},
    {"release_cached", release_cached, METH_VARARGS, "free the slots of evicted nodes"},
    {"hold", hold, METH_VARARGS, "the slots of pages a pool hands out, marked HELD"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_radix_native", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__radix_native(void) { return PyModule_Create(&module); }
