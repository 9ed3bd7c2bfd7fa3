/* The packet simulator's fast event loop in C: `Fabric._run_fast` (mrc/sim/fabric.py) transcribed.
 *
 * Why: with the engines' common case in C (mrc/transport/_fastc.c), about half of a permutation run's
 * time was the fabric's own loop: popping an event, unpacking it, a switch hop's backlog arithmetic,
 * building the next event and filing it in its calendar bucket, all interpreted bytecode per packet hop.
 * This file runs the same steps on the same Python objects: the event tuples, the calendar (`future`,
 * `bidx`, `cur`, `cb`), the route chains, and the per-port tables (`busy`, `port_tx_bytes`,
 * `port_max_backlog`, `port_epoch`, `_safe`, `_mb1`, ...), which are `array.array`s so that both sides
 * read and write the same 8-byte cells (through the buffer protocol here; exporting the buffer also
 * stops a resize during the run). Nothing is copied in or out, so the Python helpers the loop calls for the
 * rare cases (`_hop_slow`, `_send_slow`, `_sched` for an event in the current bucket, `_chain`, `_drop`,
 * `ser`) and everything run from a timer or a scheduled call (`set_link`, `at`, samplers) see and change
 * the state they always did. Endpoints (the engines) are called through their Python methods.
 *
 * The loop gives the same events in the same order with the same effects as the Python one
 * (tests/sim/test_sim_fast_loop.py runs the reference loop, the Python fast loop and this one on runs
 * that reach every branch). MRC_SIM_FAST=py runs the Python fast loop, MRC_SIM_FAST=0 the reference loop.
 *
 * What differs only on broken input: a port index outside the port lists raises IndexError here, where
 * Python would index from the end for a negative one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_roce.h"
#include <limits.h>

#include "../_cint.h" /* AS_LL, AS_ULL */

/* fabric.py's constants: `consts()` returns them and fabric.py refuses this module when one differs */
#define SHIFT 5
#define SER_LIST 16384
#define PRIO_BYTES 255
#define EV_TIMER (-1)
#define EV_CALL (-2)
#define NEVER (1LL << 62)

#define SIMC_ABI 2 /* fabric._SIMC_ABI: raise both with any change of `run`'s contract */

static PyObject *s_receive, *s_dts, *s_next_deadline, *s_handle_timer, *s_now, *s_cb, *s_cur,
    *s_epochs_moved, *s_events, *s_hops, *s_wall_s, *s_link_failed, *s_no_endpoint, *s_no_route;
static PyObject *heappush_f, *heappop_f, *time_key, *perf_counter_f;

/* The fabric's state for one run: strong references to the lists and bound methods the loop uses. */
typedef struct {
    PyObject *self;
    PyObject *future, *bidx, *cur;
    PyObject *endpoints, *tables, *routers, *timer_at;
    PyObject *lost_on_link, *chains;
    PyObject *chain_m, *hop_slow_m, *send_slow_m, *sched_m, *drop_m, *ser_m;
    PyObject *on_deliver;
    double rate;
    long long ovh, delay, cb;
    /* the per-port arrays ('q': int64, 'd': double), nports cells each; ser: nser cells */
    Py_buffer views[10];
    int nviews;
    int64_t *port_node, *port_plane, *port_link, *port_epoch, *busy, *tx, *max_backlog, *ser;
    double *safe, *mb1;
    Py_ssize_t nports, nser;
} Loop;

static void
loop_clear(Loop *L)
{
    Py_CLEAR(L->future); Py_CLEAR(L->bidx); Py_CLEAR(L->cur);
    Py_CLEAR(L->endpoints); Py_CLEAR(L->tables); Py_CLEAR(L->routers); Py_CLEAR(L->timer_at);
    Py_CLEAR(L->lost_on_link); Py_CLEAR(L->chains);
    for (int i = 0; i < L->nviews; i++)
        PyBuffer_Release(&L->views[i]);
    L->nviews = 0;
    Py_CLEAR(L->chain_m); Py_CLEAR(L->hop_slow_m); Py_CLEAR(L->send_slow_m); Py_CLEAR(L->sched_m);
    Py_CLEAR(L->drop_m); Py_CLEAR(L->ser_m); Py_CLEAR(L->on_deliver);
}

/* A list attribute of the fabric (a strong reference), or NULL with TypeError. */
static PyObject *
get_list(PyObject *self, const char *name)
{
    PyObject *v = PyObject_GetAttrString(self, name);
    if (v != NULL && !PyList_Check(v)) {
        PyErr_Format(PyExc_TypeError, "Fabric.%s must be a list", name);
        Py_CLEAR(v);
    }
    return v;
}

/* The cells of the fabric's array attribute `name` (typecode 'q' or 'd': 8-byte cells), its buffer held
 * until loop_clear; the cell count in *n, which must equal *n when *n >= 0. */
