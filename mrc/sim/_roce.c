/* The single-path RoCE baseline's hosts in C: `mrc/sim/roce.py` (RocePacket, RoceConn, RoceHost)
 * transcribed, for the simulator's C event loop (`_simc.c`; MRC_SIM_FAST=py keeps the Python classes).
 *
 * Why: with the fabric's loop in C, the ECMP variant's time was mostly these hosts' Python, about six
 * calls per packet (receive, datagrams_to_send, next_deadline, a packet object, its len(), the router).
 * Here a packet is a small C object whose len() is its size, and the hosts' state lives in C structs.
 *
 * The behaviour is the Python classes', rule for rule; tests/sim/test_sim_fast_loop.py compares every
 * experiment document of the ECMP variant between the Python loops (Python hosts) and the C loop (these
 * hosts), and pins the figures of a fixed seed. Two differences that no document shows: next_deadline
 * scans the connections instead of keeping roce.py's cached minimum (the same value), and a timeout
 * backoff past 2^62 ns saturates at NEVER where Python's ints grow (either way the timer never fires).
 * Floating point: the DCTCP update is written in Python's order of operations, the build disables FMA
 * contraction, and `cwnd // mtu` is Python's float floor division (py_floordiv).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>

#include "_roce.h"
#include "../_cint.h" /* AS_LL */

#define NEVER (1LL << 62)
#define DATA 0
#define ACK 1
#define NAK 2
#define DATA_HDR 56
#define CTRL_SIZE 64

/* ------------------------------------------------------------------ RocePacket */

typedef struct {
    PyObject_HEAD
    long long kind, cid, psn, size;
    char ecn;
} RocePacket;

static PyTypeObject RocePacketType;

static PyObject *
packet_new(long long kind, long long cid, long long psn, long long size, int ecn)
{
    RocePacket *p = PyObject_New(RocePacket, &RocePacketType);
    if (p == NULL)
        return NULL;
    p->kind = kind;
    p->cid = cid;
    p->psn = psn;
    p->size = size;
    p->ecn = (char)(ecn != 0);
    return (PyObject *)p;
}

static PyObject *
packet_tp_new(PyTypeObject *Py_UNUSED(t), PyObject *args, PyObject *kw)
{
    static char *names[] = {"kind", "cid", "psn", "size", "ecn", NULL};
    long long kind, cid, psn, size;
    int ecn = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLLL|p", names, &kind, &cid, &psn, &size, &ecn))
        return NULL;
    return packet_new(kind, cid, psn, size, ecn);
}

static Py_ssize_t
packet_len(PyObject *o)
{
    return (Py_ssize_t)((RocePacket *)o)->size;
}

static PyObject *
packet_repr(PyObject *o)
{
    RocePacket *p = (RocePacket *)o;
    return PyUnicode_FromFormat("RocePacket(kind=%lld, cid=%lld, psn=%lld, size=%lld, ecn=%s)", p->kind, p->cid,
                                p->psn, p->size, p->ecn ? "True" : "False");
}