static void *
get_array(Loop *L, const char *name, char typecode, Py_ssize_t *n)
{
    PyObject *v = PyObject_GetAttrString(L->self, name);
    if (v == NULL)
        return NULL;
    Py_buffer *b = &L->views[L->nviews];
    int rc = PyObject_GetBuffer(v, b, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_ND);
    Py_DECREF(v);
    if (rc < 0) {
        PyErr_Format(PyExc_TypeError, "Fabric.%s must be a writable array.array('%c')", name, typecode);
        return NULL;
    }
    L->nviews++;
    if (b->itemsize != 8 || b->format == NULL || b->format[0] != typecode || b->format[1] != '\0'
        || b->ndim != 1) {
        PyErr_Format(PyExc_TypeError, "Fabric.%s must be an array.array('%c')", name, typecode);
        return NULL;
    }
    Py_ssize_t cells = b->len / 8;
    if (*n >= 0 && cells != *n) {
        PyErr_Format(PyExc_ValueError, "Fabric.%s has %zd cells, not one per port (%zd)", name, cells, *n);
        return NULL;
    }
    *n = cells;
    return b->buf;
}

/* port index p checked against the port arrays */
static int
port_ok(Loop *L, long long p)
{
    if (p < 0 || p >= L->nports) {
        PyErr_Format(PyExc_IndexError, "fabric port index %lld out of range", p);
        return 0;
    }
    return 1;
}

static int
as_ll(PyObject *o, long long *out)
{
    long long v = AS_LL(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

/* list[i] (borrowed), IndexError outside 0 <= i < len */
static PyObject *
item(PyObject *list, long long i)
{
    if (i < 0 || i >= PyList_GET_SIZE(list)) {
        PyErr_Format(PyExc_IndexError, "fabric port or node index %lld out of range", i);
        return NULL;
    }
    return PyList_GET_ITEM(list, i);
}

static int
item_ll(PyObject *list, long long i, long long *out)
{
    PyObject *o = item(list, i);
    return o == NULL ? -1 : as_ll(o, out);
}

/* list[i] = v (a new int; i checked by the caller's read of the same index) */
static int
set_ll(PyObject *list, long long i, long long v)
{
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL)
        return -1;
    PyList_SET_ITEM(list, i, o);  /* i < len: read before */
    return 0;
}

static int
set_item(PyObject *list, long long i, PyObject *v)
{
    PyObject *old = PyList_GET_ITEM(list, i);
    Py_INCREF(v);
    PyList_SET_ITEM(list, i, v);
    Py_DECREF(old);
    return 0;
}

static int
set_ll_safe(PyObject *list, long long i, long long v)
{
    PyObject *old = PyList_GET_ITEM(list, i);
    if (set_ll(list, i, v) < 0)
        return -1;
    Py_DECREF(old);
    return 0;
}

static int
add_ll(PyObject *list, long long i, long long d)
{
    long long v;
    if (item_ll(list, i, &v) < 0)
        return -1;
    return set_ll_safe(list, i, v + d);
}

/* self._drop(reason) */
static int
drop(Loop *L, PyObject *reason)
{
    PyObject *r = PyObject_CallOneArg(L->drop_m, reason);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* File event `ev` (a new reference, taken) at time `ta`: the current bucket or an earlier one through
 * `_sched` (a binary-search insertion, rare), else appended to its future bucket (made and pushed on the
 * bucket heap when new). */
static int
push_event(Loop *L, long long ta, PyObject *ev)
{
    if (ev == NULL)
        return -1;
    long long bk = ta >> SHIFT;
    int rc = -1;
    if (bk <= L->cb) {
        PyObject *r = PyObject_CallOneArg(L->sched_m, ev);
        Py_XDECREF(r);
        rc = r == NULL ? -1 : 0;
        Py_DECREF(ev);
        return rc;
    }
    PyObject *key = PyLong_FromLongLong(bk);
    if (key == NULL)
        goto out;
    PyObject *lst = PyDict_GetItemWithError(L->future, key);
    if (lst != NULL) {
        rc = PyList_Append(lst, ev);
    } else if (!PyErr_Occurred()) {
        PyObject *nl = PyList_New(1);
        if (nl == NULL)
            goto out;
        Py_INCREF(ev);
        PyList_SET_ITEM(nl, 0, ev);
        rc = PyDict_SetItem(L->future, key, nl);
        Py_DECREF(nl);
        if (rc == 0) {
            PyObject *args[2] = {L->bidx, key};
            PyObject *r = PyObject_Vectorcall(heappush_f, args, 2, NULL);
            Py_XDECREF(r);
            rc = r == NULL ? -1 : 0;
        }
    }
out:
    Py_XDECREF(key);
    Py_DECREF(ev);
    return rc;
}

/* Take a fresh event tuple off the garbage collector's lists when nothing in it is tracked (ints, the
 * packet's bytearray, None, a route chain the collector has already untracked): such a tuple cannot be in a
 * reference cycle, and the collector would untrack it at its first pass anyway. Why here: a run holds every
 * packet in flight as an event, and each young-generation pass walked all of them (at 256 hosts about a
 * tenth of the run's time went to the collector). */
static PyObject *
untrack_atomic(PyObject *ev)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ev); i++)
        if (PyObject_GC_IsTracked(PyTuple_GET_ITEM(ev, i)))
            return ev;
    PyObject_GC_UnTrack(ev);
    return ev;
}

/* (t, kind, a, ch, data, n, ecn), a new reference; every argument borrowed but t and n (new, taken) */
static PyObject *
make_event(PyObject *t, PyObject *kind, PyObject *a, PyObject *ch, PyObject *data, PyObject *n, PyObject *ecn)
{
    if (t == NULL || n == NULL) {
        Py_XDECREF(t);
        Py_XDECREF(n);
        return NULL;
    }
    PyObject *ev = PyTuple_New(7);
    if (ev == NULL) {
        Py_DECREF(t);
        Py_DECREF(n);
        return NULL;
    }
    Py_INCREF(kind); Py_INCREF(a); Py_INCREF(ch); Py_INCREF(data); Py_INCREF(ecn);
    PyTuple_SET_ITEM(ev, 0, t);
    PyTuple_SET_ITEM(ev, 1, kind);
    PyTuple_SET_ITEM(ev, 2, a);
    PyTuple_SET_ITEM(ev, 3, ch);
    PyTuple_SET_ITEM(ev, 4, data);
    PyTuple_SET_ITEM(ev, 5, n);
    PyTuple_SET_ITEM(ev, 6, ecn);
    return untrack_atomic(ev);
}

/* The serialization time of `w` wire bytes: the fabric's table, or `ser(w)` past its end. */
static int
ser_of(Loop *L, long long w, long long *s)
{
    if (w >= 0 && w < SER_LIST && w < L->nser) {
        *s = L->ser[w];
        return 0;
    }
    PyObject *wo = PyLong_FromLongLong(w);
    if (wo == NULL)
        return -1;
    PyObject *r = PyObject_CallOneArg(L->ser_m, wo);
    Py_DECREF(wo);
    if (r == NULL)
        return -1;
    int rc = as_ll(r, s);
    Py_DECREF(r);
    return rc;
}

/* A new route chain ((port, (port, ... None))) off the collector's lists, innermost pair first, so that
 * the packet events that carry it can be untracked too (untrack_atomic); returned as given. */
static PyObject *
untrack_chain(PyObject *ch)
{
    if (ch != NULL && PyTuple_CheckExact(ch) && PyTuple_GET_SIZE(ch) == 2) {
        untrack_chain(PyTuple_GET_ITEM(ch, 1));
        untrack_atomic(ch);
    }
    return ch;
}

/* (port, container) -> route chain: the port's chain cache, or `_chain` (new reference). */
static PyObject *
chain_of(Loop *L, PyObject *port, long long p, PyObject *cont)
{
    PyObject *d = item(L->chains, p);
    if (d == NULL)
        return NULL;
    PyObject *ch = PyDict_Check(d) ? PyDict_GetItemWithError(d, cont) : NULL;
    if (ch != NULL) {
        Py_INCREF(ch);
        return ch;
    }
    if (PyErr_Occurred())
        return NULL;
    PyObject *args[2] = {port, cont};
    return untrack_chain(PyObject_Vectorcall(L->chain_m, args, 2, NULL));
}

/* `_send_fast(node, out, t)`: a host's datagrams onto its NIC ports. */
static int
send_out(Loop *L, long long node, PyObject *out, PyObject *t_obj, long long t)
{
    PyObject *table = item(L->tables, node);
    PyObject *route = table == NULL ? NULL : item(L->routers, node);
    if (route == NULL)
        return -1;
    PyObject *seq = PySequence_Fast(out, "datagrams_to_send must return a sequence");
    if (seq == NULL)
        return -1;
    Py_INCREF(table);
    Py_INCREF(route);
    PyObject *last_dst = NULL, *row = NULL;  /* strong: `dst is not last_dst` compares identities */
    int rc = -1;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *dg = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *data = NULL, *pair = NULL, *ch = NULL;
        int ok = -1;
        data = PySequence_GetItem(dg, 0);
        if (data == NULL)
            goto next;
        if (table != Py_None) {
            PyObject *dst = PySequence_GetItem(dg, 3);
            if (dst == NULL)
                goto next;
            if (dst != last_dst) {
                Py_XDECREF(row);
                row = PyObject_GetItem(table, dst);
                Py_XSETREF(last_dst, dst);
            } else {
                Py_DECREF(dst);
            }
            if (row == NULL) {
                Py_CLEAR(last_dst);
                goto next;
            }
            PyObject *evi = PySequence_GetItem(dg, 2);
            if (evi == NULL)
                goto next;
            pair = PyObject_GetItem(row, evi);
            Py_DECREF(evi);
        } else {
            pair = PyObject_CallOneArg(route, dg);
        }
        if (pair == NULL)
            goto next;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "a path table entry must be a (port, container) tuple");
            goto next;
        }
        PyObject *port = PyTuple_GET_ITEM(pair, 0), *cont = PyTuple_GET_ITEM(pair, 1);
        long long p;
        if (as_ll(port, &p) < 0)
            goto next;
        ch = chain_of(L, port, p, cont);
        if (ch == NULL)
            goto next;
        Py_ssize_t n = PyObject_Length(data);
        if (n < 0 || !port_ok(L, p))
            goto next;
        if (L->safe[p] == 0.0) {
            PyObject *no = PyLong_FromSsize_t(n);
            if (no == NULL)
                goto next;
            PyObject *args[5] = {port, ch, data, no, t_obj};
            PyObject *r = PyObject_Vectorcall(L->send_slow_m, args, 5, NULL);
            Py_DECREF(no);
            Py_XDECREF(r);
            ok = r == NULL ? -1 : 0;
            goto next;
        }
        long long w = n + L->ovh, s, b, ta;
        if (ser_of(L, w, &s) < 0)
            goto next;
        b = L->busy[p];
        if (b < t)
            b = t;
        if (n <= PRIO_BYTES) {
            L->busy[p] = b + s;
            ta = t + s + L->delay;
        } else {
            b += s;
            L->busy[p] = b;
            ta = b + L->delay;
        }
        L->tx[p] += w;
        PyObject *epoch = PyLong_FromLongLong(L->port_epoch[p]);
        if (epoch == NULL)
            goto next;
        ok = push_event(L, ta, make_event(PyLong_FromLongLong(ta), port, epoch, ch, data,
                                          PyLong_FromSsize_t(n), Py_False));
        Py_DECREF(epoch);
    next:
        Py_XDECREF(data);
        Py_XDECREF(pair);
        Py_XDECREF(ch);
        if (ok < 0)
            goto done;
    }
    rc = 0;