static PyMemberDef packet_members[] = {
    {"kind", T_LONGLONG, offsetof(RocePacket, kind), 0, NULL},
    {"cid", T_LONGLONG, offsetof(RocePacket, cid), 0, NULL},
    {"psn", T_LONGLONG, offsetof(RocePacket, psn), 0, NULL},
    {"size", T_LONGLONG, offsetof(RocePacket, size), 0, NULL},
    {"ecn", T_BOOL, offsetof(RocePacket, ecn), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods packet_seq = {.sq_length = packet_len};

static PyTypeObject RocePacketType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mrc.sim._simc.RocePacket",
    .tp_doc = "A baseline packet (roce.RocePacket): len() is its size on the wire's UDP payload.",
    .tp_basicsize = sizeof(RocePacket),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = packet_tp_new,
    .tp_members = packet_members,
    .tp_as_sequence = &packet_seq,
    .tp_repr = packet_repr,
};

/* ------------------------------------------------------------------ RoceConn */

typedef struct {
    PyObject_HEAD
    long long cid, dst, plane, sport, mtu, npkts, total, una, nxt, high, max_cwnd, win_end, win_acked,
        win_marked, cut_until, rto_base, linear_cnt, retries, rto_at, done_at, tx_packets, retx_packets,
        retx_bytes, timeouts, naks, acked_bytes;
    double cwnd, alpha, g;
    char has_total, active, woken;
    Py_ssize_t index;
    PyObject *plane_o, *sport_o, *dst_o;  /* the datagram's fields, made once */
} RoceConn;

static PyTypeObject RoceConnType;

static long long
conn_rto(RoceConn *c)
{
    long long k = c->retries - c->linear_cnt;
    if (k <= 0)
        return c->rto_base;
    if (k > 24)
        k = 24;
    if (c->rto_base > (NEVER >> k))
        return NEVER;  /* (Python's int would grow; the timer never fires either way) */
    return c->rto_base << k;
}

static long long
sat_add(long long a, long long b)
{
    return (b > 0 && a > NEVER - b) ? NEVER : a + b;
}

static long long
conn_pkt_size(RoceConn *c, long long psn)
{
    if (!c->has_total || psn < c->npkts - 1)
        return c->mtu;
    return c->total - (c->npkts - 1) * c->mtu;
}

/* Python's float floor division a // b (Objects/floatobject.c, float_floor_div) for finite b != 0 */
static double
py_floordiv(double vx, double wx)
{
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0))
            div -= 1.0;
    }
    double floordiv;
    if (div) {
        floordiv = floor(div);
        if (div - floordiv > 0.5)
            floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, vx / wx);
    }
    return floordiv;
}

/* max(1, int(cwnd // mtu)) */
static long long
window_pkts(RoceConn *c)
{
    double q = py_floordiv(c->cwnd, (double)c->mtu);
    long long n = (long long)q;
    return n < 1 ? 1 : n;
}

static void
conn_on_ack(RoceConn *c, long long cum, int ecn, long long now)
{
    if (cum <= c->una)
        return;
    long long newly = cum - c->una;
    c->acked_bytes += newly * c->mtu;
    c->una = cum;
    c->retries = 0;
    if (cum > c->nxt)
        c->nxt = cum;
    c->win_acked += newly;
    if (ecn)
        c->win_marked += newly;
    if (cum >= c->win_end) {  /* one window: DCTCP update */
        double f = c->win_acked ? (double)c->win_marked / (double)c->win_acked : 0.0;
        c->alpha = (1 - c->g) * c->alpha + c->g * f;
        if (c->win_marked) {
            double m = (double)c->mtu, v = c->cwnd * (1 - c->alpha / 2);
            c->cwnd = v > m ? v : m;
        } else {
            double m = (double)c->max_cwnd, v = c->cwnd + (double)c->mtu;
            c->cwnd = v < m ? v : m;
        }
        c->win_acked = c->win_marked = 0;
        c->win_end = c->nxt;
    }
    if (c->una >= c->npkts) {
        c->rto_at = NEVER;
        if (c->done_at < 0)
            c->done_at = now;
    } else {
        c->rto_at = sat_add(now, c->linear_cnt >= 0 ? c->rto_base : conn_rto(c));
    }
}

static void
conn_rewind(RoceConn *c, long long psn)
{
    if (psn < c->nxt)
        c->nxt = psn;
    if (c->una >= c->cut_until) {
        double m = (double)c->mtu, v = c->cwnd / 2;
        c->cwnd = v > m ? v : m;
        c->cut_until = c->nxt + window_pkts(c);
    }
}

static void
conn_dealloc(RoceConn *c)
{
    Py_XDECREF(c->plane_o);
    Py_XDECREF(c->sport_o);
    Py_XDECREF(c->dst_o);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *
conn_get_total(RoceConn *c, void *Py_UNUSED(x))
{
    if (!c->has_total)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(c->total);
}

static PyObject *
conn_get_active(RoceConn *c, void *Py_UNUSED(x))
{
    return PyBool_FromLong(c->active);
}

/* False holds the connection (it sends nothing) until set True again; setting it lets the host look */
static int
conn_set_active(RoceConn *c, PyObject *v, void *Py_UNUSED(x))
{
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "active cannot be deleted");
        return -1;
    }
    int t = PyObject_IsTrue(v);
    if (t < 0)
        return -1;
    c->active = (char)t;
    c->woken = 1;
    return 0;
}