done:
    Py_XDECREF(row);
    Py_XDECREF(last_dst);
    Py_DECREF(table);
    Py_DECREF(route);
    Py_DECREF(seq);
    return rc;
}

/* After a delivery or a timer: the endpoint's next deadline re-arms its timer when earlier than the
 * one armed. */
static int
arm_timer(Loop *L, PyObject *eng, PyObject *node_obj, long long node, PyObject *t_obj, long long t)
{
    PyObject *dl = PyObject_VectorcallMethod(s_next_deadline, &eng, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (dl == NULL)
        return -1;
    int rc = 0;
    if (dl != Py_None) {
        PyObject *armed = item(L->timer_at, node);
        int lt = armed == NULL ? -1 : PyObject_RichCompareBool(dl, armed, Py_LT);
        if (lt < 0) {
            rc = -1;
        } else if (lt) {
            set_item(L->timer_at, node, dl);
            long long d;
            if (as_ll(dl, &d) < 0) {
                rc = -1;
            } else {
                PyObject *when = d > t ? dl : t_obj;
                Py_INCREF(when);
                Py_INCREF(node_obj);
                PyObject *ev = PyTuple_New(7);
                if (ev == NULL) {
                    Py_DECREF(when);
                    Py_DECREF(node_obj);
                    rc = -1;
                } else {
                    PyTuple_SET_ITEM(ev, 0, when);
                    PyTuple_SET_ITEM(ev, 1, PyLong_FromLong(EV_TIMER));
                    PyTuple_SET_ITEM(ev, 2, node_obj);
                    PyTuple_SET_ITEM(ev, 3, PyLong_FromLong(0));
                    Py_INCREF(Py_None);
                    PyTuple_SET_ITEM(ev, 4, Py_None);
                    PyTuple_SET_ITEM(ev, 5, PyLong_FromLong(0));
                    Py_INCREF(Py_False);
                    PyTuple_SET_ITEM(ev, 6, Py_False);
                    rc = push_event(L, d > t ? d : t, untrack_atomic(ev));
                }
            }
        }
    }
    Py_DECREF(dl);
    return rc;
}

/* What follows every delivery and timer of an endpoint: what it sends now goes out (`send_out`), and
 * its timer is re-armed (`arm_timer`). */
static int
after_event(Loop *L, PyObject *eng, PyObject *node_obj, long long node, PyObject *t_obj, long long t)
{
    PyObject *oa[2] = {eng, t_obj};
    PyObject *out = PyObject_VectorcallMethod(s_dts, oa, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (out == NULL)
        return -1;
    int any = PyObject_IsTrue(out);
    int rc = (any < 0 || (any && send_out(L, node, out, t_obj, t) < 0)) ? -1 : 0;
    Py_DECREF(out);
    if (rc == 0)
        rc = arm_timer(L, eng, node_obj, node, t_obj, t);
    return rc;
}

static int
epochs_moved(Loop *L)
{
    PyObject *m = PyObject_GetAttr(L->self, s_epochs_moved);
    if (m == NULL)
        return -1;
    int v = PyObject_IsTrue(m);
    Py_DECREF(m);
    return v;
}

static int
set_now(Loop *L, PyObject *t_obj)
{
    return PyObject_SetAttr(L->self, s_now, t_obj);
}

static int
add_attr(PyObject *self, PyObject *name, PyObject *d)
{
    PyObject *v = PyObject_GetAttr(self, name);
    if (v == NULL)
        return -1;
    PyObject *s = PyNumber_Add(v, d);
    Py_DECREF(v);
    if (s == NULL)
        return -1;
    int rc = PyObject_SetAttr(self, name, s);
    Py_DECREF(s);
    return rc;
}

static int
loop_init(Loop *L, PyObject *self)
{
    memset(L, 0, sizeof(*L));
    L->self = self;
#define LIST(field, name) if ((L->field = get_list(self, name)) == NULL) return -1
#define ATTR(field, name) if ((L->field = PyObject_GetAttrString(self, name)) == NULL) return -1
    LIST(bidx, "bidx"); LIST(cur, "cur"); LIST(endpoints, "endpoints"); LIST(tables, "tables");
    LIST(routers, "routers"); LIST(timer_at, "timer_at"); LIST(lost_on_link, "lost_on_link");
    LIST(chains, "_chains");
    ATTR(future, "future"); ATTR(chain_m, "_chain"); ATTR(hop_slow_m, "_hop_slow");
    ATTR(send_slow_m, "_send_slow"); ATTR(sched_m, "_sched"); ATTR(drop_m, "_drop"); ATTR(ser_m, "ser");
    ATTR(on_deliver, "on_deliver");
#undef LIST
#undef ATTR
    L->nports = -1;
    L->nser = -1;
#define ARR(field, name, code, n) if ((L->field = get_array(L, name, code, n)) == NULL) return -1
    ARR(port_node, "port_node", 'q', &L->nports);
    ARR(port_plane, "port_plane", 'q', &L->nports);
    ARR(port_link, "port_link", 'q', &L->nports);
    ARR(port_epoch, "port_epoch", 'q', &L->nports);
    ARR(busy, "busy", 'q', &L->nports);
    ARR(tx, "port_tx_bytes", 'q', &L->nports);
    ARR(max_backlog, "port_max_backlog", 'q', &L->nports);
    ARR(safe, "_safe", 'd', &L->nports);
    ARR(mb1, "_mb1", 'd', &L->nports);
    ARR(ser, "_ser_l", 'q', &L->nser);
#undef ARR
    if (PyList_GET_SIZE(L->chains) != L->nports) {
        PyErr_SetString(PyExc_ValueError, "Fabric._chains must have one dict per port");
        return -1;
    }
    if (!PyDict_Check(L->future)) {
        PyErr_SetString(PyExc_TypeError, "Fabric.future must be a dict");
        return -1;
    }
    PyObject *v = PyObject_GetAttrString(self, "rate_Bpns");
    if (v == NULL)
        return -1;
    L->rate = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (L->rate == -1.0 && PyErr_Occurred())
        return -1;
    if ((v = PyObject_GetAttrString(self, "ovh")) == NULL || as_ll(v, &L->ovh) < 0) {
        Py_XDECREF(v);
        return -1;
    }
    Py_DECREF(v);
    PyObject *p = PyObject_GetAttrString(self, "p");
    if (p == NULL)
        return -1;
    v = PyObject_GetAttrString(p, "delay_ns");
    Py_DECREF(p);
    if (v == NULL || as_ll(v, &L->delay) < 0) {
        Py_XDECREF(v);
        return -1;
    }
    Py_DECREF(v);
    if ((v = PyObject_GetAttr(self, s_cb)) == NULL || as_ll(v, &L->cb) < 0) {
        Py_XDECREF(v);
        return -1;
    }
    Py_DECREF(v);
    return 0;
}

/* The next bucket of the calendar becomes the current one: popped from the bucket heap, its events
 * sorted by time (stably: same-time events keep push order), latest first. 0, 1 when none is left, -1. */
static int
next_bucket(Loop *L)
{
    if (PyList_GET_SIZE(L->bidx) == 0)
        return 1;
    PyObject *key = PyObject_CallOneArg(heappop_f, L->bidx);
    if (key == NULL)
        return -1;
    int rc = -1;
    PyObject *lst = NULL;
    if (as_ll(key, &L->cb) < 0 || PyObject_SetAttr(L->self, s_cb, key) < 0)
        goto out;
    lst = PyDict_GetItemWithError(L->future, key);
    if (lst == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        goto out;
    }
    Py_INCREF(lst);
    if (PyDict_DelItem(L->future, key) < 0)
        goto out;
    if (!PyList_Check(lst)) {
        PyErr_SetString(PyExc_TypeError, "a calendar bucket must be a list");
        goto out;
    }
    PyObject *sort = PyObject_GetAttrString(lst, "sort");
    if (sort == NULL)
        goto out;
    PyObject *kw = Py_BuildValue("{sO}", "key", time_key), *noargs = PyTuple_New(0);
    PyObject *r = kw == NULL || noargs == NULL ? NULL : PyObject_Call(sort, noargs, kw);
    Py_DECREF(sort);
    Py_XDECREF(kw);
    Py_XDECREF(noargs);
    if (r == NULL)
        goto out;
    Py_DECREF(r);
    if (PyList_Reverse(lst) < 0 || PyObject_SetAttr(L->self, s_cur, lst) < 0)
        goto out;
    Py_SETREF(L->cur, lst);
    lst = NULL;
    rc = 0;
out:
    Py_XDECREF(lst);
    Py_DECREF(key);
    return rc;
}

static PyObject *
perf_counter(double *out)
{
    PyObject *r = PyObject_CallNoArgs(perf_counter_f);
    if (r == NULL)
        return NULL;
    *out = PyFloat_AsDouble(r);
    if (*out == -1.0 && PyErr_Occurred()) {
        Py_DECREF(r);
        return NULL;
    }
    return r;
}

/* run(fabric, until_ns, stop, check_every, progress, progress_every_s, t0) -> (events, other, t0):
 * `_run_fast`'s loop. The caller made `_safe` and `_mb1`, and adds the returned counts and wall time to
 * the fabric's totals (what a progress report already added is not counted again). */
static PyObject *
c_run(PyObject *Py_UNUSED(mod), PyObject *args)
{
    PyObject *self, *until_obj, *stop, *progress;
    long long check_every;
    double every_s, t0;
    if (!PyArg_ParseTuple(args, "OOOLOdd", &self, &until_obj, &stop, &check_every, &progress, &every_s, &t0))
        return NULL;
    long long until_ns;
    int ovf = 0;
    until_ns = PyLong_AsLongLongAndOverflow(until_obj, &ovf);
    if (until_ns == -1 && PyErr_Occurred())
        return NULL;
    if (ovf > 0)
        until_ns = LLONG_MAX;
    else if (ovf < 0)
        until_ns = LLONG_MIN;
    Loop L;
    if (loop_init(&L, self) < 0) {
        loop_clear(&L);
        return NULL;
    }
    long long events = 0, other = 0;
    double next_progress = t0 + every_s;
    int moved = epochs_moved(&L);
    PyObject *ev = NULL;
    if (moved < 0)
        goto fail;
    for (;;) {
        Py_CLEAR(ev);
        if (PyList_GET_SIZE(L.cur) == 0) {
            int r = next_bucket(&L);
            if (r < 0)
                goto fail;
            if (r > 0) {
                if (until_ns < NEVER) {
                    PyObject *now = PyObject_GetAttr(self, s_now);
                    if (now == NULL)
                        goto fail;
                    int gt = PyObject_RichCompareBool(now, until_obj, Py_GE);
                    int rc = gt < 0 ? -1 : set_now(&L, gt ? now : until_obj);
                    Py_DECREF(now);
                    if (rc < 0)
                        goto fail;
                }
                break;
            }
            continue;  /* (a bucket is never empty, but an empty one just moves on) */
        }
        Py_ssize_t last = PyList_GET_SIZE(L.cur) - 1;
        ev = PyList_GET_ITEM(L.cur, last);
        Py_INCREF(ev);
        if (PyList_SetSlice(L.cur, last, last + 1, NULL) < 0)
            goto fail;
        if (!PyTuple_Check(ev) || PyTuple_GET_SIZE(ev) != 7) {
            PyErr_SetString(PyExc_TypeError, "a fabric event must be a 7-tuple");
            goto fail;
        }
        PyObject *t_obj = PyTuple_GET_ITEM(ev, 0), *kind_obj = PyTuple_GET_ITEM(ev, 1);
        PyObject *a = PyTuple_GET_ITEM(ev, 2), *ch = PyTuple_GET_ITEM(ev, 3);
        PyObject *data = PyTuple_GET_ITEM(ev, 4), *n_obj = PyTuple_GET_ITEM(ev, 5);
        PyObject *ecn = PyTuple_GET_ITEM(ev, 6);
        long long t, kind;
        if (as_ll(t_obj, &t) < 0 || as_ll(kind_obj, &kind) < 0)
            goto fail;
        if (t > until_ns) {
            if (PyList_Append(L.cur, ev) < 0 || set_now(&L, until_obj) < 0)
                goto fail;
            break;
        }
        events++;
        if (kind >= 0) {
            if (!port_ok(&L, kind))
                goto fail;
            if (moved) {
                long long ea;
                if (as_ll(a, &ea) < 0)
                    goto fail;
                if (ea != L.port_epoch[kind]) {  /* the link failed while the packet was queued or on it */
                    if (add_ll(L.lost_on_link, L.port_link[kind], 1) < 0 || drop(&L, s_link_failed) < 0)
                        goto fail;
                    continue;
                }
            }
            if (ch == Py_None) {  /* the end of the chain: a host */
                long long node = L.port_node[kind];
                PyObject *eng = item(L.endpoints, node);
                if (eng == NULL)
                    goto fail;
                if (eng == Py_None) {
                    if (drop(&L, s_no_endpoint) < 0)
                        goto fail;
                    continue;
                }
                PyObject *node_obj = PyLong_FromLongLong(node);
                PyObject *plane = PyLong_FromLongLong(L.port_plane[kind]);
                if (node_obj == NULL || plane == NULL) {
                    Py_XDECREF(node_obj);
                    Py_XDECREF(plane);
                    goto fail;
                }
                Py_INCREF(eng);
                int ok = -1;
                if (set_now(&L, t_obj) < 0)
                    goto deliver_done;
                if (L.on_deliver != Py_None) {
                    PyObject *da[4] = {node_obj, plane, data, t_obj};
                    PyObject *r = PyObject_Vectorcall(L.on_deliver, da, 4, NULL);
                    if (r == NULL)
                        goto deliver_done;
                    Py_DECREF(r);
                }
                PyObject *ra[5] = {eng, data, t_obj, ecn, plane};
                PyObject *r = PyObject_VectorcallMethod(s_receive, ra, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
                if (r == NULL)
                    goto deliver_done;
                Py_DECREF(r);
                if (after_event(&L, eng, node_obj, node, t_obj, t) < 0)
                    goto deliver_done;
                ok = 0;
            deliver_done:
                Py_DECREF(eng);
                Py_DECREF(node_obj);
                Py_DECREF(plane);
                if (ok < 0 || (moved = epochs_moved(&L)) < 0)
                    goto fail;
                continue;
            }
            /* a switch: the next port of the chain (End with NEXT-C-SID and the static route, done once) */
            if (!PyTuple_Check(ch) || PyTuple_GET_SIZE(ch) != 2) {  /* _NO_ROUTE */
                if (drop(&L, s_no_route) < 0)
                    goto fail;
                continue;
            }
            PyObject *port = PyTuple_GET_ITEM(ch, 0), *nch = PyTuple_GET_ITEM(ch, 1);
            long long p, n;
            if (as_ll(port, &p) < 0 || as_ll(n_obj, &n) < 0 || !port_ok(&L, p))
                goto fail;
            double sx = L.safe[p];
            int slow = sx == 0.0;  /* the link is down or has its own rate or delay */
            if (!slow) {
                long long b = L.busy[p], w = n + L.ovh;
                double x;
                if (b > t) {
                    x = (double)(b - t) * L.rate;
                    if (x >= L.mb1[p]) {  /* x >= max_backlog + 1 */
                        long long q = (long long)x;
                        L.max_backlog[p] = q;
                        L.mb1[p] = (double)q + 1.0;
                    }
                } else {
                    x = 0.0;
                    b = t;
                }
                if (x >= sx || w >= SER_LIST) {  /* a threshold may be reached: every test */
                    slow = 1;
                } else {
                    long long s, ta;
                    int prio = n <= PRIO_BYTES;
                    if (ser_of(&L, w, &s) < 0)
                        goto fail;
                    if (prio) {  /* control packets: the priority queue */
                        L.busy[p] = b + s;
                        ta = t + s + L.delay;
                    } else {
                        b += s;
                        L.busy[p] = b;
                        ta = b + L.delay;
                    }
                    L.tx[p] += w;
                    PyObject *epoch = PyLong_FromLongLong(L.port_epoch[p]);
                    if (epoch == NULL)
                        goto fail;
                    Py_INCREF(n_obj);
                    int rc = push_event(&L, ta, make_event(PyLong_FromLongLong(ta), port, epoch, nch, data,
                                                           n_obj, ecn));
                    Py_DECREF(epoch);
                    if (rc < 0)
                        goto fail;
                    if (prio)
                        continue;
                }
            }
            if (slow) {
                PyObject *ha[6] = {port, nch, data, n_obj, ecn, t_obj};
                PyObject *r = PyObject_Vectorcall(L.hop_slow_m, ha, 6, NULL);
                if (r == NULL)
                    goto fail;
                int fwd = PyObject_IsTrue(r);
                Py_DECREF(r);
                if (fwd < 0)
                    goto fail;
                if (!fwd)
                    continue;
            }
        } else if (kind == EV_TIMER) {
            other++;
            long long node;
            PyObject *armed;
            if (as_ll(a, &node) < 0 || (armed = item(L.timer_at, node)) == NULL)
                goto fail;
            int same = PyObject_RichCompareBool(armed, t_obj, Py_EQ);
            if (same < 0)
                goto fail;
            if (!same)
                continue;
            if (set_ll_safe(L.timer_at, node, NEVER) < 0)
                goto fail;
            PyObject *eng = item(L.endpoints, node);
            if (eng == NULL)
                goto fail;
            if (eng == Py_None) {
                PyErr_SetString(PyExc_AssertionError, "a timer fired for a host without an endpoint");
                goto fail;
            }
            Py_INCREF(eng);
            int ok = -1;
            PyObject *ta[2] = {eng, t_obj};
            PyObject *r;
            if (set_now(&L, t_obj) < 0)
                goto timer_done;
            r = PyObject_VectorcallMethod(s_handle_timer, ta, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (r == NULL)
                goto timer_done;
            Py_DECREF(r);
            if (after_event(&L, eng, a, node, t_obj, t) < 0)
                goto timer_done;
            ok = 0;
        timer_done:
            Py_DECREF(eng);
            if (ok < 0 || (moved = epochs_moved(&L)) < 0)
                goto fail;
        } else {
            other++;
            if (set_now(&L, t_obj) < 0)
                goto fail;
            PyObject *r = PyObject_CallOneArg(a, t_obj);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
            if ((moved = epochs_moved(&L)) < 0)
                goto fail;
        }
        if (!(events & 1023)) {
            if (stop != Py_None) {
                if (check_every == 0) {
                    PyErr_SetString(PyExc_ZeroDivisionError, "check_every must not be 0");
                    goto fail;
                }
                long long m = events % check_every;  /* Python's modulo (check_every > 0 in practice) */
                if (m != 0 && (m < 0) != (check_every < 0))
                    m += check_every;
                if (m == 0) {
                    PyObject *r = PyObject_CallNoArgs(stop);
                    if (r == NULL)
                        goto fail;
                    int st = PyObject_IsTrue(r);
                    Py_DECREF(r);
                    if (st < 0)
                        goto fail;
                    if (st)
                        break;
                }
            }
            if (progress != Py_None) {
                double now_w;
                PyObject *nw = perf_counter(&now_w);
                if (nw == NULL)
                    goto fail;
                Py_DECREF(nw);
                if (now_w >= next_progress) {
                    PyObject *ev_o = PyLong_FromLongLong(events), *hop_o = PyLong_FromLongLong(events - other);
                    PyObject *w_o = PyFloat_FromDouble(now_w - t0);
                    int rc = (ev_o == NULL || hop_o == NULL || w_o == NULL
                              || add_attr(self, s_events, ev_o) < 0 || add_attr(self, s_hops, hop_o) < 0
                              || add_attr(self, s_wall_s, w_o) < 0) ? -1 : 0;
                    Py_XDECREF(ev_o);
                    Py_XDECREF(hop_o);
                    Py_XDECREF(w_o);
                    if (rc < 0)
                        goto fail;
                    events = other = 0;
                    t0 = now_w;
                    next_progress = now_w + every_s;
                    PyObject *r = PyObject_CallOneArg(progress, self);
                    if (r == NULL)
                        goto fail;
                    Py_DECREF(r);
                }
            }
            if ((moved = epochs_moved(&L)) < 0)
                goto fail;
        }
    }
    Py_CLEAR(ev);
    loop_clear(&L);
    return Py_BuildValue("(LLd)", events, other, t0);
fail:
    Py_XDECREF(ev);
    loop_clear(&L);
    return NULL;
}

/* fabric.py's constants, for its check that this build matches them */
static PyObject *
c_consts(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(args))
{
    return Py_BuildValue("{sisisisisisL}", "_SHIFT", SHIFT, "_SER_LIST", SER_LIST, "PRIO_BYTES", PRIO_BYTES,
                         "_EV_TIMER", EV_TIMER, "_EV_CALL", EV_CALL, "NEVER", NEVER);
}

static PyObject *
c_roce_consts(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(args))
{
    return roce_consts();
}

static PyMethodDef methods[] = {
    {"run", c_run, METH_VARARGS, "run(fabric, until_ns, stop, check_every, progress, progress_every_s, t0)"
     " -> (events, other, t0): Fabric._run_fast's event loop."},
    {"consts", c_consts, METH_NOARGS, "The fabric constants this build was written against."},
    {"roce_consts", (PyCFunction)c_roce_consts, METH_NOARGS, "roce.py's constants this build was written against."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_simc", "The packet simulator's fast event loop in C (see fabric.py).", -1, methods,
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__simc(void)
{
    INTERN(s_receive, "receive");
    INTERN(s_dts, "datagrams_to_send");
    INTERN(s_next_deadline, "next_deadline");
    INTERN(s_handle_timer, "handle_timer");
    INTERN(s_now, "now");
    INTERN(s_cb, "cb");
    INTERN(s_cur, "cur");
    INTERN(s_epochs_moved, "_epochs_moved");
    INTERN(s_events, "events");
    INTERN(s_hops, "hops");
    INTERN(s_wall_s, "wall_s");
    INTERN(s_link_failed, "link_failed");
    INTERN(s_no_endpoint, "no_endpoint");
    INTERN(s_no_route, "no_route");
    PyObject *heapq = PyImport_ImportModule("heapq");
    if (heapq == NULL)
        return NULL;
    heappush_f = PyObject_GetAttrString(heapq, "heappush");
    heappop_f = PyObject_GetAttrString(heapq, "heappop");
    Py_DECREF(heapq);
    PyObject *op = PyImport_ImportModule("operator");
    if (op == NULL)
        return NULL;
    PyObject *ig = PyObject_GetAttrString(op, "itemgetter");
    Py_DECREF(op);
    time_key = ig == NULL ? NULL : PyObject_CallFunction(ig, "i", 0);
    Py_XDECREF(ig);
    PyObject *tm = PyImport_ImportModule("time");
    if (tm == NULL)
        return NULL;
    perf_counter_f = PyObject_GetAttrString(tm, "perf_counter");
    Py_DECREF(tm);
    if (heappush_f == NULL || heappop_f == NULL || time_key == NULL || perf_counter_f == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI", SIMC_ABI) < 0 || roce_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