static PyObject *
conn_m_rto(RoceConn *c, PyObject *Py_UNUSED(a))
{
    return PyLong_FromLongLong(conn_rto(c));
}

static PyObject *
conn_m_pkt_size(RoceConn *c, PyObject *arg)
{
    long long psn = AS_LL(arg);
    if (psn == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(conn_pkt_size(c, psn));
}

static PyObject *
conn_m_on_ack(RoceConn *c, PyObject *args)
{
    long long cum, now;
    int ecn;
    if (!PyArg_ParseTuple(args, "LpL", &cum, &ecn, &now))
        return NULL;
    conn_on_ack(c, cum, ecn, now);
    Py_RETURN_NONE;
}

static PyObject *
conn_m_rewind(RoceConn *c, PyObject *arg)
{
    long long psn = AS_LL(arg);
    if (psn == -1 && PyErr_Occurred())
        return NULL;
    conn_rewind(c, psn);
    Py_RETURN_NONE;
}

static PyMethodDef conn_methods[] = {
    {"rto", (PyCFunction)conn_m_rto, METH_NOARGS, "The current ACK timeout (ns)."},
    {"pkt_size", (PyCFunction)conn_m_pkt_size, METH_O, "Payload bytes of PSN psn."},
    {"on_ack", (PyCFunction)conn_m_on_ack, METH_VARARGS, "on_ack(cum, ecn, now): a cumulative ACK."},
    {"rewind", (PyCFunction)conn_m_rewind, METH_O, "Go back to PSN psn (NAK or timeout)."},
    {NULL, NULL, 0, NULL},
};

#define CM(name) {#name, T_LONGLONG, offsetof(RoceConn, name), 0, NULL}
static PyMemberDef conn_members[] = {
    CM(cid), CM(dst), CM(plane), CM(sport), CM(mtu), CM(npkts), CM(una), CM(nxt), CM(high), CM(max_cwnd),
    CM(win_end), CM(win_acked), CM(win_marked), CM(cut_until), CM(rto_base), CM(linear_cnt), CM(retries),
    CM(rto_at), CM(done_at), CM(tx_packets), CM(retx_packets), CM(retx_bytes), CM(timeouts), CM(naks),
    CM(acked_bytes),
    {"cwnd", T_DOUBLE, offsetof(RoceConn, cwnd), 0, NULL},
    {"alpha", T_DOUBLE, offsetof(RoceConn, alpha), 0, NULL},
    {"g", T_DOUBLE, offsetof(RoceConn, g), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};
#undef CM

static PyGetSetDef conn_getset[] = {
    {"total", (getter)conn_get_total, NULL, "Bytes to send, None: forever.", NULL},
    {"active", (getter)conn_get_active, (setter)conn_set_active, "False holds the connection.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RoceConnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mrc.sim._simc.RoceConn",
    .tp_doc = "The requester side of one baseline connection (roce.RoceConn); made by RoceHost.connect.",
    .tp_basicsize = sizeof(RoceConn),
    .tp_flags = Py_TPFLAGS_DEFAULT,  /* (it holds only ints: no cycles) */
    .tp_dealloc = (destructor)conn_dealloc,
    .tp_members = conn_members,
    .tp_getset = conn_getset,
    .tp_methods = conn_methods,
};

/* ------------------------------------------------------------------ RoceHost */

/* the responder's record of one connection */
typedef struct {
    long long cid, exp, delivered;
    char nak;
    PyObject *plane_o, *sport_o, *src_o;
} RxRec;

typedef struct {
    PyObject_HEAD
    long long host, mtu, rto_base, linear_cnt, max_cwnd;
    double g;
    PyObject *params;  /* the RoceParams it was made with (`p`) */
    PyObject *conns;   /* list of RoceConn, in connect order */
    PyObject *by_cid;  /* dict cid -> RoceConn */
    RxRec *rx;
    Py_ssize_t nrx, cap_rx;
    PyObject *rx_index; /* dict cid -> index into rx */
    PyObject *out;      /* list: the datagrams datagrams_to_send returns next */
} RoceHost;

static PyTypeObject RoceHostType;
static void rx_clear(RoceHost *h);

static int
host_init(RoceHost *h, PyObject *args, PyObject *kw)
{
    static char *names[] = {"host", "params", "rto_base", NULL};
    PyObject *params;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LOL", names, &h->host, &params, &h->rto_base))
        return -1;
    PyObject *v;
#define GET_LL(field, name)                                                        \
    if ((v = PyObject_GetAttrString(params, name)) == NULL) return -1;            \
    h->field = AS_LL(v);                                              \
    Py_DECREF(v);                                                                 \
    if (h->field == -1 && PyErr_Occurred()) return -1
    GET_LL(mtu, "mtu");
    GET_LL(linear_cnt, "linear_cnt");
    GET_LL(max_cwnd, "max_cwnd");
#undef GET_LL
    if ((v = PyObject_GetAttrString(params, "g")) == NULL)
        return -1;
    h->g = PyFloat_AsDouble(v);
    Py_DECREF(v);
    if (h->g == -1.0 && PyErr_Occurred())
        return -1;
    if (h->mtu <= 0) {
        PyErr_SetString(PyExc_ValueError, "RoceParams.mtu must be positive");
        return -1;
    }
    rx_clear(h);
    Py_XSETREF(h->params, Py_NewRef(params));
    Py_XSETREF(h->conns, PyList_New(0));
    Py_XSETREF(h->by_cid, PyDict_New());
    Py_XSETREF(h->rx_index, PyDict_New());
    Py_XSETREF(h->out, PyList_New(0));
    if (h->conns == NULL || h->by_cid == NULL || h->rx_index == NULL || h->out == NULL)
        return -1;
    return 0;
}

static void
rx_clear(RoceHost *h)
{
    for (Py_ssize_t i = 0; i < h->nrx; i++) {
        Py_CLEAR(h->rx[i].plane_o);
        Py_CLEAR(h->rx[i].sport_o);
        Py_CLEAR(h->rx[i].src_o);
    }
    PyMem_Free(h->rx);
    h->rx = NULL;
    h->nrx = h->cap_rx = 0;
}

static int
host_traverse(RoceHost *h, visitproc visit, void *arg)
{
    Py_VISIT(h->params);
    Py_VISIT(h->conns);
    Py_VISIT(h->by_cid);
    Py_VISIT(h->rx_index);
    Py_VISIT(h->out);
    for (Py_ssize_t i = 0; i < h->nrx; i++) {
        Py_VISIT(h->rx[i].plane_o);
        Py_VISIT(h->rx[i].sport_o);
        Py_VISIT(h->rx[i].src_o);
    }
    return 0;
}

static int
host_clear(RoceHost *h)
{
    Py_CLEAR(h->params);
    Py_CLEAR(h->conns);
    Py_CLEAR(h->by_cid);
    Py_CLEAR(h->rx_index);
    Py_CLEAR(h->out);
    rx_clear(h);
    return 0;
}

static void
host_dealloc(RoceHost *h)
{
    PyObject_GC_UnTrack(h);
    host_clear(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

/* connect(cid, dst, plane, sport, total) -> RoceConn */
static PyObject *
host_connect(RoceHost *h, PyObject *args)
{
    long long cid, dst, plane, sport;
    PyObject *total;
    if (!PyArg_ParseTuple(args, "LLLLO", &cid, &dst, &plane, &sport, &total))
        return NULL;
    RoceConn *c = PyObject_New(RoceConn, &RoceConnType);
    if (c == NULL)
        return NULL;
    memset((char *)c + sizeof(PyObject), 0, sizeof(RoceConn) - sizeof(PyObject));
    c->cid = cid;
    c->dst = dst;
    c->plane = plane;
    c->sport = sport;
    c->mtu = h->mtu;
    if (total == Py_None) {
        c->has_total = 0;
        c->npkts = NEVER;
    } else {
        c->total = AS_LL(total);
        if (c->total == -1 && PyErr_Occurred()) {
            Py_DECREF(c);
            return NULL;
        }
        c->has_total = 1;
        long long n = c->total > 0 ? (c->total + h->mtu - 1) / h->mtu : 0;  /* -(-total // mtu) */
        if (c->total < 0)
            n = -((-c->total) / h->mtu);
        c->npkts = n > 1 ? n : 1;
    }
    c->cwnd = (double)h->max_cwnd;
    c->max_cwnd = h->max_cwnd;
    c->g = h->g;
    c->cut_until = -1;
    c->rto_base = h->rto_base;
    c->linear_cnt = h->linear_cnt;
    c->rto_at = NEVER;
    c->done_at = -1;
    c->active = 1;
    c->woken = 1;
    c->index = PyList_GET_SIZE(h->conns);
    c->plane_o = PyLong_FromLongLong(plane);
    c->sport_o = PyLong_FromLongLong(sport);
    c->dst_o = PyLong_FromLongLong(dst);
    PyObject *key = PyLong_FromLongLong(cid);
    if (c->plane_o == NULL || c->sport_o == NULL || c->dst_o == NULL || key == NULL
        || PyList_Append(h->conns, (PyObject *)c) < 0 || PyDict_SetItem(h->by_cid, key, (PyObject *)c) < 0) {
        Py_XDECREF(key);
        Py_DECREF(c);
        return NULL;
    }
    Py_DECREF(key);
    return (PyObject *)c;
}

/* accept(cid, src, plane, sport): the responder side of connection cid */
static PyObject *
host_accept(RoceHost *h, PyObject *args)
{
    long long cid;
    PyObject *src, *plane, *sport;
    if (!PyArg_ParseTuple(args, "LOOO", &cid, &src, &plane, &sport))
        return NULL;
    if (!PyLong_Check(src) || !PyLong_Check(plane) || !PyLong_Check(sport)) {
        PyErr_SetString(PyExc_TypeError, "accept(cid, src, plane, sport) takes ints");
        return NULL;
    }
    PyObject *key = PyLong_FromLongLong(cid);
    if (key == NULL)
        return NULL;
    PyObject *idx = PyDict_GetItemWithError(h->rx_index, key);
    Py_ssize_t i;
    if (idx != NULL) {  /* accepted again: a fresh record, as the Python dict assignment */
        i = PyLong_AsSsize_t(idx);
        Py_CLEAR(h->rx[i].plane_o);
        Py_CLEAR(h->rx[i].sport_o);
        Py_CLEAR(h->rx[i].src_o);
    } else {
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return NULL;
        }
        if (h->nrx == h->cap_rx) {
            Py_ssize_t cap = h->cap_rx ? 2 * h->cap_rx : 8;
            RxRec *n = PyMem_Realloc(h->rx, (size_t)cap * sizeof(RxRec));
            if (n == NULL) {
                Py_DECREF(key);
                return PyErr_NoMemory();
            }
            h->rx = n;
            h->cap_rx = cap;
        }
        i = h->nrx;
        PyObject *io = PyLong_FromSsize_t(i);
        if (io == NULL || PyDict_SetItem(h->rx_index, key, io) < 0) {
            Py_XDECREF(io);
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(io);
        h->nrx++;
    }
    Py_DECREF(key);
    RxRec *r = &h->rx[i];
    r->cid = cid;
    r->exp = 0;
    r->nak = 0;
    r->delivered = 0;
    r->plane_o = Py_NewRef(plane);
    r->sport_o = Py_NewRef(sport);
    r->src_o = Py_NewRef(src);
    Py_RETURN_NONE;
}

static RxRec *
rx_get(RoceHost *h, long long cid)
{
    PyObject *key = PyLong_FromLongLong(cid);
    if (key == NULL)
        return NULL;
    PyObject *idx = PyDict_GetItemWithError(h->rx_index, key);
    Py_DECREF(key);
    if (idx == NULL)
        return NULL;
    return &h->rx[PyLong_AsSsize_t(idx)];
}

static PyObject *
host_delivered(RoceHost *h, PyObject *arg)
{
    long long cid = AS_LL(arg);
    if (cid == -1 && PyErr_Occurred())
        return NULL;
    RxRec *r = rx_get(h, cid);
    if (r == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, arg);
        return NULL;
    }
    return PyLong_FromLongLong(r->delivered);
}

/* out.append((packet, plane, sport, dst)) */
static int
emit(PyObject *out, PyObject *pkt, PyObject *plane, PyObject *sport, PyObject *dst)
{
    if (pkt == NULL)
        return -1;
    PyObject *dg = PyTuple_New(4);
    if (dg == NULL) {
        Py_DECREF(pkt);
        return -1;
    }
    PyTuple_SET_ITEM(dg, 0, pkt);
    PyTuple_SET_ITEM(dg, 1, Py_NewRef(plane));
    PyTuple_SET_ITEM(dg, 2, Py_NewRef(sport));
    PyTuple_SET_ITEM(dg, 3, Py_NewRef(dst));
    int rc = PyList_Append(out, dg);
    Py_DECREF(dg);
    return rc;
}

/* receive(pkt, now, ecn=False, port=0, src=None) */
static PyObject *
host_receive(RoceHost *h, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 2 || nargs > 5 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, "receive(pkt, now, ecn=False, port=0, src=None): positional only");
        return NULL;
    }
    if (Py_TYPE(args[0]) != &RocePacketType) {
        PyErr_SetString(PyExc_TypeError, "a baseline host receives RocePackets");
        return NULL;
    }
    RocePacket *pkt = (RocePacket *)args[0];
    long long now = AS_LL(args[1]);
    if (now == -1 && PyErr_Occurred())
        return NULL;
    int ecn = 0;
    if (nargs > 2 && (ecn = PyObject_IsTrue(args[2])) < 0)
        return NULL;
    if (pkt->kind == DATA) {
        RxRec *r = rx_get(h, pkt->cid);
        if (r == NULL) {
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
        long long psn = pkt->psn, exp = r->exp;
        int rc = 0;
        if (psn == exp) {
            r->exp = exp = exp + 1;
            r->nak = 0;
            r->delivered += pkt->size - DATA_HDR;
            /* control packets go back on the same plane with the connection's 5-tuple (reversed) */
            rc = emit(h->out, packet_new(ACK, pkt->cid, exp, CTRL_SIZE, ecn), r->plane_o, r->sport_o, r->src_o);
        } else if (psn > exp) {
            if (!r->nak) {
                r->nak = 1;
                rc = emit(h->out, packet_new(NAK, pkt->cid, exp, CTRL_SIZE, ecn), r->plane_o, r->sport_o,
                          r->src_o);
            }
        } else {
            rc = emit(h->out, packet_new(ACK, pkt->cid, exp, CTRL_SIZE, ecn), r->plane_o, r->sport_o, r->src_o);
        }
        if (rc < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *key = PyLong_FromLongLong(pkt->cid);
    if (key == NULL)
        return NULL;
    PyObject *co = PyDict_GetItemWithError(h->by_cid, key);
    Py_DECREF(key);
    if (co == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    RoceConn *c = (RoceConn *)co;
    c->woken = 1;
    conn_on_ack(c, pkt->psn, pkt->ecn, now);
    if (pkt->kind == NAK) {
        c->naks += 1;
        conn_rewind(c, pkt->psn);
    }
    Py_RETURN_NONE;
}

static PyObject *
host_handle_timer(RoceHost *h, PyObject *arg)
{
    long long now = AS_LL(arg);
    if (now == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(h->conns);
    for (Py_ssize_t i = 0; i < n; i++) {
        RoceConn *c = (RoceConn *)PyList_GET_ITEM(h->conns, i);
        if (c->rto_at <= now) {
            c->woken = 1;
            c->timeouts += 1;
            c->retries += 1;
            conn_rewind(c, c->una);
            c->rto_at = sat_add(now, conn_rto(c));
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
host_datagrams_to_send(RoceHost *h, PyObject *arg)
{
    long long now = AS_LL(arg);
    if (now == -1 && PyErr_Occurred())
        return NULL;
    PyObject *out = h->out;
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    h->out = fresh;  /* `out` is the caller's now */
    /* the woken connections, each once, in connection order */
    Py_ssize_t n = PyList_GET_SIZE(h->conns);
    for (Py_ssize_t i = 0; i < n; i++) {
        RoceConn *c = (RoceConn *)PyList_GET_ITEM(h->conns, i);
        if (!c->woken)
            continue;
        c->woken = 0;
        long long nxt = c->nxt, npkts = c->npkts;
        if (nxt >= npkts || !c->active)
            continue;
        long long mtu = c->mtu, limit = c->una + window_pkts(c);
        if (nxt >= limit)
            continue;
        long long end = limit < npkts ? limit : npkts;
        long long full = mtu + DATA_HDR, last = c->has_total ? npkts - 1 : NEVER;
        for (long long psn = nxt; psn < end; psn++) {
            long long size = psn < last ? full : conn_pkt_size(c, psn) + DATA_HDR;
            if (emit(out, packet_new(DATA, c->cid, psn, size, 0), c->plane_o, c->sport_o, c->dst_o) < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
        c->tx_packets += end - nxt;
        if (nxt < c->high) {
            long long hi = end < c->high ? end : c->high;
            c->retx_packets += hi - nxt;
            for (long long p = nxt; p < hi; p++)
                c->retx_bytes += conn_pkt_size(c, p);
        }
        c->nxt = end;
        if (end > c->high)
            c->high = end;
        if (c->rto_at == NEVER)
            c->rto_at = sat_add(now, conn_rto(c));
    }
    return out;
}

static PyObject *
host_next_deadline(RoceHost *h, PyObject *Py_UNUSED(a))
{
    long long d = NEVER;
    Py_ssize_t n = PyList_GET_SIZE(h->conns);
    for (Py_ssize_t i = 0; i < n; i++) {
        RoceConn *c = (RoceConn *)PyList_GET_ITEM(h->conns, i);
        if (c->rto_at < d)
            d = c->rto_at;
    }
    if (d >= NEVER)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(d);
}

static PyObject *
host_get_conns(RoceHost *h, void *Py_UNUSED(x))
{
    return PyList_GetSlice(h->conns, 0, PyList_GET_SIZE(h->conns));
}

static PyObject *
host_get_params(RoceHost *h, void *Py_UNUSED(x))
{
    return Py_NewRef(h->params);
}

static PyMethodDef host_methods[] = {
    {"connect", (PyCFunction)host_connect, METH_VARARGS, "connect(cid, dst, plane, sport, total) -> RoceConn"},
    {"accept", (PyCFunction)host_accept, METH_VARARGS, "accept(cid, src, plane, sport)"},
    {"delivered", (PyCFunction)host_delivered, METH_O, "Payload bytes delivered in order on connection cid."},
    {"receive", (PyCFunction)(void (*)(void))host_receive, METH_FASTCALL | METH_KEYWORDS,
     "receive(pkt, now, ecn=False, port=0, src=None)"},
    {"handle_timer", (PyCFunction)host_handle_timer, METH_O, "handle_timer(now)"},
    {"datagrams_to_send", (PyCFunction)host_datagrams_to_send, METH_O, "datagrams_to_send(now) -> list"},
    {"next_deadline", (PyCFunction)host_next_deadline, METH_NOARGS, "next_deadline() -> int | None"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef host_members[] = {
    {"host", T_LONGLONG, offsetof(RoceHost, host), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef host_getset[] = {
    {"conns", (getter)host_get_conns, NULL, "The connections, in connect order (a copy).", NULL},
    {"p", (getter)host_get_params, NULL, "The RoceParams.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RoceHostType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mrc.sim._simc.RoceHost",
    .tp_doc = "RoceHost(host, params, rto_base): roce.RoceHost in C (all baseline connections of one host).",
    .tp_basicsize = sizeof(RoceHost),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)host_init,
    .tp_traverse = (traverseproc)host_traverse,
    .tp_clear = (inquiry)host_clear,
    .tp_dealloc = (destructor)host_dealloc,
    .tp_methods = host_methods,
    .tp_members = host_members,
    .tp_getset = host_getset,
};

int
roce_add_types(PyObject *m)
{
    if (PyType_Ready(&RocePacketType) < 0 || PyType_Ready(&RoceConnType) < 0 || PyType_Ready(&RoceHostType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "RocePacket", (PyObject *)&RocePacketType) < 0
        || PyModule_AddObjectRef(m, "RoceConn", (PyObject *)&RoceConnType) < 0
        || PyModule_AddObjectRef(m, "RoceHost", (PyObject *)&RoceHostType) < 0)
        return -1;
    return 0;
}

PyObject *
roce_consts(void)
{
    return Py_BuildValue("{sisisisisisL}", "DATA", DATA, "ACK", ACK, "NAK", NAK, "DATA_HDR", DATA_HDR,
                         "CTRL_SIZE", CTRL_SIZE, "NEVER", NEVER);
}
