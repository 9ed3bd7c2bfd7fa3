/* The engine's fast path in C: `fastpath.receive` and `fastpath.send_new` for the common data packet,
 * and the SACK path's common case (`_sack_rx` to `Requester.sack_rx`, on_sack's acknowledgement loop,
 * loss detection's walk, the RTT estimators), on the engine's own Python objects.
 *
 * Why C and not numba: the per-packet cost left on the fast path is the interpreter's (attribute
 * loads and stores, calls, int boxing), not arithmetic. The engine's state lives in `__slots__`, so a
 * slot is a pointer at a fixed offset of its object: this module reads the offsets from the classes'
 * member descriptors once (`setup`) and then loads and stores the same Python objects the pure path
 * uses. No state is copied in or out, nothing changes for the pure path, and every case this file does
 * not handle (any packet but a plain WRITE in the middle of a message or a SACK, any failed check, an
 * unexpected type) goes to the Python fast path before any state has changed, which in turn sends the rare cases
 * to the pure path. So there is one implementation of every rule, and this one is a transcription of
 * `fastpath.py`'s common case, checked datagram by datagram against the pure path
 * (tests/unit/test_fastpath.py).
 *
 * The CRC-32 is ISA-L's (`crc32_gzip_refl`, from python-isal's extension, its address given to
 * `setup`): the same function `isal_zlib.crc32` calls. Without it this module is not used.
 *
 * MRC_FASTPATH=py keeps the Python fast path (fastpath.py) for side-by-side measurements, and
 * MRC_FASTPATH=0 the pure path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>

#include "../_cint.h" /* AS_LL, AS_ULL */

/* wire constants (mrc/wire/consts.py): `consts()` returns them and the Python side refuses this module
 * when one differs */
#define WRITE_HDR_LEN 52
#define WRITE_IMM_HDR_LEN 56
#define ICRC_LEN 4
#define UDP_LEN 8
#define BTH4_ZERO 0x0F6A70D9u  /* icrc._BTH4_ZERO */
#define ICRC_CACHE_MAX 8192  /* icrc._PREFIX_CACHE_MAX */
#define RACK_CALM 256  /* recovery.RACK_CALM */
#define OP_WRITE 0x0A
#define OP_WRITE_IMM 0x0B
#define PKEY_PARTITION 0x7FFF
#define DEFAULT_PKEY 0xFFFF
#define QPN_MASK 0xFFFFFFu
#define PSN_MASK 0xFFFFFFu
#define HALF 0x800000u
#define MXH_VERSION 1
#define MAX_PAYLOAD 8192
#define EV_INDEX_MAX 0x3FFF
#define EV_SPORT_BASE 0xC000
#define F_TRIMMED 0x01
#define F_RETX 0x02
#define F_FIRST 0x04
#define F_LAST 0x08
#define F_ACK_NOW 0x10
#define S_RETX 0x02
#define ACKREQ_BIT 0x80000000u
#define CRC32_RESIDUE 0x2144DF1Cu
#define NEVER (1LL << 62)
/* qpcore's tx_state values */
#define TX_INFLIGHT 1

#define FASTC_ABI 5  /* fastpath._FASTC_ABI: raise both with any change of setup() or a function's contract */

typedef uint32_t (*crc_fn)(uint32_t init, const unsigned char *buf, uint64_t len);

static crc_fn crc32 = NULL;
static PyTypeObject *qp_type = NULL;  /* QueuePair */
static PyTypeObject *mr_type = NULL;  /* MemoryRegion */
static PyTypeObject *wr_type = NULL;  /* SendWr */
static PyTypeObject *icrc_type = NULL;  /* IcrcContext */
static PyTypeObject *dg_type = NULL;  /* Datagram (a tuple subclass) */
static PyObject *sack_type = NULL;  /* mrc.wire.control.Sack */
static PyObject *st_rts = NULL, *st_rtr = NULL;  /* QpState.RTS, QpState.RTR */
static PyObject *py_receive = NULL;  /* fastpath.receive: every case this file does not take */
static PyObject *py_sack = NULL;  /* fastpath.sack */
static PyObject *s_qps, *s_out, *s_ack_delay_ns, *s_cwnd, *s_window_limited, *s_cwnd_limited,
    *s_next_ev, *s_rto_interval, *s_start;

/* slot offsets */
static Py_ssize_t
    o_state, o_peer_gid, o_rx_icrc, o_rcv_cum, o_rbits, o_Wd, o_mrs, o_msgs, o_rx_packets, o_rx_bytes,
    o_unacked, o_ack_coalesce, o_last_rx, o_ack_deadline, o_attr,
    /* requester */
    o_W, o_mtu, o_snd_nxt, o_snd_una, o_wlim, o_cc, o_inflight, o_ack_floor, o_paths, o_tx_state, o_tx_len,
    o_tx_ev, o_tx_time, o_tx_serial, o_tx_wr, o_tx_off, o_tx_retx, o_tx_icrc, o_peer_qpn, o_serial, o_c,
    o_rto_deadline, o_ts_off, o_ackreq_since, o_ackreq_div, o_cur, o_tx_bytes, o_max_outstanding,
    /* MemoryRegion */
    o_mr_addr, o_mr_length, o_mr_remote_write, o_mr_view,
    /* SendWr */
    o_wr_msn, o_wr_mr, o_wr_offset, o_wr_length, o_wr_remote_addr, o_wr_rkey, o_wr_imm, o_wr_sent,
    o_wr_first_psn, o_wr_last_psn,
    /* IcrcContext */
    o_i_start, o_i_src, o_i_dst, o_i_dport;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static int ready = 0;
static PyObject *receive_fn = NULL;  /* this module's `receive` function object (set at import) */
static PyObject *send_new_fn = NULL;  /* this module's `send_new` (set at import) */

/* ------------------------------------------------------------------------------------------ helpers */

static int
slot_offset(PyTypeObject *tp, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)tp, name);
    if (d == NULL)
        return -1;
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", tp->tp_name, name);
        Py_DECREF(d);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", tp->tp_name, name);
        Py_DECREF(d);
        return -1;
    }
    *out = m->offset;
    Py_DECREF(d);
    return 0;
}

/* a slot as a C integer: -1 on failure with an exception set (callers before any change of state
 * clear it and take the Python path) */
static inline int
slot_ll(PyObject *o, Py_ssize_t off, long long *v)
{
    PyObject *x = SLOT(o, off);
    if (x == NULL || !PyLong_CheckExact(x)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "slot is not an int");
        return -1;
    }
    *v = AS_LL(x);
    if (*v == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

/* store a new reference in a slot (steals `v`; NULL: error already set) */
static inline int
slot_set(PyObject *o, Py_ssize_t off, PyObject *v)
{
    if (v == NULL)
        return -1;
    PyObject **p = (PyObject **)((char *)o + off);
    PyObject *old = *p;
    *p = v;
    Py_XDECREF(old);
    return 0;
}

static inline int
slot_set_ll(PyObject *o, Py_ssize_t off, long long v)
{
    return slot_set(o, off, PyLong_FromLongLong(v));
}

static inline uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }
static inline uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t be64(const unsigned char *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }
static inline void put16(unsigned char *p, uint32_t v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }
static inline void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}
static inline void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }

/* IcrcContext.start's value for (end, sport), computed as icrc.py computes it: the CRC of the 56-byte
 * envelope (8 x 0xFF, the IPv6 header with traffic class, flow label and hop limit masked, the UDP header
 * with its checksum masked) xor _BTH4_ZERO; -1 where the Python method would do anything else (a length
 * struct.pack refuses, an address that is not 16 bytes, an odd port), so the caller asks it. */
static long long
icrc_envelope(PyObject *ic, long end, long sport)
{
    PyObject *src = SLOT(ic, o_i_src), *dst = SLOT(ic, o_i_dst), *dport = SLOT(ic, o_i_dport);
    long udp_len = UDP_LEN + end + ICRC_LEN;
    if (src == NULL || dst == NULL || dport == NULL || !PyBytes_CheckExact(src) || PyBytes_GET_SIZE(src) != 16
        || !PyBytes_CheckExact(dst) || PyBytes_GET_SIZE(dst) != 16 || !PyLong_CheckExact(dport)
        || end < 0 || udp_len > 0xFFFF || sport < 0 || sport > 0xFFFF)
        return -1;
    long dp = PyLong_AsLong(dport);
    if (dp < 0 || dp > 0xFFFF) {
        PyErr_Clear();
        return -1;
    }
    unsigned char e[56];
    memset(e, 0xFF, 8);
    put32(e + 8, 0x6FFFFFFFu);
    put16(e + 12, (uint32_t)udp_len);
    e[14] = 17;
    e[15] = 0xFF;
    memcpy(e + 16, PyBytes_AS_STRING(src), 16);
    memcpy(e + 32, PyBytes_AS_STRING(dst), 16);
    put16(e + 48, (uint32_t)sport);
    put16(e + 50, (uint32_t)dp);
    put16(e + 52, (uint32_t)udp_len);
    put16(e + 54, 0xFFFF);
    return (long long)(crc32(0, e, sizeof(e)) ^ BTH4_ZERO);
}

/* The ICRC start value of an IcrcContext for (end, sport) (`IcrcContext.start`): from its cache, keyed
 * sport << 32 | end as icrc.py keys it, else computed here and cached under the same bound. -1 when the
 * Python method must answer (see icrc_envelope), or on error: the caller then calls it. */
static long long
icrc_start(PyObject *ic, long end, long sport)
{
    if (ic == NULL || Py_TYPE(ic) != icrc_type)
        return -1;
    PyObject *cache = SLOT(ic, o_i_start);
    if (cache == NULL || !PyDict_CheckExact(cache) || end < 0 || end > 0xFFFFFFFFL || sport < 0)
        return -1;
    PyObject *key = PyLong_FromLongLong(((long long)sport << 32) | end);
    if (key == NULL) {
        PyErr_Clear();
        return -1;
    }
    PyObject *v = PyDict_GetItemWithError(cache, key);  /* borrowed */
    long long r = -1;
    if (v != NULL) {
        r = AS_LL(v);
    } else if (!PyErr_Occurred() && (r = icrc_envelope(ic, end, sport)) >= 0) {
        PyObject *vo = PyLong_FromLongLong(r);
        if (vo != NULL && PyDict_GET_SIZE(cache) >= ICRC_CACHE_MAX)
            PyDict_Clear(cache);  /* icrc.py's bound: past it the cache starts over */
        if (vo == NULL || PyDict_SetItem(cache, key, vo) < 0)
            r = -1;
        Py_XDECREF(vo);
    }
    Py_DECREF(key);
    if (r < 0 && PyErr_Occurred())
        PyErr_Clear();
    return r < 0 ? -1 : r;
}

/* c[name] += 1 on the QP's counter dict */
static int
count(PyObject *c, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(c, name);
    if (v == NULL) {
        if (PyErr_Occurred())
            return -1;
        v = PyLong_FromLong(1);
    } else {
        long long x = AS_LL(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        v = PyLong_FromLongLong(x + 1);
    }
    if (v == NULL)
        return -1;
    int r = PyDict_SetItem(c, name, v);
    Py_DECREF(v);
    return r;
}

/* the ICRC of b[0:end] (start value from the context's cache, or computed and cached by its `start`)
 * written at b[end:end+4], little-endian; 0, or -1 with an exception set */
static int
icrc_seal(PyObject *ic, unsigned char *b, Py_ssize_t end, long sport)
{
    long long v = icrc_start(ic, (long)end, sport);
    if (v < 0) {
        PyObject *x = PyObject_CallMethod(ic, "start", "nl", end, sport);
        if (x == NULL)
            return -1;
        v = AS_LL(x);
        Py_DECREF(x);
        if (v == -1 && PyErr_Occurred())
            return -1;
    }
    uint32_t crc = crc32((uint32_t)v, b, (uint64_t)end);
    b[end] = (unsigned char)crc;
    b[end + 1] = (unsigned char)(crc >> 8);
    b[end + 2] = (unsigned char)(crc >> 16);
    b[end + 3] = (unsigned char)(crc >> 24);
    return 0;
}

/* ---------------------------------------------------------------------------------------- receive */

static PyObject *
slow_receive(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyErr_Clear();
    if (py_receive == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastc.receive before _fastc.setup");
        return NULL;
    }
    return PyObject_Vectorcall(py_receive, args, nargs, kwnames);
}

/* rbits with bit d set, shifted past the run of ones at its bottom when d == 0 (the new cumulative
 * count in *t); *had: the bit was set already. Returns a new reference, NULL on error. */

/* int.bit_length() of a non-negative int: the private _PyLong_NumBits where the headers still declare
 * it (before 3.13), the method otherwise. -1 with an exception on error. */
static long
bit_length(PyObject *x)
{
#if PY_VERSION_HEX < 0x030D0000
    size_t nb = _PyLong_NumBits(x);
    return nb == (size_t)-1 ? -1 : (long)nb;
#else
    PyObject *r = PyObject_CallMethod(x, "bit_length", NULL);
    if (r == NULL)
        return -1;
    long nb = PyLong_AsLong(r);
    Py_DECREF(r);
    return nb;
#endif
}

static PyObject *
bitmap_add(PyObject *rbits, long d, int *had, long *t)
{
    *t = 0;
    if (d < 63) {
        unsigned long long r = AS_ULL(rbits);
        if (!(r == (unsigned long long)-1 && PyErr_Occurred())) {
            unsigned long long bit = 1ULL << d;
            *had = (r & bit) != 0;
            if (*had)
                return Py_NewRef(rbits);
            r |= bit;
            if (d == 0) {
                long k = (~r == 0) ? 64 : __builtin_ctzll(~r);
                *t = k;
                r = k >= 64 ? 0 : r >> k;
            }
            return PyLong_FromUnsignedLongLong(r);
        }
        PyErr_Clear();
    }
    PyObject *one = PyLong_FromLong(1), *dd = PyLong_FromLong(d), *bit = NULL, *x = NULL, *res = NULL;
    if (one == NULL || dd == NULL)
        goto out;
    bit = PyNumber_Lshift(one, dd);
    if (bit == NULL)
        goto out;
    x = PyNumber_And(rbits, bit);
    if (x == NULL)
        goto out;
    *had = PyObject_IsTrue(x);
    Py_CLEAR(x);
    if (*had < 0)
        goto out;
    if (*had) {
        res = Py_NewRef(rbits);
        goto out;
    }
    res = PyNumber_Or(rbits, bit);
    if (res == NULL || d != 0)
        goto out;
    {
        PyObject *p1 = PyNumber_Add(res, one);
        if (p1 == NULL) { Py_CLEAR(res); goto out; }
        PyObject *xr = PyNumber_Xor(res, p1);
        Py_DECREF(p1);
        if (xr == NULL) { Py_CLEAR(res); goto out; }
        long nb = bit_length(xr);
        Py_DECREF(xr);
        if (nb < 0) { Py_CLEAR(res); goto out; }
        *t = nb - 1;
        PyObject *tt = PyLong_FromLong(*t);
        if (tt == NULL) { Py_CLEAR(res); goto out; }
        PyObject *sh = PyNumber_Rshift(res, tt);
        Py_DECREF(tt);
        Py_DECREF(res);
        res = sh;
    }
out:
    Py_XDECREF(one); Py_XDECREF(dd); Py_XDECREF(bit);
    return res;
}

#define OP_SACK 0xC0
#define SACK_HDR_LEN 56  /* BTH 12 + MXH 24 + the SACK's fixed body 20 */
#define S_DUP 0x04
#define SACK_MAX_WORDS 16

static Py_ssize_t o_ack_coalesce_sum;
static PyObject *s_ctl_ev, *s_ev_port, *s_sack_tx, *s_sack_rx;

static int
py_sack_call(PyObject *qp, PyObject *nowo, PyObject *out, uint32_t psn, uint32_t ev, uint64_t ts,
             uint32_t eflags, PyObject *port)
{
    PyErr_Clear();
    PyObject *a[9];
    a[0] = qp;
    a[1] = nowo;
    a[2] = out;
    a[3] = PyLong_FromUnsignedLong(psn);
    a[4] = PyLong_FromUnsignedLong(ev);
    a[5] = PyLong_FromUnsignedLongLong(ts);
    a[6] = PyLong_FromUnsignedLong(eflags);
    a[7] = PyLong_FromLong(0);
    a[8] = port;
    PyObject *res = NULL;
    if (a[3] && a[4] && a[5] && a[6] && a[7])
        res = PyObject_Vectorcall(py_sack, a, 9, NULL);
    for (int i = 3; i < 8; i++)
        Py_XDECREF(a[i]);
    Py_XDECREF(res);
    return res ? 0 : -1;
}

/* `fastpath.sack` (service time 0) for a bitmap of at most 64 bits, the common case; a wider one, or
 * an unexpected slot, takes the Python function before anything changed. 0, or -1 with an exception. */
static int do_sack_held(PyObject *qp, PyObject *nowo, long long now, PyObject *out, uint32_t psn, uint32_t ev,
                        uint64_t ts, uint32_t eflags, PyObject *port);

/* The SACK for a data packet. It calls into Python (`paths.ctl_ev`), which could rebind the QP's slots:
 * the objects the SACK reads from them are held for the whole call. */
static int
do_sack(PyObject *qp, PyObject *nowo, long long now, PyObject *out, uint32_t psn, uint32_t ev, uint64_t ts,
        uint32_t eflags, PyObject *port)
{
    PyObject *held[] = {SLOT(qp, o_rbits), SLOT(qp, o_paths), SLOT(qp, o_tx_icrc), SLOT(qp, o_peer_gid),
                        SLOT(qp, o_c)};
    for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
        Py_XINCREF(held[i]);
    int rc = do_sack_held(qp, nowo, now, out, psn, ev, ts, eflags, port);
    for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
        Py_XDECREF(held[i]);
    return rc;
}

static int
do_sack_held(PyObject *qp, PyObject *nowo, long long now, PyObject *out, uint32_t psn, uint32_t ev, uint64_t ts,
             uint32_t eflags, PyObject *port)
{
    PyObject *rbits = SLOT(qp, o_rbits);
    long long rcv_cum, peer_qpn, ack_coalesce, ack_coalesce_sum;
    PyObject *paths = SLOT(qp, o_paths), *ic = SLOT(qp, o_tx_icrc), *gid = SLOT(qp, o_peer_gid),
             *c = SLOT(qp, o_c);
    if (rbits == NULL || !PyLong_CheckExact(rbits) || paths == NULL || ic == NULL || gid == NULL || c == NULL
        || !PyDict_CheckExact(c) || !PyList_CheckExact(out) || slot_ll(qp, o_rcv_cum, &rcv_cum)
        || slot_ll(qp, o_peer_qpn, &peer_qpn) || slot_ll(qp, o_ack_coalesce, &ack_coalesce)
        || slot_ll(qp, o_ack_coalesce_sum, &ack_coalesce_sum))
        return py_sack_call(qp, nowo, out, psn, ev, ts, eflags, port);
    unsigned long long r = AS_ULL(rbits);
    if (r == (unsigned long long)-1 && PyErr_Occurred())
        return py_sack_call(qp, nowo, out, psn, ev, ts, eflags, port);
    uint64_t bm = r >> 1;  /* at most 63 bits: one word */
    const Py_ssize_t words = 1;
    /* cev = paths.ctl_ev(port, -1 if eflags & S_DUP else ev) */
    PyObject *echo = PyLong_FromLong((eflags & S_DUP) ? -1 : (long)ev);
    if (echo == NULL)
        return -1;
    PyObject *cevo = PyObject_CallMethodObjArgs(paths, s_ctl_ev, port, echo, NULL);
    Py_DECREF(echo);
    if (cevo == NULL)
        return -1;
    long cev = PyLong_AsLong(cevo);
    if (cev == -1 && PyErr_Occurred()) {
        Py_DECREF(cevo);
        return -1;
    }
    PyObject *ev_port = PyObject_GetAttr(paths, s_ev_port);
    if (ev_port == NULL || !PyList_Check(ev_port) || cev < 0 || cev >= PyList_GET_SIZE(ev_port) || cev > 0xFFFF) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "control EV %ld outside the QP's profile", cev);
        Py_XDECREF(ev_port);
        Py_DECREF(cevo);
        return -1;
    }
    PyObject *dport = Py_NewRef(PyList_GET_ITEM(ev_port, cev));
    Py_DECREF(ev_port);
    Py_ssize_t end = SACK_HDR_LEN + 8 * words;
    PyObject *buf = PyByteArray_FromStringAndSize(NULL, end + ICRC_LEN);
    if (buf == NULL)
        goto fail;
    unsigned char *b = (unsigned char *)PyByteArray_AS_STRING(buf);
    b[0] = OP_SACK;
    b[1] = 0;
    put16(b + 2, DEFAULT_PKEY);
    put32(b + 4, (uint32_t)(peer_qpn & QPN_MASK));
    put32(b + 8, psn & PSN_MASK);
    b[12] = MXH_VERSION;
    b[13] = 0;
    put16(b + 14, (uint32_t)cev);
    put32(b + 16, 0);
    put32(b + 20, 0);
    put32(b + 24, 0);
    put64(b + 28, (uint64_t)now);
    put32(b + 36, (uint32_t)(rcv_cum & PSN_MASK));
    put16(b + 40, ev);
    b[42] = (unsigned char)eflags;
    b[43] = (unsigned char)words;
    put64(b + 44, ts);
    put32(b + 52, 0);  /* service time */
    for (int i = 0; i < 8; i++)  /* the bitmap, little-endian words */
        b[SACK_HDR_LEN + i] = (unsigned char)(bm >> (8 * i));
    if (icrc_seal(ic, b, end, EV_SPORT_BASE | (cev & EV_INDEX_MAX))) {
        Py_DECREF(buf);
        goto fail;
    }
    if (!(eflags & S_DUP)) {  /* as Responder._sack: a duplicate's answer leaves the ACK policy's state */
        if (slot_set_ll(qp, o_unacked, 0) || slot_set_ll(qp, o_ack_coalesce, ack_coalesce_sum - ack_coalesce)
            || slot_set_ll(qp, o_ack_deadline, NEVER)) {
            Py_DECREF(buf);
            goto fail;
        }
    }
    if (count(c, s_sack_tx)) {
        Py_DECREF(buf);
        goto fail;
    }
    PyObject *dg = dg_type->tp_alloc(dg_type, 4);
    if (dg == NULL) {
        Py_DECREF(buf);
        goto fail;
    }
    PyTuple_SET_ITEM(dg, 0, buf);
    PyTuple_SET_ITEM(dg, 1, dport);
    PyTuple_SET_ITEM(dg, 2, cevo);
    PyTuple_SET_ITEM(dg, 3, Py_NewRef(gid));
    int rc = PyList_Append(out, dg);
    Py_DECREF(dg);
    return rc;
fail:
    Py_DECREF(dport);
    Py_DECREF(cevo);
    return -1;
}

/* A SACK as fastpath._sack_rx takes it (every check of `parse`, the ICRC by the residue, BTH bytes 1 and
 * 4 zero as endpoints send them) given to `Requester.sack_rx(psn, Sack(...), now)` without the Python
 * receive and parse in between; anything else to the Python path, which takes it from the start. */
static PyObject *
sack_receive(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *qp, const unsigned char *p,
             Py_ssize_t n, PyObject *nowo)
{
    if (sack_type == NULL || n > SACK_HDR_LEN + 8 * SACK_MAX_WORDS + ICRC_LEN)
        return slow_receive(args, nargs, kwnames);
    uint32_t b1 = p[1], pkey = be16(p + 2), qw = be32(p + 4), pw = be32(p + 8), ver = p[12], flags = p[13],
             ev = be16(p + 14), cum = be32(p + 36), eev = be16(p + 40), eflags = p[42], words = p[43],
             svc = be32(p + 52);
    uint64_t ets = be64(p + 44);
    Py_ssize_t end = SACK_HDR_LEN + 8 * (Py_ssize_t)words;
    if (b1 || (pkey & PKEY_PARTITION) != PKEY_PARTITION || qw > QPN_MASK || ver != MXH_VERSION
        || (flags & F_TRIMMED) || words < 1 || n != end + ICRC_LEN || ev > EV_INDEX_MAX)
        return slow_receive(args, nargs, kwnames);
    long long v = icrc_start(SLOT(qp, o_rx_icrc), (long)end, EV_SPORT_BASE | (long)ev);
    if (v < 0 || crc32((uint32_t)v, p, (uint64_t)n) != CRC32_RESIDUE)
        return slow_receive(args, nargs, kwnames);
    /* the bitmap: int.from_bytes(p[56:end], "little"), 64 bits at a time from the top */
    PyObject *bits = NULL, *sixty_four = NULL;
    for (Py_ssize_t w = (Py_ssize_t)words - 1; w >= 0; w--) {
        const unsigned char *q = p + SACK_HDR_LEN + 8 * w;
        uint64_t x = 0;
        for (int k = 7; k >= 0; k--)
            x = (x << 8) | q[k];
        PyObject *xo = PyLong_FromUnsignedLongLong(x);
        if (xo == NULL)
            goto fail;
        if (bits == NULL) {
            bits = xo;
            continue;
        }
        if (sixty_four == NULL && (sixty_four = PyLong_FromLong(64)) == NULL) {
            Py_DECREF(xo);
            goto fail;
        }
        PyObject *hi = PyNumber_Lshift(bits, sixty_four);
        Py_SETREF(bits, hi == NULL ? NULL : PyNumber_Or(hi, xo));
        Py_XDECREF(hi);
        Py_DECREF(xo);
        if (bits == NULL)
            goto fail;
    }
    PyObject *sa[7] = {PyLong_FromUnsignedLong(cum & PSN_MASK), PyLong_FromUnsignedLong(eev),
                       PyLong_FromUnsignedLong(eflags), PyLong_FromUnsignedLongLong(ets),
                       PyLong_FromUnsignedLong(svc), bits, PyLong_FromLong(64L * (long)words)};
    bits = NULL;  /* (in sa now) */
    PyObject *sack = NULL, *psn = NULL, *r = NULL;
    int bad = 0;
    for (int i = 0; i < 7; i++)
        bad |= sa[i] == NULL;
    if (!bad)
        sack = PyObject_Vectorcall(sack_type, sa, 7, NULL);
    for (int i = 0; i < 7; i++)
        Py_XDECREF(sa[i]);
    if (sack != NULL && (psn = PyLong_FromUnsignedLong(pw & PSN_MASK)) != NULL) {
        PyObject *ra[4] = {qp, psn, sack, nowo};
        r = PyObject_VectorcallMethod(s_sack_rx, ra, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_XDECREF(sack);
    Py_XDECREF(psn);
    Py_XDECREF(sixty_four);
    return r;
fail:
    Py_XDECREF(bits);
    Py_XDECREF(sixty_four);
    return NULL;
}

/* receive(ctx, data, now, ecn=False, port=0, src=None): `fastpath.receive` for the common data packet;
 * everything else (and keyword calls) to it. */
static PyObject *
c_receive(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (!ready || nargs < 3 || nargs > 6)
        return slow_receive(args, nargs, kwnames);
    /* ctx, data, now, ecn, port, src: positional, or the last three by keyword */
    PyObject *a[6] = {NULL, NULL, NULL, Py_False, NULL, Py_None};
    for (Py_ssize_t i = 0; i < nargs; i++)
        a[i] = args[i];
    if (kwnames != NULL) {
        static const char *const names[] = {"ecn", "port", "src"};
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            int j = 0;
            while (j < 3 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), names[j]) != 0)
                j++;
            if (j == 3 || 3 + j < nargs)  /* unknown, or given twice: the Python path's error */
                return slow_receive(args, nargs, kwnames);
            a[3 + j] = args[nargs + i];
        }
    }
    PyObject *ctx = a[0], *data = a[1], *nowo = a[2];
    PyObject *porto = a[4];
    PyObject *src = a[5];
    if (a[3] != Py_False)  /* ECN (or a non-bool flag): the Python path */
        return slow_receive(args, nargs, kwnames);
    const unsigned char *p;
    Py_ssize_t n;
    if (PyBytes_CheckExact(data)) {
        p = (const unsigned char *)PyBytes_AS_STRING(data);
        n = PyBytes_GET_SIZE(data);
    } else if (PyByteArray_CheckExact(data)) {
        p = (const unsigned char *)PyByteArray_AS_STRING(data);
        n = PyByteArray_GET_SIZE(data);
    } else
        return slow_receive(args, nargs, kwnames);
    if (n < WRITE_HDR_LEN + ICRC_LEN || (p[0] != OP_WRITE && p[0] != OP_SACK) || !PyLong_CheckExact(nowo))
        return slow_receive(args, nargs, kwnames);
    long long now = AS_LL(nowo);
    if (now < 0)
        return slow_receive(args, nargs, kwnames);
    if (porto != NULL && !PyLong_CheckExact(porto))
        return slow_receive(args, nargs, kwnames);

    /* ---- the QP */
    PyObject *qps = PyObject_GetAttr(ctx, s_qps);
    if (qps == NULL || !PyDict_CheckExact(qps)) {
        Py_XDECREF(qps);
        return slow_receive(args, nargs, kwnames);
    }
    PyObject *qpn = PyLong_FromLong(((long)p[5] << 16) | ((long)p[6] << 8) | p[7]);
    PyObject *qp = qpn ? PyDict_GetItemWithError(qps, qpn) : NULL;
    Py_XDECREF(qpn);
    Py_DECREF(qps);  /* the context holds the dict, and the dict the QP, for the rest of this call */
    if (qp == NULL || Py_TYPE(qp) != qp_type)
        return slow_receive(args, nargs, kwnames);
    PyObject *state = SLOT(qp, o_state);
    if (state != st_rts && state != st_rtr)
        return slow_receive(args, nargs, kwnames);
    if (src != Py_None) {
        PyObject *gid = SLOT(qp, o_peer_gid);
        if (gid == NULL || PyObject_RichCompareBool(src, gid, Py_EQ) != 1)
            return slow_receive(args, nargs, kwnames);
    }
    if (p[0] == OP_SACK)
        return sack_receive(args, nargs, kwnames, qp, p, n, nowo);

    /* ---- parse_write */
    uint32_t b1 = p[1], pkey = be16(p + 2), qw = be32(p + 4), pw = be32(p + 8);
    uint64_t va = be64(p + 12);
    uint32_t rkey = be32(p + 20), dlen = be32(p + 24);
    uint32_t ver = p[28], flags = p[29], ev = be16(p + 30), msn = be32(p + 32), mlen = be32(p + 36),
             moff = be32(p + 40);
    uint64_t ts = be64(p + 44);
    if ((pkey & PKEY_PARTITION) != PKEY_PARTITION || (b1 & 0x0F) || qw > QPN_MASK || ver != MXH_VERSION
        || (flags & F_TRIMMED) || dlen > MAX_PAYLOAD || ev > EV_INDEX_MAX)
        return slow_receive(args, nargs, kwnames);
    uint32_t pad = (b1 >> 4) & 3;
    Py_ssize_t end = WRITE_HDR_LEN + (Py_ssize_t)dlen + pad;
    if (((dlen + pad) & 3) || n != end + ICRC_LEN || (uint64_t)moff + dlen > mlen)
        return slow_receive(args, nargs, kwnames);
    long long v = icrc_start(SLOT(qp, o_rx_icrc), (long)end, EV_SPORT_BASE | (long)(ev & EV_INDEX_MAX));
    if (v < 0 || crc32((uint32_t)v, p, (uint64_t)n) != CRC32_RESIDUE)
        return slow_receive(args, nargs, kwnames);

    /* ---- on_write's common case: every check before any change */
    long long rcv_cum, Wd, unacked, ack_coalesce, rx_packets, rx_bytes, ack_deadline;
    if (slot_ll(qp, o_rcv_cum, &rcv_cum) || slot_ll(qp, o_Wd, &Wd) || slot_ll(qp, o_unacked, &unacked)
        || slot_ll(qp, o_ack_coalesce, &ack_coalesce) || slot_ll(qp, o_rx_packets, &rx_packets)
        || slot_ll(qp, o_rx_bytes, &rx_bytes) || slot_ll(qp, o_ack_deadline, &ack_deadline))
        return slow_receive(args, nargs, kwnames);
    uint32_t psn = pw & PSN_MASK;
    long d = (long)((psn - (uint32_t)rcv_cum) & PSN_MASK);
    if (d >= (long)HALF || d >= Wd)
        return slow_receive(args, nargs, kwnames);
    PyObject *mrs = SLOT(qp, o_mrs), *msgs = SLOT(qp, o_msgs), *rbits = SLOT(qp, o_rbits);
    if (mrs == NULL || msgs == NULL || rbits == NULL || !PyDict_CheckExact(mrs) || !PyDict_CheckExact(msgs)
        || !PyLong_CheckExact(rbits))
        return slow_receive(args, nargs, kwnames);
    PyObject *k = PyLong_FromUnsignedLong(rkey);
    PyObject *mr = k ? PyDict_GetItemWithError(mrs, k) : NULL;
    Py_XDECREF(k);
    if (mr == NULL || Py_TYPE(mr) != mr_type || SLOT(mr, o_mr_remote_write) != Py_True)
        return slow_receive(args, nargs, kwnames);
    k = PyLong_FromUnsignedLong(msn);
    PyObject *m = k ? PyDict_GetItemWithError(msgs, k) : NULL;
    Py_XDECREF(k);
    if (m == NULL || !PyList_CheckExact(m) || PyList_GET_SIZE(m) < 3)
        return slow_receive(args, nargs, kwnames);
    long long addr, length, placed, mtotal;
    PyObject *m0 = PyList_GET_ITEM(m, 0), *m2 = PyList_GET_ITEM(m, 2);
    if (slot_ll(mr, o_mr_addr, &addr) || slot_ll(mr, o_mr_length, &length) || !PyLong_CheckExact(m0)
        || !PyLong_CheckExact(m2))
        return slow_receive(args, nargs, kwnames);
    placed = AS_LL(m0);
    mtotal = AS_LL(m2);
    if (PyErr_Occurred())
        return slow_receive(args, nargs, kwnames);
    /* va - addr: va is a 64-bit field; in Python it is exact, here an address below the MR is < 0 */
    if (va > (uint64_t)INT64_MAX)
        return slow_receive(args, nargs, kwnames);
    long long off = (long long)va - addr;
    /* (no sum that can overflow: off may be up to 2^63 - 1 from a hostile VA) */
    if (addr < 0 || length < 0 || off < 0 || off > length || (long long)dlen > length - off
        || placed + (long long)dlen >= mtotal)
        return slow_receive(args, nargs, kwnames);
    int had;
    long t;
    PyObject *nb = bitmap_add(rbits, d, &had, &t);
    if (nb == NULL || had) {
        Py_XDECREF(nb);
        return slow_receive(args, nargs, kwnames);
    }
    PyObject *view = SLOT(mr, o_mr_view);
    Py_buffer vb;
    if (view == NULL || PyObject_GetBuffer(view, &vb, PyBUF_WRITABLE) < 0) {
        Py_DECREF(nb);
        return slow_receive(args, nargs, kwnames);
    }
    if (!PyBuffer_IsContiguous(&vb, 'C') || off > (long long)vb.len || (long long)dlen > (long long)vb.len - off) {
        PyBuffer_Release(&vb);
        Py_DECREF(nb);
        return slow_receive(args, nargs, kwnames);
    }
    /* ---- commit (the same order as fastpath.receive) */
    memcpy((char *)vb.buf + off, p + WRITE_HDR_LEN, dlen);
    PyBuffer_Release(&vb);
    slot_set(qp, o_rbits, nb);
    if (d == 0 && slot_set_ll(qp, o_rcv_cum, (rcv_cum + t) & PSN_MASK))
        return NULL;
    if (slot_set_ll(qp, o_rx_packets, rx_packets + 1) || slot_set_ll(qp, o_rx_bytes, rx_bytes + dlen))
        return NULL;
    PyObject *np = PyLong_FromLongLong(placed + dlen);
    if (np == NULL)
        return NULL;
    PyList_SET_ITEM(m, 0, np);
    Py_DECREF(m0);
    /* acknowledgement policy (Responder.on_write's) */
    long long u = unacked + 1;
    PyObject *port = porto != NULL ? porto : NULL;
    PyObject *zero = NULL;
    if (port == NULL) {
        zero = PyLong_FromLong(0);
        if (zero == NULL)
            return NULL;
        port = zero;
    }
    PyObject *res = NULL;
    if ((pw & ACKREQ_BIT) || u >= ack_coalesce || (flags & (F_ACK_NOW | F_RETX))) {
        PyObject *out = PyObject_GetAttr(ctx, s_out);
        if (out == NULL)
            goto done;
        int rc = do_sack(qp, nowo, now, out, psn, ev, ts, (flags & F_RETX) ? S_RETX : 0, port);
        Py_DECREF(out);
        if (rc)
            goto done;
        res = Py_NewRef(Py_None);
    } else {
        if (slot_set_ll(qp, o_unacked, u))
            goto done;
        PyObject *lr = PyTuple_New(6);
        if (lr == NULL)
            goto done;
        PyTuple_SET_ITEM(lr, 0, PyLong_FromUnsignedLong(psn));
        PyTuple_SET_ITEM(lr, 1, PyLong_FromUnsignedLong(ev));
        PyTuple_SET_ITEM(lr, 2, PyLong_FromUnsignedLongLong(ts));
        PyTuple_SET_ITEM(lr, 3, PyLong_FromLong(0));
        PyTuple_SET_ITEM(lr, 4, Py_NewRef(nowo));
        PyTuple_SET_ITEM(lr, 5, Py_NewRef(port));
        for (int i = 0; i < 4; i++)
            if (PyTuple_GET_ITEM(lr, i) == NULL) {
                Py_DECREF(lr);
                goto done;
            }
        slot_set(qp, o_last_rx, lr);
        if (ack_deadline == NEVER) {
            PyObject *attr = SLOT(qp, o_attr);
            PyObject *adn = attr ? PyObject_GetAttr(attr, s_ack_delay_ns) : NULL;
            if (adn == NULL)
                goto done;
            long long delay = AS_LL(adn);
            Py_DECREF(adn);
            if (delay == -1 && PyErr_Occurred())
                goto done;
            if (slot_set_ll(qp, o_ack_deadline, now + delay))
                goto done;
        }
        res = Py_NewRef(Py_None);
    }
done:
    Py_XDECREF(zero);
    return res;
}

/* ---------------------------------------------------------------------------------------- send */

/* ------------------------------------------------------------------------------ the send ring */

/* txring.TxRing, written in place (its module doc has the layout): the slots' memory and the ring's
 * counters, read when a send starts and the tail written back when it ends */
#define RING_SLOT 9216  /* txring.SLOT */
static PyTypeObject *ring_type = NULL;
static Py_ssize_t o_r_cap, o_r_data, o_r_lens, o_r_ports, o_r_evs, o_r_dst, o_r_head, o_r_tail;
static PyObject *s_reserve, *s_append;

typedef struct {
    PyObject *ring;
    long long cap, head, tail;
    unsigned char *data, *dst;
    int64_t *lens, *ports, *evs;
} ringw;

static inline int
ring_bytes(PyObject *ring, Py_ssize_t off, long long want, unsigned char **p)
{
    PyObject *b = SLOT(ring, off);
    if (b == NULL || !PyByteArray_CheckExact(b) || PyByteArray_GET_SIZE(b) != want) {
        PyErr_SetString(PyExc_TypeError, "TxRing's arrays do not match its capacity");
        return -1;
    }
    *p = (unsigned char *)PyByteArray_AS_STRING(b);
    return 0;
}

/* read `ring`'s counters and arrays into `w`: 0, or -1 with an exception (nothing changed) */
static int
ring_open(ringw *w, PyObject *ring)
{
    unsigned char *lens, *ports, *evs;
    w->ring = ring;
    if (slot_ll(ring, o_r_cap, &w->cap) || slot_ll(ring, o_r_head, &w->head) || slot_ll(ring, o_r_tail, &w->tail))
        return -1;
    if (w->cap < 1 || (w->cap & (w->cap - 1)) || w->cap > (PY_SSIZE_T_MAX / RING_SLOT) || w->head < 0
        || w->tail < w->head || w->tail - w->head > w->cap) {
        PyErr_SetString(PyExc_ValueError, "TxRing's counters are inconsistent");
        return -1;
    }
    if (ring_bytes(ring, o_r_data, w->cap * RING_SLOT, &w->data) || ring_bytes(ring, o_r_lens, 8 * w->cap, &lens)
        || ring_bytes(ring, o_r_ports, 8 * w->cap, &ports) || ring_bytes(ring, o_r_evs, 8 * w->cap, &evs)
        || ring_bytes(ring, o_r_dst, 16 * w->cap, &w->dst))
        return -1;
    w->lens = (int64_t *)lens;
    w->ports = (int64_t *)ports;
    w->evs = (int64_t *)evs;
    return 0;
}

/* write the tail back (the entries up to it are filled) */
static int
ring_close(ringw *w)
{
    return slot_set_ll(w->ring, o_r_tail, w->tail);
}

/* room for one more entry: 1, or 0 when the ring is full at its bound (`TxRing.reserve` grows it
 * below MAX_SLOTS, moving the live entries and so the arrays: read again); -1 with an exception */
static int
ring_room(ringw *w)
{
    if (w->tail - w->head < w->cap)
        return 1;
    if (ring_close(w) < 0)
        return -1;
    PyObject *r = PyObject_CallMethodNoArgs(w->ring, s_reserve);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    if (ring_open(w, w->ring) < 0)
        return -1;
    return w->tail - w->head < w->cap;
}

/* the entry in slot `rs` is complete: its fields, then the tail */
static inline void
ring_push(ringw *w, long long rs, Py_ssize_t len, Py_ssize_t port, long ev, const char *gid16)
{
    w->lens[rs] = (int64_t)len;
    w->ports[rs] = (int64_t)port;
    w->evs[rs] = (int64_t)ev;
    memcpy(w->dst + 16 * rs, gid16, 16);
    w->tail += 1;
}

static PyObject *py_send_new = NULL;  /* fastpath.send_new: every call this file does not take */


/* list[i] = v (steals v); IndexError outside the list (a call into Python may have resized it) */
static inline int
list_set(PyObject *l, Py_ssize_t i, PyObject *v)
{
    if (v == NULL)
        return -1;
    if (i < 0 || i >= PyList_GET_SIZE(l)) {
        Py_DECREF(v);
        PyErr_SetString(PyExc_IndexError, "a QP list changed size during a send");
        return -1;
    }
    PyObject *old = PyList_GET_ITEM(l, i);
    PyList_SET_ITEM(l, i, v);
    Py_DECREF(old);
    return 0;
}

static inline int
is_list(PyObject *o, Py_ssize_t len)
{
    return o != NULL && PyList_CheckExact(o) && (len < 0 || PyList_GET_SIZE(o) == len);
}

/* One of the QP's int64 slot arrays (`qpcore._i64`: array('q') of W items), read and written in place,
 * without an int object per slot. */
typedef struct {
    Py_buffer b;
    int64_t *p;
} i64arr;

/* 0, or -1 with no exception left where `o` is not W native int64s in one writable block (the caller
 * leaves the work to the Python code, or raises). Released by i64_close, also after a failed open. */
static int
i64_open(i64arr *a, PyObject *o, long long W)
{
    a->b.obj = NULL;
    a->p = NULL;
    if (o == NULL || !PyObject_CheckBuffer(o)
        || PyObject_GetBuffer(o, &a->b, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        a->b.obj = NULL;
        return -1;
    }
    const char *f = a->b.format;
    if (f != NULL && (*f == '@' || *f == '=' || *f == '<'))
        f++;
    if (a->b.itemsize != 8 || a->b.ndim != 1 || a->b.len != W * 8 || f == NULL
        || !(strcmp(f, "q") == 0 || strcmp(f, "l") == 0)) {
        PyBuffer_Release(&a->b);
        return -1;
    }
    a->p = (int64_t *)a->b.buf;
    return 0;
}

static void
i64_close(i64arr *a, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].b.obj != NULL)
            PyBuffer_Release(&a[i].b);
}

/* the five per-PSN arrays of a QP, in this order */
enum { A_LEN, A_EV, A_TIME, A_SERIAL, A_OFF, N_TXA };

static int
tx_arrays_open(i64arr a[N_TXA], PyObject *qp, long long W);

static PyObject *
attr(PyObject *o, const char *name)
{
    return PyObject_GetAttrString(o, name);
}

static int
tx_arrays_open(i64arr a[N_TXA], PyObject *qp, long long W)
{
    static const Py_ssize_t *const offs[N_TXA] = {&o_tx_len, &o_tx_ev, &o_tx_time, &o_tx_serial, &o_tx_off};
    int bad = 0;
    for (int i = 0; i < N_TXA; i++)
        bad |= i64_open(&a[i], SLOT(qp, *offs[i]), W);
    if (bad)
        i64_close(a, N_TXA);
    return bad ? -1 : 0;
}

#define PORT_ACC 64

/* port_bytes[i] += n */
static int
port_add(PyObject *port_bytes, Py_ssize_t i, long long n)
{
    if (i < 0 || i >= PyList_GET_SIZE(port_bytes)) {
        PyErr_SetString(PyExc_IndexError, "EV's port outside port_bytes");
        return -1;
    }
    PyObject *k = PyLong_FromLongLong(n);
    if (k == NULL)
        return -1;
    PyObject *v = PyNumber_Add(PyList_GET_ITEM(port_bytes, i), k);
    Py_DECREF(k);
    return list_set(port_bytes, i, v);
}

/* send_new(qp, wr, now, out) -> bool: `fastpath.send_new` (the same packets, state and counters). */
static PyObject *
c_send_new(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    if (!ready || nargs != 4)
        goto slow;
    PyObject *self = args[0], *wr = args[1], *nowo = args[2], *out = args[3];
    int to_ring = ring_type != NULL && Py_TYPE(out) == ring_type;
    if (Py_TYPE(self) != qp_type || Py_TYPE(wr) != wr_type || !PyLong_CheckExact(nowo)
        || !(to_ring || PyList_CheckExact(out)))
        goto slow;
    long long now = AS_LL(nowo);
    if (now == -1 && PyErr_Occurred())
        goto slow;
    long long W, mtu, psn, una, wlim, inflight, ack_floor, serial, length, sent, base, va0, rkey, msn,
        ts_off, since, div, peer_qpn, rto_deadline, tx_bytes0, max_out;
    if (slot_ll(self, o_W, &W) || slot_ll(self, o_mtu, &mtu) || slot_ll(self, o_snd_nxt, &psn)
        || slot_ll(self, o_snd_una, &una) || slot_ll(self, o_wlim, &wlim) || slot_ll(self, o_inflight, &inflight)
        || slot_ll(self, o_ack_floor, &ack_floor) || slot_ll(self, o_serial, &serial)
        || slot_ll(self, o_ts_off, &ts_off) || slot_ll(self, o_ackreq_since, &since)
        || slot_ll(self, o_ackreq_div, &div) || slot_ll(self, o_peer_qpn, &peer_qpn)
        || slot_ll(self, o_rto_deadline, &rto_deadline) || slot_ll(self, o_tx_bytes, &tx_bytes0)
        || slot_ll(self, o_max_outstanding, &max_out)
        || slot_ll(wr, o_wr_length, &length) || slot_ll(wr, o_wr_sent, &sent) || slot_ll(wr, o_wr_offset, &base)
        || slot_ll(wr, o_wr_remote_addr, &va0) || slot_ll(wr, o_wr_rkey, &rkey) || slot_ll(wr, o_wr_msn, &msn))
        goto slow;
    /* what struct.pack would refuse, and a payload outside the buffer (a shorter slice in Python):
     * the Python path, which fails or behaves as it always did */
    if (W <= 0 || mtu <= 0 || mtu > MAX_PAYLOAD || length < 0 || length > 0xFFFFFFFFLL || sent < 0
        || sent > length || base < 0 || va0 < 0 || va0 > INT64_MAX - length || rkey < 0 || rkey > 0xFFFFFFFFLL
        || msn < 0 || msn > 0xFFFFFFFFLL || now + ts_off < 0 || div < 0)
        goto slow;
    PyObject *imm = SLOT(wr, o_wr_imm);
    if (imm == NULL || (imm != Py_None && !PyLong_CheckExact(imm)))
        goto slow;
    uint32_t immv = 0;
    if (imm != Py_None) {
        immv = (uint32_t)(PyLong_AsUnsignedLongLongMask(imm) & 0xFFFFFFFFu);
        if (PyErr_Occurred())
            goto slow;
    }
    PyObject *tx_state = SLOT(self, o_tx_state), *tx_wr = SLOT(self, o_tx_wr), *tx_retx = SLOT(self, o_tx_retx);
    if (!is_list(tx_state, W) || !is_list(tx_wr, W) || !is_list(tx_retx, W))
        goto slow;
    PyObject *c = SLOT(self, o_c), *gid = SLOT(self, o_peer_gid), *icrc = SLOT(self, o_tx_icrc),
             *paths = SLOT(self, o_paths), *cc = SLOT(self, o_cc), *mr = SLOT(wr, o_wr_mr);
    if (c == NULL || !PyDict_CheckExact(c) || gid == NULL || icrc == NULL || paths == NULL || cc == NULL
        || mr == NULL || Py_TYPE(mr) != mr_type)
        goto slow;
    ringw rw;
    /* into a ring: its destination field holds 16 bytes (another GID: the Python path, whose append pads) */
    if (to_ring && (!PyBytes_CheckExact(gid) || PyBytes_GET_SIZE(gid) != 16 || ring_open(&rw, out) < 0))
        goto slow;
    PyObject *cwndo = PyObject_GetAttr(cc, s_cwnd);
    if (cwndo == NULL)
        goto slow;
    long long cwnd = PyLong_CheckExact(cwndo) ? AS_LL(cwndo) : -1;
    Py_DECREF(cwndo);
    if (cwnd < 0) {
        PyErr_Clear();
        goto slow;
    }
    PyObject *ev_port = attr(paths, "ev_port"), *port_bytes = attr(paths, "port_bytes"), *seq = attr(paths, "seq"),
             *seq_poso = attr(paths, "seq_pos");
    Py_buffer vb;
    vb.obj = NULL;
    /* the per-PSN arrays, held open for the whole call: the loop calls into Python (`paths.next_ev`,
     * `rto_interval`), and an array with an open buffer cannot be resized under us */
    i64arr ta[N_TXA];
    memset(ta, 0, sizeof(ta));
    PyObject *view = SLOT(mr, o_mr_view);
    if (!is_list(ev_port, -1) || !is_list(port_bytes, -1) || !is_list(seq, -1) || seq_poso == NULL
        || !PyLong_CheckExact(seq_poso) || view == NULL || tx_arrays_open(ta, self, W) < 0
        || PyObject_GetBuffer(view, &vb, PyBUF_SIMPLE) < 0 || base + length > (long long)vb.len) {
        if (vb.obj != NULL)
            PyBuffer_Release(&vb);
        i64_close(ta, N_TXA);
        Py_XDECREF(ev_port); Py_XDECREF(port_bytes); Py_XDECREF(seq); Py_XDECREF(seq_poso);
        goto slow;
    }
    Py_ssize_t seq_len = PyList_GET_SIZE(seq), seq_pos = seq_len ? PyLong_AsSsize_t(seq_poso) : 0;
    Py_DECREF(seq_poso);
    if (seq_len && (seq_pos < 0 || seq_pos >= seq_len)) {  /* (also a failed conversion: -1) */
        PyBuffer_Release(&vb);
        i64_close(ta, N_TXA);
        Py_DECREF(ev_port); Py_DECREF(port_bytes); Py_DECREF(seq);
        goto slow;
    }
    int64_t *t_len = ta[A_LEN].p, *t_ev = ta[A_EV].p, *t_time = ta[A_TIME].p, *t_serial = ta[A_SERIAL].p,
            *t_off = ta[A_OFF].p;
    /* bytes sent per port, added to paths.port_bytes once, at the end of the call (PORT_ACC ports;
     * a port past them is added to as it goes) */
    long long pacc[PORT_ACC];
    memset(pacc, 0, sizeof(pacc));
    /* The loop calls into Python (`paths.next_ev`, `rto_interval`), which could rebind the QP's slots:
     * the objects read from them are held for the whole call. */
    PyObject *held[] = {tx_state, tx_wr, tx_retx, c, gid, icrc, paths, cc, mr, imm};
    const size_t nheld = sizeof(held) / sizeof(held[0]);
    for (size_t i = 0; i < nheld; i++)
        Py_INCREF(held[i]);
    /* ---- from here on, state changes: errors are raised, as the Python path would raise them */
    const unsigned char *src = (const unsigned char *)vb.buf;
    long long limit = una + wlim, inflight0 = inflight;
    uint64_t stamp = (uint64_t)(now + ts_off);
    long long every = div ? cwnd / div : 0;
    if (ack_floor && every >= ack_floor)
        every = 0;
    uint32_t dqpn = (uint32_t)(peer_qpn & QPN_MASK);
    PyObject *res = NULL;
    int ok = 1;
    if (sent == 0 && slot_set_ll(wr, o_wr_first_psn, psn))
        goto done;
    for (;;) {
        if (psn >= limit) {
            if (count(c, s_window_limited))
                goto done;
            ok = 0;
            break;
        }
        if (to_ring) {  /* a ring full at its bound: the rest waits for the next call, nothing lost */
            int room = ring_room(&rw);
            if (room < 0)
                goto done;
            if (room == 0) {
                ok = 0;
                break;
            }
        }
        long long n = length - sent;
        if (n > mtu)
            n = mtu;
        if (inflight && inflight + n > cwnd) {
            if (count(c, s_cwnd_limited))
                goto done;
            ok = 0;
            break;
        }
        long ev;
        if (seq_len) {
            PyObject *e = PyList_GET_ITEM(seq, seq_pos);
            ev = PyLong_AsLong(e);
            if (ev == -1 && PyErr_Occurred())
                goto done;
            if (++seq_pos == seq_len)
                seq_pos = 0;
        } else {
            PyObject *e = PyObject_CallMethodNoArgs(paths, s_next_ev);
            if (e == NULL)
                goto done;
            ev = PyLong_AsLong(e);
            Py_DECREF(e);
            if (ev == -1 && PyErr_Occurred())
                goto done;
            if (ev < 0) {
                if (rto_deadline == NEVER) {
                    PyObject *ri = PyObject_CallMethodNoArgs(self, s_rto_interval);
                    if (ri == NULL)
                        goto done;
                    long long r = AS_LL(ri);
                    Py_DECREF(ri);
                    if (r == -1 && PyErr_Occurred())
                        goto done;
                    rto_deadline = now + r;
                    if (slot_set_ll(self, o_rto_deadline, rto_deadline))
                        goto done;
                }
                ok = 0;
                break;
            }
        }
        if (ev < 0 || ev > 0xFFFF || ev >= PyList_GET_SIZE(ev_port)) {
            PyErr_Format(PyExc_ValueError, "EV %ld outside the QP's profile", ev);
            goto done;
        }
        long long off = sent;
        sent = off + n;
        int last = sent == length;
        uint32_t flags = off == 0 ? F_FIRST : 0;
        int areq = last || inflight + n < ack_floor;
        if (every) {
            since += n;
            if (areq || since >= every) {
                areq = 1;
                since = 0;
            }
        }
        uint32_t pad = (uint32_t)(-n & 3);
        uint32_t w0 = (areq ? ACKREQ_BIT : 0) | (uint32_t)(psn & PSN_MASK);
        if (last)
            flags |= F_LAST;
        int with_imm = last && imm != Py_None;
        Py_ssize_t hl = with_imm ? WRITE_IMM_HDR_LEN : WRITE_HDR_LEN;
        Py_ssize_t end = hl + (Py_ssize_t)n + pad;
        PyObject *buf = NULL;
        unsigned char *b;
        long long rs = 0;
        if (to_ring) {  /* in its slot (end + ICRC_LEN < RING_SLOT; room made above) */
            rs = rw.tail & (rw.cap - 1);
            b = rw.data + rs * RING_SLOT;
        } else {
            if ((buf = PyByteArray_FromStringAndSize(NULL, end + ICRC_LEN)) == NULL)
                goto done;
            b = (unsigned char *)PyByteArray_AS_STRING(buf);
        }
        b[0] = with_imm ? OP_WRITE_IMM : OP_WRITE;
        b[1] = (unsigned char)(pad << 4);
        put16(b + 2, DEFAULT_PKEY);
        put32(b + 4, dqpn);
        put32(b + 8, w0);
        put64(b + 12, (uint64_t)(va0 + off));
        put32(b + 20, (uint32_t)rkey);
        put32(b + 24, (uint32_t)n);
        unsigned char *x = b + 28;
        if (with_imm) {
            put32(x, immv);
            x += 4;
        }
        x[0] = MXH_VERSION;
        x[1] = (unsigned char)flags;
        put16(x + 2, (uint32_t)ev);
        put32(x + 4, (uint32_t)msn);
        put32(x + 8, (uint32_t)length);
        put32(x + 12, (uint32_t)off);
        put64(x + 16, stamp);
        memcpy(b + hl, src + base + off, (size_t)n);
        memset(b + hl + n, 0, pad + ICRC_LEN);
        if (icrc_seal(icrc, b, end, EV_SPORT_BASE | (ev & EV_INDEX_MAX))) {
            Py_XDECREF(buf);
            goto done;
        }
        /* ---- bookkeeping (as _send_new) */
        Py_ssize_t slot = (Py_ssize_t)(((psn % W) + W) % W);
        serial += 1;
        PyObject *port = PyList_GET_ITEM(ev_port, ev);
        Py_ssize_t pi = PyLong_AsSsize_t(port);
        if ((pi == -1 && PyErr_Occurred()) || pi < 0 || pi >= PyList_GET_SIZE(port_bytes)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_IndexError, "EV's port outside port_bytes");
            Py_XDECREF(buf);
            goto done;
        }
        if (list_set(tx_wr, slot, Py_NewRef(wr)) || list_set(tx_state, slot, PyLong_FromLong(TX_INFLIGHT))
            || list_set(tx_retx, slot, Py_NewRef(Py_False))
            || (pi >= PORT_ACC && port_add(port_bytes, pi, n))) {
            Py_XDECREF(buf);
            goto done;
        }
        t_off[slot] = off;
        t_len[slot] = n;
        t_ev[slot] = ev;
        t_time[slot] = now;
        t_serial[slot] = serial;
        if (pi < PORT_ACC)
            pacc[pi] += n;
        inflight += n;
        if (to_ring) {
            ring_push(&rw, rs, end + ICRC_LEN, pi, ev, PyBytes_AS_STRING(gid));
            goto pushed;
        }
        PyObject *dg = dg_type->tp_alloc(dg_type, 4);
        if (dg == NULL) {
            Py_XDECREF(buf);
            goto done;
        }
        PyTuple_SET_ITEM(dg, 0, buf);
        PyTuple_SET_ITEM(dg, 1, Py_NewRef(port));
        PyTuple_SET_ITEM(dg, 2, PyLong_FromLong(ev));
        PyTuple_SET_ITEM(dg, 3, Py_NewRef(gid));
        if (PyTuple_GET_ITEM(dg, 2) == NULL || PyList_Append(out, dg)) {
            Py_DECREF(dg);
            goto done;
        }
        Py_DECREF(dg);
    pushed:
        psn += 1;
        if (last) {
            if (slot_set_ll(wr, o_wr_last_psn, psn - 1) || slot_set(self, o_cur, Py_NewRef(Py_None)))
                goto done;
            break;
        }
    }
    if (seq_len) {
        PyObject *sp = PyLong_FromSsize_t(seq_pos);
        if (sp == NULL || PyObject_SetAttrString(paths, "seq_pos", sp)) {
            Py_XDECREF(sp);
            goto done;
        }
        Py_DECREF(sp);
    }
    if (slot_set_ll(self, o_ackreq_since, since) || slot_set_ll(wr, o_wr_sent, sent)
        || slot_set_ll(self, o_snd_nxt, psn) || slot_set_ll(self, o_serial, serial)
        || slot_set_ll(self, o_tx_bytes, tx_bytes0 + (inflight - inflight0))
        || slot_set_ll(self, o_inflight, inflight))
        goto done;
    if (psn - una > max_out && slot_set_ll(self, o_max_outstanding, psn - una))
        goto done;
    if (slot_ll(self, o_rto_deadline, &rto_deadline))
        goto done;
    if (rto_deadline == NEVER && psn != una) {
        PyObject *ri = PyObject_CallMethodNoArgs(self, s_rto_interval);
        if (ri == NULL)
            goto done;
        long long r = AS_LL(ri);
        Py_DECREF(ri);
        if ((r == -1 && PyErr_Occurred()) || slot_set_ll(self, o_rto_deadline, now + r))
            goto done;
    }
    res = Py_NewRef(ok ? Py_True : Py_False);
done:
    /* what was written is sent and counted, also when an error ends the loop (its state changed) */
    {
        PyObject *et, *ev_, *tb;
        PyErr_Fetch(&et, &ev_, &tb);
        int bad = to_ring && ring_close(&rw) < 0;
        for (Py_ssize_t i = 0; i < PORT_ACC; i++)
            if (pacc[i] && port_add(port_bytes, i, pacc[i]))
                bad = 1;
        if (bad) {
            Py_CLEAR(res);
            Py_XDECREF(et); Py_XDECREF(ev_); Py_XDECREF(tb);
        } else
            PyErr_Restore(et, ev_, tb);
    }
    PyBuffer_Release(&vb);
    i64_close(ta, N_TXA);
    Py_DECREF(ev_port);
    Py_DECREF(port_bytes);
    Py_DECREF(seq);
    for (size_t i = 0; i < nheld; i++)
        Py_DECREF(held[i]);
    return res;
slow:
    PyErr_Clear();
    if (py_send_new == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastc.send_new before _fastc.setup");
        return NULL;
    }
    return PyObject_Vectorcall(py_send_new, args, nargs, NULL);
}

/* ------------------------------------------------------------------------------ driver calls */

static PyObject *s_active, *s_send, *s_paths, *s_next_probe_deadline, *s_receive, *s_handle_timer,
    *s_datagrams_to_send, *s_next_deadline_m, *s_now, *s_last_t, *s_seq;
static Py_ssize_t o_parked, o_retx_q, o_send_q, o_oow_q, o_aux_deadline, o_loss_deadline, o_fast;

static PyObject *
negative_time(long long now)
{
    PyErr_Format(PyExc_ValueError,
                 "time %lld ns is negative: the engine's clock is nanoseconds since any origin at or before "
                 "the driver's start (docs/transport.md, 'Time')", now);
    return NULL;
}

static inline int
truthy(PyObject *o)
{
    return o == NULL ? 0 : PyObject_IsTrue(o);
}

/* `Requester.send(now, out)` for the common call of a busy QP (RTS, nothing to resend or release, a
 * message under way, `qp.fast` this module's send_new): the full-window check, then send_new on the
 * current message. When that message is done, `send` itself goes on (it takes the next from send_q).
 * Anything else: `send`. 0, or -1 with an exception. */
static int
send_common(PyObject *qp, PyObject *nowo, PyObject *out)
{
    PyObject *wr = SLOT(qp, o_cur), *cc = SLOT(qp, o_cc), *fast = SLOT(qp, o_fast);
    long long sent, length, inflight, nxt, una, wlim, mtu, rto;
    if (wr == NULL || Py_TYPE(wr) != wr_type || fast != send_new_fn || cc == NULL || truthy(SLOT(qp, o_retx_q))
        || truthy(SLOT(qp, o_oow_q)) || slot_ll(wr, o_wr_sent, &sent) || slot_ll(wr, o_wr_length, &length)
        || slot_ll(qp, o_inflight, &inflight) || slot_ll(qp, o_snd_nxt, &nxt) || slot_ll(qp, o_snd_una, &una)
        || slot_ll(qp, o_wlim, &wlim) || slot_ll(qp, o_mtu, &mtu) || slot_ll(qp, o_rto_deadline, &rto))
        goto python;
    /* held: reading the window (`cc.cwnd`) and the timer call run Python, which could rebind the slots */
    Py_INCREF(wr);
    Py_INCREF(cc);
    int rc = -1, done = 0;
    if (sent && inflight && nxt < una + wlim) {
        long long n = length - sent;
        if (n > mtu)
            n = mtu;
        PyObject *cwndo = PyObject_GetAttr(cc, s_cwnd);
        PyObject *need = cwndo == NULL ? NULL : PyLong_FromLongLong(inflight + n);
        int full = need == NULL ? -1 : PyObject_RichCompareBool(need, cwndo, Py_GT);
        Py_XDECREF(need);
        Py_XDECREF(cwndo);
        if (full < 0)
            goto out;
        if (full) {  /* as send: counted, the ACK timer armed, parked */
            PyObject *c = SLOT(qp, o_c);
            if (c == NULL || !PyDict_CheckExact(c) || count(c, s_cwnd_limited))
                goto out;
            if (rto == NEVER && nxt != una) {
                PyObject *ri = PyObject_CallMethodNoArgs(qp, s_rto_interval);
                PyObject *dl = ri == NULL ? NULL : PyNumber_Add(nowo, ri);
                Py_XDECREF(ri);
                if (slot_set(qp, o_rto_deadline, dl))
                    goto out;
            }
            rc = slot_set(qp, o_parked, Py_NewRef(Py_True));
            goto out;
        }
    }
    slot_set(qp, o_parked, Py_NewRef(Py_False));
    PyObject *sa[4] = {qp, wr, nowo, out};
    PyObject *r = c_send_new(NULL, sa, 4);
    if (r != NULL) {
        done = PyObject_IsTrue(r);
        rc = done < 0 ? -1 : 0;
        Py_DECREF(r);
    }
out:
    Py_DECREF(wr);
    Py_DECREF(cc);
    if (rc < 0 || !done)
        return rc;
python:  /* (also when the message is done: `send` takes the next one) */
    if (PyErr_Occurred())
        PyErr_Clear();
    PyObject *x = PyObject_CallMethodObjArgs(qp, s_send, nowo, out, NULL);
    Py_XDECREF(x);
    return x == NULL ? -1 : 0;
}

/* ctx._out a new, empty list: 0, or -1 with an exception */
static int
fresh_out(PyObject *ctx)
{
    PyObject *fresh = PyList_New(0);
    int r = fresh == NULL ? -1 : PyObject_SetAttr(ctx, s_out, fresh);
    Py_XDECREF(fresh);
    return r;
}

/* the control packets `receive` and `handle_timer` left in ctx._out, appended to `ring` in order, and
 * ctx._out a new list: the ring then, or NULL with an exception */
static PyObject *
ring_take_out(PyObject *ctx, PyObject *ring)
{
    PyObject *out = PyObject_GetAttr(ctx, s_out);
    if (out == NULL)
        return NULL;
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "Context._out must be a list");
        Py_DECREF(out);
        return NULL;
    }
    if (fresh_out(ctx) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(out); i++) {
        PyObject *r = PyObject_CallMethodOneArg(ring, s_append, PyList_GET_ITEM(out, i));
        if (r == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_DECREF(out);
    return Py_NewRef(ring);
}

/* datagrams_to_send(ctx, now): `Context.datagrams_to_send`; datagrams_to_send(ctx, now, ring):
 * `Context.datagrams_into`, which returns how many entries the ring gained */
static PyObject *
c_datagrams_to_send(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && !(nargs == 3 && ring_type != NULL && Py_TYPE(args[2]) == ring_type)) {
        PyErr_SetString(PyExc_TypeError, "datagrams_to_send(ctx, now) or datagrams_to_send(ctx, now, TxRing)");
        return NULL;
    }
    PyObject *ctx = args[0], *nowo = args[1], *ring = nargs == 3 ? args[2] : NULL;
    long long now = AS_LL(nowo);
    if (now == -1 && PyErr_Occurred())
        return NULL;
    if (now < 0)
        return negative_time(now);
    long long tail0 = 0;
    if (ring != NULL && slot_ll(ring, o_r_tail, &tail0))
        return NULL;
    PyObject *out = ring != NULL ? ring_take_out(ctx, ring) : PyObject_GetAttr(ctx, s_out);
    PyObject *active = out ? PyObject_GetAttr(ctx, s_active) : NULL;
    if (active == NULL || !PyList_Check(active)) {
        if (active != NULL)
            PyErr_SetString(PyExc_TypeError, "Context._active must be a list");
        Py_XDECREF(out);
        Py_XDECREF(active);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(active); i++)
        if (Py_TYPE(PyList_GET_ITEM(active, i)) != qp_type) {
            PyErr_SetString(PyExc_TypeError, "Context._active holds an object that is not a QueuePair");
            Py_DECREF(active);
            Py_DECREF(out);
            return NULL;
        }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(active); i++) {
        PyObject *qp = Py_NewRef(PyList_GET_ITEM(active, i));
        int r = 0;
        if (Py_TYPE(qp) != qp_type) {  /* checked below for all before any is sent */
            r = -1;
            PyErr_SetString(PyExc_TypeError, "Context._active holds an object that is not a QueuePair");
        } else {
            PyObject *parked = SLOT(qp, o_parked);
            r = parked == NULL ? -1 : PyObject_IsTrue(parked);
            if (r > 0) {
                PyObject *c = SLOT(qp, o_c);
                r = c && PyDict_Check(c) ? count(c, s_cwnd_limited) : -1;
            } else if (r == 0) {
                PyObject *state = SLOT(qp, o_state);
                int rts = state == st_rts ? 1 : (state ? PyObject_RichCompareBool(state, st_rts, Py_EQ) : -1);
                r = rts;
                if (rts > 0) {
                    PyObject *cur = SLOT(qp, o_cur);
                    int want = truthy(SLOT(qp, o_retx_q));
                    if (want == 0)
                        want = cur != NULL && cur != Py_None;
                    if (want == 0)
                        want = truthy(SLOT(qp, o_send_q));
                    if (want == 0)
                        want = truthy(SLOT(qp, o_oow_q));
                    r = want;
                    if (want > 0)
                        r = send_common(qp, nowo, out);
                }
            }
        }
        Py_DECREF(qp);
        if (r < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a QP slot is unset");
            Py_DECREF(active);
            Py_DECREF(out);
            return NULL;
        }
    }
    Py_DECREF(active);
    if (ring != NULL) {
        Py_DECREF(out);
        long long tail;
        if (slot_ll(ring, o_r_tail, &tail))
            return NULL;
        return PyLong_FromLongLong(tail - tail0);
    }
    if (fresh_out(ctx) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* the earliest armed timer of ctx's active QPs, NEVER when none; -1 on error */
static long long
next_deadline(PyObject *ctx)
{
    PyObject *active = PyObject_GetAttr(ctx, s_active);
    if (active == NULL)
        return -1;
    if (!PyList_Check(active)) {
        PyErr_SetString(PyExc_TypeError, "Context._active must be a list");
        Py_DECREF(active);
        return -1;
    }
    long long d = NEVER, t;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(active); i++) {
        PyObject *qp = PyList_GET_ITEM(active, i);
        if (Py_TYPE(qp) != qp_type) {
            PyErr_SetString(PyExc_TypeError, "Context._active holds a foreign object");
            goto fail;
        }
        if (slot_ll(qp, o_ack_deadline, &t))
            goto fail;
        if (t < d)
            d = t;
        if (slot_ll(qp, o_aux_deadline, &t))
            goto fail;
        if (t < d)
            d = t;
        if (SLOT(qp, o_state) != st_rts)  /* the requester's timers wait for RTS (QueuePair.deadline) */
            continue;
        if (slot_ll(qp, o_rto_deadline, &t))
            goto fail;
        if (t < d)
            d = t;
        if (slot_ll(qp, o_loss_deadline, &t))
            goto fail;
        if (t < d)
            d = t;
        PyObject *paths = SLOT(qp, o_paths);
        PyObject *x = paths ? PyObject_GetAttr(paths, s_next_probe_deadline) : NULL;
        if (x == NULL)
            goto fail;
        t = AS_LL(x);
        Py_DECREF(x);
        if (t == -1 && PyErr_Occurred())
            goto fail;
        if (t < d)
            d = t;
    }
    Py_DECREF(active);
    return d;
fail:
    Py_DECREF(active);
    return -1;
}

/* next_deadline(ctx): `Context.next_deadline` */
static PyObject *
c_next_deadline(PyObject *Py_UNUSED(mod), PyObject *ctx)
{
    long long d = next_deadline(ctx);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    if (d >= NEVER)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(d);
}

/* ------------------------------------------------------------------------------ SACK bits */

#define TX_LOST 2
#define TX_ACKED 3

/* ack_bits(qp, newly, una, inflight, acked, las, rack_ser, ev_port) -> (newly, inflight, acked, las):
 * `Requester.on_sack`'s loop over the newly acknowledged PSNs (bit i <=> PSN una + i), lowest first, for
 * every bit whose slot is not LOST; it stops at the first LOST one and returns the bits from there on
 * (0 when done), which the Python loop takes (it calls the recovery code for that PSN) before calling
 * this again. The same slot updates and sums, in the same order. */
static PyObject *
c_ack_bits(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "ack_bits takes 8 arguments");
        return NULL;
    }
    PyObject *qp = args[0], *newly = args[1], *rack = args[6], *ev_port = args[7];
    long long una = AS_LL(args[2]), inflight = AS_LL(args[3]),
              acked = AS_LL(args[4]), las = AS_LL(args[5]), W;
    if (PyErr_Occurred())
        return NULL;
    if (Py_TYPE(qp) != qp_type || !PyLong_CheckExact(newly) || slot_ll(qp, o_W, &W) || W <= 0
        || (rack != Py_None && !PyList_Check(rack)) || !PyList_Check(ev_port)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "ack_bits: unexpected argument");
        return NULL;
    }
    PyObject *tx_state = Py_XNewRef(SLOT(qp, o_tx_state));
    i64arr ta[N_TXA];
    if (!is_list(tx_state, W) || tx_arrays_open(ta, qp, W) < 0) {
        Py_XDECREF(tx_state);
        PyErr_SetString(PyExc_TypeError, "ack_bits: the QP's slot arrays");
        return NULL;
    }
    const int64_t *t_len = ta[A_LEN].p, *t_serial = ta[A_SERIAL].p, *t_ev = ta[A_EV].p;
    PyObject *left = NULL, *raw = NULL;
    PyObject *bl = PyObject_CallMethod(newly, "bit_length", NULL);
    if (bl == NULL)
        goto fail;
    Py_ssize_t nbits = PyLong_AsSsize_t(bl);
    Py_DECREF(bl);
    if (nbits < 0)
        goto fail;
    Py_ssize_t nbytes = (nbits + 7) / 8;
    raw = PyObject_CallMethod(newly, "to_bytes", "ns", nbytes ? nbytes : 1, "little");
    if (raw == NULL)
        goto fail;
    const unsigned char *bits = (const unsigned char *)PyBytes_AS_STRING(raw);
    for (Py_ssize_t i = 0; i < nbits; i++) {
        if (!(bits[i >> 3] & (1u << (i & 7))))
            continue;
        Py_ssize_t slot = (Py_ssize_t)(((una + i) % W + W) % W);
        long st = PyLong_AsLong(PyList_GET_ITEM(tx_state, slot));
        long long n = t_len[slot], ser = t_serial[slot];
        if (PyErr_Occurred())
            goto fail;
        if (st == TX_LOST) {  /* the Python loop's case: the bits from here on */
            PyObject *k = PyLong_FromSsize_t(i);
            PyObject *hi = k ? PyNumber_Rshift(newly, k) : NULL;
            left = hi ? PyNumber_Lshift(hi, k) : NULL;
            Py_XDECREF(k);
            Py_XDECREF(hi);
            if (left == NULL)
                goto fail;
            break;
        }
        if (st == TX_INFLIGHT)
            inflight -= n;
        if (list_set(tx_state, slot, PyLong_FromLong(TX_ACKED)))
            goto fail;
        acked += n;
        if (ser > las)
            las = ser;
        if (rack != Py_None) {
            long long e = t_ev[slot];
            if (e < 0 || e >= PyList_GET_SIZE(ev_port)) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_IndexError, "ack_bits: EV outside ev_port");
                goto fail;
            }
            long port = PyLong_AsLong(PyList_GET_ITEM(ev_port, e));
            if (port < 0 || port >= PyList_GET_SIZE(rack)) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_IndexError, "ack_bits: port outside rack_ser");
                goto fail;
            }
            long long rs = AS_LL(PyList_GET_ITEM(rack, port));
            if (PyErr_Occurred())
                goto fail;
            if (ser > rs && list_set(rack, port, PyLong_FromLongLong(ser)))
                goto fail;
        }
    }
    Py_DECREF(raw);
    i64_close(ta, N_TXA);
    Py_DECREF(tx_state);
    if (left == NULL)
        left = PyLong_FromLong(0);
    if (left == NULL)
        return NULL;
    PyObject *res = Py_BuildValue("(NLLL)", left, inflight, acked, las);
    return res;
fail:
    Py_XDECREF(raw);
    Py_XDECREF(left);
    i64_close(ta, N_TXA);
    Py_DECREF(tx_state);
    return NULL;
}

/* -------------------------------------------------------------------- loss detection, RTT samples */

static Py_ssize_t o_min_rtt, o_srtt, o_rttvar, o_port_srtt, o_port_rttvar, o_port_thr, o_reo_extra,
    o_rack_calm, o_rack_reo, o_rack_rtt, o_port_min_rtt, o_rack_thr, o_rack_ser;
static PyObject *s_pen;  /* (s_ev_port: above) */

/* list[i] as a C integer: 0, or -1 (no exception left) when i is outside the list or the item is not an
 * int of 64 bits -- the caller then leaves the work to the Python code, which has changed nothing yet */
static inline int
lget(PyObject *l, long long i, long long *v)
{
    if (i < 0 || i >= PyList_GET_SIZE(l))
        return -1;
    PyObject *x = PyList_GET_ITEM(l, i);
    if (!PyLong_CheckExact(x))
        return -1;
    *v = AS_LL(x);
    if (*v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static inline int
lset(PyObject *l, long long i, long long v)
{
    return list_set(l, (Py_ssize_t)i, PyLong_FromLongLong(v));
}

/* loss_scan(qp, p, las, stop, ahead, deadline, now) -> (p, stop, ahead, deadline, code): the walk of
 * `Recovery._detect_losses` over first transmissions from PSN p (holes not yet due passed over, the
 * loss timer's deadline lowered), as far as the first transmission it declares lost (code 1, or 2 when
 * by the same-port rule: p is its PSN; the caller declares it and calls again from p + 1) or the end of
 * the walk (code 0: p is where it stopped). It changes nothing. Code -1: state it does not read (an item
 * that is not a 64-bit int, an index outside a list): the Python loop goes on from p. */
static PyObject *
c_loss_scan(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || Py_TYPE(args[0]) != qp_type) {
        PyErr_SetString(PyExc_TypeError, "loss_scan(qp, p, las, stop, ahead, deadline, now)");
        return NULL;
    }
    PyObject *qp = args[0];
    long long p = AS_LL(args[1]), las = AS_LL(args[2]), stop = AS_LL(args[3]), ahead = AS_LL(args[4]),
              deadline = AS_LL(args[5]), now = AS_LL(args[6]), W, nxt;
    if (PyErr_Occurred())
        return NULL;
    int code = 0;
    PyObject *tx_state = SLOT(qp, o_tx_state), *tx_retx = SLOT(qp, o_tx_retx), *port_thr = SLOT(qp, o_port_thr),
             *rack_ser = SLOT(qp, o_rack_ser), *rack_thr = SLOT(qp, o_rack_thr), *paths = SLOT(qp, o_paths);
    PyObject *ev_port = NULL, *pen = NULL;
    i64arr ta[N_TXA];
    memset(ta, 0, sizeof(ta));
    if (slot_ll(qp, o_W, &W) || slot_ll(qp, o_snd_nxt, &nxt) || W <= 0 || !is_list(tx_state, W)
        || !is_list(tx_retx, W) || !is_list(port_thr, -1) || !is_list(rack_ser, -1) || !is_list(rack_thr, -1)
        || paths == NULL || (ev_port = PyObject_GetAttr(paths, s_ev_port)) == NULL
        || (pen = PyObject_GetAttr(paths, s_pen)) == NULL || !is_list(ev_port, -1) || !is_list(pen, -1)
        || tx_arrays_open(ta, qp, W) < 0) {
        PyErr_Clear();
        code = -1;
        goto out;
    }
    const int64_t *t_serial = ta[A_SERIAL].p, *t_ev = ta[A_EV].p, *t_time = ta[A_TIME].p;
    while (p < nxt) {
        long long slot = ((p % W) + W) % W, st, ser, e, port, thr, rs, rt, sent, pe;
        if (lget(tx_state, slot, &st)) {
            code = -1;
            break;
        }
        int retx = PyObject_IsTrue(PyList_GET_ITEM(tx_retx, slot));
        if (retx < 0) {
            PyErr_Clear();
            code = -1;
            break;
        }
        if (st != TX_INFLIGHT || retx) {  /* acknowledged, already lost, or watched by the retransmission queue */
            p++;
            continue;
        }
        ser = t_serial[slot];
        if (ser > las)
            break;
        e = t_ev[slot];
        sent = t_time[slot];
        if (lget(ev_port, e, &port) || lget(port_thr, port, &thr) || lget(rack_ser, port, &rs)
            || lget(rack_thr, port, &rt) || lget(pen, e, &pe)) {
            code = -1;
            break;
        }
        int rack = ser < rs && rt < thr && !pe;
        if (rack)
            thr = rt;
        long long t;
        if (__builtin_add_overflow(sent, thr, &t)) {
            code = -1;
            break;
        }
        if (t > now || (stop >= 0 && !rack)) {
            if (now < t && t < deadline)
                deadline = t;
            if (stop < 0)
                stop = p;
            if (ahead == 0)
                break;
            ahead--;
            p++;
            continue;
        }
        code = rack ? 2 : 1;
        break;
    }
out:
    i64_close(ta, N_TXA);
    Py_XDECREF(ev_port);
    Py_XDECREF(pen);
    return Py_BuildValue("(LLLLi)", p, stop, ahead, deadline, code);
}

/* rtt_sample(qp, rtt, port, rack) -> bool: `Recovery._rtt_sample(rtt, port)` and, when `rack`,
 * `_rack_sample(rtt, port)`, the same state. False, with nothing changed, where it does not read the
 * state (see lget): the caller then calls those methods. */
static PyObject *
c_rtt_sample(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || Py_TYPE(args[0]) != qp_type) {
        PyErr_SetString(PyExc_TypeError, "rtt_sample(qp, rtt, port, rack)");
        return NULL;
    }
    PyObject *qp = args[0];
    long long rtt = AS_LL(args[1]), port = AS_LL(args[2]);
    int rack = PyObject_IsTrue(args[3]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *port_srtt = SLOT(qp, o_port_srtt), *port_rttvar = SLOT(qp, o_port_rttvar),
             *port_thr = SLOT(qp, o_port_thr), *rack_calm = SLOT(qp, o_rack_calm), *rack_reo = SLOT(qp, o_rack_reo),
             *rack_rtt = SLOT(qp, o_rack_rtt), *pmin = SLOT(qp, o_port_min_rtt), *rack_thr = SLOT(qp, o_rack_thr);
    long long min_rtt, srtt, rttvar, reo_extra, psrtt = 0, pvar = 0, calm = 0, reo = 0, base = 0;
    /* ---- every read first */
    if (slot_ll(qp, o_min_rtt, &min_rtt) || slot_ll(qp, o_srtt, &srtt) || slot_ll(qp, o_rttvar, &rttvar)
        || slot_ll(qp, o_reo_extra, &reo_extra) || !is_list(port_srtt, -1) || !is_list(port_rttvar, -1)
        || !is_list(port_thr, -1) || !is_list(rack_calm, -1) || !is_list(rack_reo, -1) || !is_list(rack_rtt, -1)
        || !is_list(pmin, -1) || !is_list(rack_thr, -1))
        goto python;
    if (port >= 0 && (lget(port_srtt, port, &psrtt) || lget(port_rttvar, port, &pvar)
                      || port >= PyList_GET_SIZE(port_thr)))
        goto python;
    Py_ssize_t nports = PyList_GET_SIZE(rack_thr);
    if (rack) {
        if (port < 0 || lget(rack_calm, port, &calm) || lget(rack_reo, port, &reo) || lget(pmin, port, &base)
            || port >= PyList_GET_SIZE(rack_rtt) || PyList_GET_SIZE(pmin) < nports
            || PyList_GET_SIZE(rack_rtt) < nports || PyList_GET_SIZE(rack_reo) < nports)
            goto python;
        for (Py_ssize_t q = 0; q < nports; q++) {
            long long x;
            if (lget(pmin, q, &x) || lget(rack_rtt, q, &x) || lget(rack_reo, q, &x))
                goto python;
        }
    }
    /* ---- _rtt_sample */
    if (rtt < min_rtt && slot_set_ll(qp, o_min_rtt, rtt))
        return NULL;
    if (srtt == 0) {
        srtt = rtt;
        rttvar = rtt >> 1;
    } else {
        long long err = rtt - srtt;
        srtt += err >> 3;
        rttvar += ((err >= 0 ? err : -err) - rttvar) >> 2;
    }
    if (slot_set_ll(qp, o_srtt, srtt) || slot_set_ll(qp, o_rttvar, rttvar))
        return NULL;
    if (port >= 0) {
        if (psrtt == 0) {
            psrtt = rtt;
            pvar = rtt >> 1;
        } else {
            long long err = rtt - psrtt;
            psrtt += err >> 3;
            pvar += ((err >= 0 ? err : -err) - pvar) >> 2;
        }
        if (lset(port_srtt, port, psrtt) || lset(port_rttvar, port, pvar)
            || lset(port_thr, port, psrtt + 4 * pvar + reo_extra))
            return NULL;
    }
    /* ---- _rack_sample */
    if (rack) {
        calm += 1;
        if (calm >= RACK_CALM) {
            calm = 0;
            reo >>= 1;
            if (lset(rack_reo, port, reo > reo_extra ? reo : reo_extra))
                return NULL;
        }
        if (lset(rack_calm, port, calm) || lset(rack_rtt, port, rtt))
            return NULL;
        long long excess = rtt - base;
        for (Py_ssize_t q = 0; q < nports; q++) {
            long long b, r, ro;
            lget(pmin, q, &b);  /* (all read above) */
            if (b == NEVER)
                continue;
            lget(rack_rtt, q, &r);
            lget(rack_reo, q, &ro);
            long long est = b + excess;
            if (lset(rack_thr, q, (r > est ? r : est) + ro))
                return NULL;
        }
    }
    Py_RETURN_TRUE;
python:
    PyErr_Clear();
    Py_RETURN_FALSE;
}

/* ---------------------------------------------------------------------------------- loopback run */

/* The loopback harness's events (mrc/sim/loopback.py's heap entries (t, seq, j, data, port, ecn)),
 * held in C for the duration of one `loopback_run`: the Python list is read in at the start and written
 * back, as a valid heap of the same tuples, at the end (also on an error). (t, seq) is unique, so the
 * order is heapq's. */
typedef struct {
    long long t, seq;
    PyObject *data;  /* a reference; NULL for a timer */
    int j;
    int port;
    int ecn;
} Ev;

typedef struct {
    Ev *v;
    Py_ssize_t n, cap;
} Heap;

static inline int
ev_lt(const Ev *a, const Ev *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int
heap_push(Heap *h, Ev e)  /* takes e.data's reference */
{
    if (h->n == h->cap) {
        Py_ssize_t cap = h->cap ? 2 * h->cap : 1024;
        Ev *v = PyMem_Realloc(h->v, (size_t)cap * sizeof(Ev));
        if (v == NULL) {
            Py_XDECREF(e.data);
            PyErr_NoMemory();
            return -1;
        }
        h->v = v;
        h->cap = cap;
    }
    Py_ssize_t pos = h->n++;
    while (pos > 0) {  /* heapq's _siftdown */
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!ev_lt(&e, &h->v[parent]))
            break;
        h->v[pos] = h->v[parent];
        pos = parent;
    }
    h->v[pos] = e;
    return 0;
}

static Ev
heap_pop(Heap *h)  /* h->n > 0; the caller owns the data reference */
{
    Ev *v = h->v;
    Ev ret = v[0];
    Ev last = v[--h->n];
    Py_ssize_t n = h->n;
    if (n == 0)
        return ret;
    /* heapq's _siftup: the smaller child up to a leaf, then `last` down from there */
    Py_ssize_t pos = 0, child = 1;
    while (child < n) {
        Py_ssize_t right = child + 1;
        if (right < n && !ev_lt(&v[child], &v[right]))
            child = right;
        v[pos] = v[child];
        pos = child;
        child = 2 * pos + 1;
    }
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!ev_lt(&last, &v[parent]))
            break;
        v[pos] = v[parent];
        pos = parent;
    }
    v[pos] = last;
    return ret;
}

/* the Python heap's tuples into `h` (same order, so still a heap); the list is left empty */
static int
heap_in(Heap *h, PyObject *list)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 6) {
            PyErr_SetString(PyExc_TypeError, "loopback heap entries are (t, seq, j, data, port, ecn)");
            return -1;
        }
        Ev x;
        x.t = AS_LL(PyTuple_GET_ITEM(e, 0));
        x.seq = AS_LL(PyTuple_GET_ITEM(e, 1));
        x.j = (int)PyLong_AsLong(PyTuple_GET_ITEM(e, 2));
        PyObject *d = PyTuple_GET_ITEM(e, 3);
        x.data = d == Py_None ? NULL : Py_NewRef(d);
        x.port = (int)PyLong_AsLong(PyTuple_GET_ITEM(e, 4));
        x.ecn = PyObject_IsTrue(PyTuple_GET_ITEM(e, 5));
        if (PyErr_Occurred() || x.ecn < 0 || (x.j != 0 && x.j != 1)) {
            Py_XDECREF(x.data);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "loopback heap entry with an engine index not 0 or 1");
            return -1;
        }
        if (h->n == h->cap) {  /* append in order: the list is a heap already */
            Py_ssize_t cap = h->cap ? 2 * h->cap : 1024;
            while (cap < n)
                cap *= 2;
            Ev *v = PyMem_Realloc(h->v, (size_t)cap * sizeof(Ev));
            if (v == NULL) {
                Py_XDECREF(x.data);
                PyErr_NoMemory();
                return -1;
            }
            h->v = v;
            h->cap = cap;
        }
        h->v[h->n++] = x;
    }
    return PyList_SetSlice(list, 0, n, NULL);
}

/* `h` back into the (empty) Python list as tuples, in heap order; frees `h` whatever happens */
static int
heap_out(Heap *h, PyObject *list)
{
    int rc = 0;
    for (Py_ssize_t i = 0; i < h->n; i++) {
        Ev *x = &h->v[i];
        if (rc == 0) {
            PyObject *e = Py_BuildValue("(LLiOiO)", x->t, x->seq, x->j, x->data ? x->data : Py_None, x->port,
                                        x->ecn ? Py_True : Py_False);
            if (e == NULL || PyList_Append(list, e))
                rc = -1;
            Py_XDECREF(e);
        }
        Py_XDECREF(x->data);
    }
    PyMem_Free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
    return rc;
}

/* a list of ints as C integers */
static long long *
ll_array(PyObject *list, Py_ssize_t *n)
{
    *n = PyList_GET_SIZE(list);
    long long *a = PyMem_Malloc((size_t)(*n ? *n : 1) * sizeof(long long));
    if (a == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        a[i] = AS_LL(PyList_GET_ITEM(list, i));
        if (a[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(a);
            return NULL;
        }
    }
    return a;
}

static int
ll_store(PyObject *list, const long long *a, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (list_set(list, i, PyLong_FromLongLong(a[i])))
            return -1;
    return 0;
}

/* loopback_run(fabric, engines, heap, timer_at, port_free, plane_delay, ev_extra, plane_data_bytes,
 *              ns_per_byte, seq, until_ns, now, last_t, stop, check_every) -> (events, seq, now, last_t)
 * `LoopbackFabric.run` for an unimpaired fabric without jitter (its `transmit` draws nothing at random),
 * with the engines' calls made directly: the same events in the same order, the same times. The
 * fabric's per-port clocks and byte counts are kept in C during the run and stored back at its end. */
static PyObject *
c_loopback_run(PyObject *Py_UNUSED(mod), PyObject *args)
{
    PyObject *fab, *engines, *heap, *timer_at, *port_free, *plane_delay, *ev_extra, *pdb, *stop;
    double ns_per_byte;
    long long seq, until, now, last_t;
    long check_every;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!O!O!O!dLLLLOl:loopback_run", &fab, &PyTuple_Type, &engines,
                          &PyList_Type, &heap, &PyList_Type, &timer_at, &PyList_Type, &port_free, &PyList_Type,
                          &plane_delay, &PyList_Type, &ev_extra, &PyList_Type, &pdb, &ns_per_byte, &seq, &until,
                          &now, &last_t, &stop, &check_every))
        return NULL;
    if (PyTuple_GET_SIZE(engines) != 2 || PyList_GET_SIZE(timer_at) != 2 || PyList_GET_SIZE(port_free) != 2
        || PyList_GET_SIZE(pdb) != 2 || check_every < 1) {
        PyErr_SetString(PyExc_ValueError, "loopback_run: two engines, timers, port rows; check_every >= 1");
        return NULL;
    }
    Heap h = {NULL, 0, 0};
    long long events = 0, tmr[2] = {0, 0};
    long long *free_[2] = {NULL, NULL}, *bytes_[2] = {NULL, NULL}, *delay = NULL, *extra = NULL;
    Py_ssize_t nplanes = 0, nextra = 0, nf[2] = {0, 0}, nb[2] = {0, 0};
    PyObject *recv[2] = {NULL, NULL}, *timer[2] = {NULL, NULL};
    int ok = 0, loaded = 0, direct[2] = {0, 0};
    for (int j = 0; j < 2; j++) {
        tmr[j] = AS_LL(PyList_GET_ITEM(timer_at, j));
        PyObject *row = PyList_GET_ITEM(port_free, j), *brow = PyList_GET_ITEM(pdb, j);
        if ((tmr[j] == -1 && PyErr_Occurred()) || !PyList_Check(row) || !PyList_Check(brow)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "port rows must be lists");
            goto cleanup;
        }
        if ((free_[j] = ll_array(row, &nf[j])) == NULL || (bytes_[j] = ll_array(brow, &nb[j])) == NULL)
            goto cleanup;
        recv[j] = PyObject_GetAttr(PyTuple_GET_ITEM(engines, j), s_receive);
        timer[j] = PyObject_GetAttr(PyTuple_GET_ITEM(engines, j), s_handle_timer);
        if (!recv[j] || !timer[j])
            goto cleanup;
        direct[j] = PyMethod_Check(recv[j]) && PyMethod_GET_FUNCTION(recv[j]) == receive_fn
                    && PyMethod_GET_SELF(recv[j]) == PyTuple_GET_ITEM(engines, j);
    }
    if ((delay = ll_array(plane_delay, &nplanes)) == NULL || (extra = ll_array(ev_extra, &nextra)) == NULL)
        goto cleanup;
    if (nf[0] < nplanes || nf[1] < nplanes || nb[0] < nplanes || nb[1] < nplanes) {
        PyErr_SetString(PyExc_ValueError, "loopback_run: a port row shorter than the planes");
        goto cleanup;
    }
    if (heap_in(&h, heap))
        goto cleanup;
    loaded = 1;
    int has_stop = stop != Py_None;
#define SYNC_TIMES()                                                                         \
    do {                                                                                     \
        PyObject *a_ = PyLong_FromLongLong(now), *b_ = PyLong_FromLongLong(last_t);          \
        int e_ = !a_ || !b_ || PyObject_SetAttr(fab, s_now, a_) || PyObject_SetAttr(fab, s_last_t, b_); \
        Py_XDECREF(a_); Py_XDECREF(b_);                                                      \
        if (e_) goto cleanup;                                                                \
    } while (0)
    while (h.n) {
        if (h.v[0].t > until) {
            now = until;
            break;
        }
        Ev ev = heap_pop(&h);
        long long t = ev.t;
        int j = ev.j;
        PyObject *eng = PyTuple_GET_ITEM(engines, j);
        PyObject *tobj = PyLong_FromLongLong(t);
        if (tobj == NULL) {
            Py_XDECREF(ev.data);
            goto cleanup;
        }
        PyObject *r;
        if (ev.data == NULL) {
            if (tmr[j] != t) {
                Py_DECREF(tobj);
                continue;
            }
            if (has_stop) {
                SYNC_TIMES();
                PyObject *x = PyObject_CallNoArgs(stop);
                int done = x ? PyObject_IsTrue(x) : -1;
                Py_XDECREF(x);
                if (done) {  /* done (the timer stays queued) or an error */
                    Py_DECREF(tobj);
                    if (heap_push(&h, ev) || done < 0)
                        goto cleanup;
                    break;
                }
            }
            now = last_t = t;
            tmr[j] = NEVER;
            r = PyObject_CallOneArg(timer[j], tobj);
        } else {
            now = last_t = t;
            PyObject *port = PyLong_FromLong(ev.port);
            if (direct[j]) {  /* the context's receive is this module's: no bound-method hop */
                PyObject *a[5] = {eng, ev.data, tobj, ev.ecn ? Py_True : Py_False, port};
                r = port ? c_receive(NULL, a, 5, NULL) : NULL;
            } else {
                PyObject *a[4] = {ev.data, tobj, ev.ecn ? Py_True : Py_False, port};
                r = port ? PyObject_Vectorcall(recv[j], a, 4, NULL) : NULL;
            }
            Py_XDECREF(port);
            Py_DECREF(ev.data);
        }
        if (r == NULL) {
            Py_DECREF(tobj);
            goto cleanup;
        }
        Py_DECREF(r);
        /* the engine's datagrams, through `transmit`'s unimpaired branch */
        PyObject *dta[2] = {eng, tobj};
        PyObject *out = c_datagrams_to_send(NULL, dta, 2);
        Py_DECREF(tobj);
        if (out == NULL)
            goto cleanup;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(out); i++) {
            PyObject *dg = PyList_GET_ITEM(out, i);
            PyObject *buf = PyTuple_GET_ITEM(dg, 0);
            long p = PyLong_AsLong(PyTuple_GET_ITEM(dg, 1));
            long evi = PyLong_AsLong(PyTuple_GET_ITEM(dg, 2));
            Py_ssize_t n;
            int first;
            if (PyByteArray_CheckExact(buf)) {
                n = PyByteArray_GET_SIZE(buf);
                first = n ? (unsigned char)PyByteArray_AS_STRING(buf)[0] : 0xFF;
            } else if (PyBytes_CheckExact(buf)) {
                n = PyBytes_GET_SIZE(buf);
                first = n ? (unsigned char)PyBytes_AS_STRING(buf)[0] : 0xFF;
            } else {
                PyErr_SetString(PyExc_TypeError, "a datagram's data must be bytes or bytearray");
                Py_DECREF(out);
                goto cleanup;
            }
            if (PyErr_Occurred() || p < 0 || p >= nplanes || evi < 0 || evi >= nextra) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_IndexError, "datagram port or EV out of range");
                Py_DECREF(out);
                goto cleanup;
            }
            if (first < 0x10)  /* WRITE opcodes; control packets are 0xC0-0xC4 */
                bytes_[j][p] += n;
            long long tt = free_[j][p];
            if (tt < t)
                tt = t;
            tt += (long long)((double)n * ns_per_byte);
            free_[j][p] = tt;
            tt += delay[p] + extra[evi];
            seq += 1;
            Ev e = {tt, seq, Py_NewRef(buf), 1 - j, (int)p, 0};
            if (heap_push(&h, e)) {
                Py_DECREF(out);
                goto cleanup;
            }
        }
        Py_DECREF(out);
        long long dl = next_deadline(eng);
        if (dl == -1 && PyErr_Occurred())
            goto cleanup;
        if (dl < NEVER && dl < tmr[j]) {
            tmr[j] = dl;
            seq += 1;
            Ev e = {dl > t ? dl : t, seq, NULL, j, -1, 0};
            if (heap_push(&h, e))
                goto cleanup;
        }
        events += 1;
        if (has_stop && events % check_every == 0) {
            SYNC_TIMES();
            PyObject *x = PyObject_CallNoArgs(stop);
            int done = x ? PyObject_IsTrue(x) : -1;
            Py_XDECREF(x);
            if (done < 0)
                goto cleanup;
            if (done)
                break;
        }
    }
#undef SYNC_TIMES
    ok = 1;
cleanup:
    {
        /* the fabric's state back, whatever happened (an error keeps its exception) */
        PyObject *et, *evv, *etb;
        PyErr_Fetch(&et, &evv, &etb);
        int bad = 0;
        if (loaded)
            bad |= heap_out(&h, heap);
        else {
            for (Py_ssize_t i = 0; i < h.n; i++)
                Py_XDECREF(h.v[i].data);
            PyMem_Free(h.v);
        }
        /* callbacks ran Python code: the lists must still have the shapes read at the start */
        int shaped = PyList_GET_SIZE(port_free) == 2 && PyList_GET_SIZE(pdb) == 2 && PyList_GET_SIZE(timer_at) == 2;
        for (int j = 0; shaped && j < 2; j++) {
            PyObject *fr = PyList_GET_ITEM(port_free, j), *br = PyList_GET_ITEM(pdb, j);
            shaped = PyList_Check(fr) && PyList_Check(br) && PyList_GET_SIZE(fr) == nf[j]
                     && PyList_GET_SIZE(br) == nb[j];
        }
        if (!shaped && et == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "loopback_run: the fabric's port lists changed shape during the run");
            PyErr_Fetch(&et, &evv, &etb);
        }
        for (int j = 0; j < 2; j++) {
            if (shaped && free_[j] != NULL)
                bad |= ll_store(PyList_GET_ITEM(port_free, j), free_[j], nf[j]);
            if (shaped && bytes_[j] != NULL)
                bad |= ll_store(PyList_GET_ITEM(pdb, j), bytes_[j], nb[j]);
            if (shaped)
                bad |= list_set(timer_at, j, PyLong_FromLongLong(tmr[j]));
            PyMem_Free(free_[j]);
            PyMem_Free(bytes_[j]);
            Py_XDECREF(recv[j]);
            Py_XDECREF(timer[j]);
        }
        PyMem_Free(delay);
        PyMem_Free(extra);
        PyObject *x = PyLong_FromLongLong(seq);
        bad |= x == NULL || PyObject_SetAttr(fab, s_seq, x);
        Py_XDECREF(x);
        if (et != NULL) {
            PyErr_Clear();
            PyErr_Restore(et, evv, etb);
            return NULL;
        }
        if (bad || !ok)
            return NULL;
    }
    return Py_BuildValue("LLLL", events, seq, now, last_t);
}

/* ----------------------------------------------------------------------------- batch receive kernel */

/* rxbatch.py's `_run` and mmsg.py's `parse_controls`, in C: the same checks in the same order, the same
 * state row, so that `Context.receive_batch` takes the common data packet without numba (whose import
 * and compiler cost an mrcd ~120 MB of memory and, on a fresh checkout, seconds of compiling). The numba
 * kernels stay (MRC_RX_KERNEL=numba), and tests/unit/test_rxbatch.py runs every scenario through both. */

/* a 1-D or 2-D array's memory, read through its strides */
typedef struct {
    Py_buffer b;
    char *p;
    Py_ssize_t n, s0, n1, s1;  /* rows and their stride; for 2-D, columns and their stride */
} arr;

/* 0, or -1 with a TypeError naming `what`: `o` an array of `ndim` dimensions whose items are `itemsize`
 * bytes (format letter in `letters`; writable when `wr`) */
static int
arr_open(arr *a, PyObject *o, int ndim, Py_ssize_t itemsize, const char *letters, int wr, const char *what)
{
    a->b.obj = NULL;
    if (PyObject_GetBuffer(o, &a->b, PyBUF_STRIDES | PyBUF_FORMAT | (wr ? PyBUF_WRITABLE : 0)) < 0)
        goto bad;
    const char *f = a->b.format;
    if (f != NULL && (*f == '@' || *f == '=' || *f == '<'))
        f++;
    if (a->b.ndim != ndim || a->b.itemsize != itemsize || f == NULL || f[0] == 0 || f[1] != 0
        || strchr(letters, f[0]) == NULL)
        goto bad;
    a->p = (char *)a->b.buf;
    a->n = a->b.shape[0];
    a->s0 = a->b.strides[0];
    a->n1 = ndim == 2 ? a->b.shape[1] : 1;
    a->s1 = ndim == 2 ? a->b.strides[1] : 0;
    return 0;
bad:
    if (a->b.obj != NULL)
        PyBuffer_Release(&a->b);
    a->b.obj = NULL;
    PyErr_Format(PyExc_TypeError, "rx kernel: %s is not the array it takes", what);
    return -1;
}

static void
arr_close(arr *a, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].b.obj != NULL)
            PyBuffer_Release(&a[i].b);
}

#define I64(a, i) (*(int64_t *)((a).p + (i) * (a).s0))
#define U64(a, i) (*(uint64_t *)((a).p + (i) * (a).s0))
#define U8(a, i) (*(uint8_t *)((a).p + (i) * (a).s0))
#define U8_2(a, i, c) (*(uint8_t *)((a).p + (i) * (a).s0 + (c) * (a).s1))

/* rxbatch.py's state row and stop reasons (checked against it by rxbatch at import: `rx_consts`) */
enum { S_CUM, S_OFF, S_WD, S_RXP, S_RXB, S_UNACK, S_COAL, S_QPN, S_RKEY, S_MRADDR, S_MRLEN, S_MSN, S_MDONE,
       S_MLEN, S_END, S_ECN, S_LAST, S_PSN, S_EV, S_TS, S_FLAGS, S_PORT, S_NEED_RKEY, S_NEED_MSN, S_NEED_EV,
       S_LPSN, S_LEV, S_LTS, S_LPORT, ST_LEN };
enum { RX_DONE, RX_SACK, RX_PURE, RX_CTX, RX_OTHER_QP, RX_FULL };
#define RX_MIN_LEN 56
#define RX_STARTS 0x4000 /* EV_INDEX_MAX + 1 */

static inline int64_t
row32(const uint8_t *r, int o)
{
    return ((int64_t)r[o] << 24) | ((int64_t)r[o + 1] << 16) | ((int64_t)r[o + 2] << 8) | (int64_t)r[o + 3];
}

/* rx_run(data, lens, ecn, ports, srcs, peer, j, k, st, words, mr, starts) -> (why, j): rxbatch._run */
static PyObject *
c_rx_run(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "rx_run takes 12 arguments");
        return NULL;
    }
    if (crc32 == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastc.rx_run before _fastc.setup");
        return NULL;
    }
    Py_ssize_t j = PyLong_AsSsize_t(args[6]), k = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred())
        return NULL;
    enum { DATA, LENS, ECN, PORTS, SRCS, PEER, ST, WORDS, MR, STARTS, NA };
    arr a[NA];
    memset(a, 0, sizeof(a));
    if (arr_open(&a[DATA], args[0], 2, 1, "Bbc", 0, "data") || arr_open(&a[LENS], args[1], 1, 8, "qlQL", 0, "lens")
        || arr_open(&a[ECN], args[2], 1, 1, "?Bb", 0, "ecn") || arr_open(&a[PORTS], args[3], 1, 8, "qlQL", 0, "ports")
        || arr_open(&a[SRCS], args[4], 2, 1, "Bbc", 0, "srcs") || arr_open(&a[PEER], args[5], 1, 1, "Bbc", 0, "peer")
        || arr_open(&a[ST], args[8], 1, 8, "ql", 1, "st") || arr_open(&a[WORDS], args[9], 1, 8, "QLql", 1, "words")
        || arr_open(&a[MR], args[10], 1, 1, "Bbc", 1, "mr") || arr_open(&a[STARTS], args[11], 1, 8, "ql", 0, "starts"))
        goto fail;
    if (j < 0 || k > a[LENS].n || k > a[DATA].n || k > a[ECN].n || k > a[PORTS].n
        || (a[SRCS].n && (k > a[SRCS].n || a[SRCS].n1 < 16)) || a[PEER].n < 16 || a[ST].n < ST_LEN
        || a[STARTS].n < RX_STARTS || (a[DATA].n1 > 1 && a[DATA].s1 != 1) || (a[MR].n > 1 && a[MR].s0 != 1)) {
        PyErr_SetString(PyExc_ValueError, "rx_run: arrays of the wrong shapes");
        goto fail;
    }
    arr st = a[ST], words = a[WORDS];
    int64_t nbits = (int64_t)words.n * 64, rowlen = a[DATA].n1;
    uint8_t *mrp = (uint8_t *)a[MR].p;
    int64_t mrn = a[MR].n;
    int why = RX_DONE;
#define STOP(w) do { why = (w); goto out; } while (0)
    while (j < k) {
        int64_t n = I64(a[LENS], j);
        const uint8_t *row = (const uint8_t *)(a[DATA].p + j * a[DATA].s0);
        if (n < RX_MIN_LEN || n > rowlen || row[0] != 0x0A)
            STOP(n >= RX_MIN_LEN && n <= rowlen ? RX_OTHER_QP : RX_PURE);
        if ((((int64_t)row[5] << 16) | ((int64_t)row[6] << 8) | (int64_t)row[7]) != I64(st, S_QPN))
            STOP(RX_OTHER_QP);
        if (a[SRCS].n)
            for (int b = 0; b < 16; b++)
                if (U8_2(a[SRCS], j, b) != U8(a[PEER], b))
                    STOP(RX_PURE);
        int64_t b1 = row[1], qw = row32(row, 4), pw = row32(row, 8);
        int64_t va = (row32(row, 12) << 32) | row32(row, 16);
        int64_t rkey = row32(row, 20), dlen = row32(row, 24), ver = row[28], flags = row[29];
        int64_t ev = ((int64_t)row[30] << 8) | row[31];
        int64_t msn = row32(row, 32), mlen = row32(row, 36), moff = row32(row, 40);
        int64_t pkey = ((int64_t)row[2] << 8) | row[3];
        if ((b1 & 0x0F) || (pkey & 0x7FFF) != 0x7FFF || qw > 0xFFFFFF || ver != 1 || (flags & 0x01)
            || dlen > 8192 || ev > 0x3FFF)
            STOP(RX_PURE);
        int64_t pad = (b1 >> 4) & 3, end = 52 + dlen + pad;
        if (((dlen + pad) & 3) || n != end + 4 || moff + dlen > mlen)
            STOP(RX_PURE);
        int64_t sv = I64(a[STARTS], ev & 0x3FFF);
        if (end != I64(st, S_END) || rkey != I64(st, S_RKEY) || msn != I64(st, S_MSN) || sv < 0) {
            I64(st, S_NEED_RKEY) = rkey;
            I64(st, S_NEED_MSN) = msn;
            I64(st, S_NEED_EV) = ev;
            I64(st, S_END) = end;
            STOP(RX_CTX);
        }
        if (crc32((uint32_t)sv, row, (uint64_t)n) != CRC32_RESIDUE)
            STOP(RX_PURE);
        int64_t psn = pw & 0xFFFFFF, d = (psn - I64(st, S_CUM)) & 0xFFFFFF;
        if (d >= 0x800000 || d >= I64(st, S_WD))
            STOP(RX_PURE);
        int64_t i = I64(st, S_OFF) + d;
        if (i >= nbits)
            STOP(RX_FULL);
        int64_t w = i >> 6;
        uint64_t bit = (uint64_t)1 << (i & 63);
        int64_t off = va - I64(st, S_MRADDR);
        /* (the region's own length bounds the copy too: st says where the region is, the array what is there) */
        if ((U64(words, w) & bit) || off < 0 || off + dlen > I64(st, S_MRLEN) || off + dlen > mrn
            || I64(st, S_MDONE) + dlen >= I64(st, S_MLEN))
            STOP(RX_PURE);
        /* ---- placement and accounting (fastpath.receive's) */
        memcpy(mrp + off, row + 52, (size_t)dlen);
        U64(words, w) |= bit;
        if (d == 0) {
            int64_t t = i;
            while (t < nbits && (U64(words, t >> 6) & ((uint64_t)1 << (t & 63))))
                t++;
            I64(st, S_CUM) = (I64(st, S_CUM) + t - i) & 0xFFFFFF;
            I64(st, S_OFF) = t;
        }
        I64(st, S_RXP) += 1;
        I64(st, S_RXB) += dlen;
        I64(st, S_MDONE) += dlen;
        int e = U8(a[ECN], j) != 0;
        if (e)
            I64(st, S_ECN) += 1;
        int64_t ts = (int64_t)(((uint64_t)row32(row, 44) << 32) | (uint64_t)row32(row, 48));
        int64_t port = I64(a[PORTS], j);
        j++;
        int64_t u = I64(st, S_UNACK) + 1;
        if (e || (pw & 0x80000000) || u >= I64(st, S_COAL) || (flags & 0x12)) {
            I64(st, S_PSN) = psn;
            I64(st, S_EV) = ev;
            I64(st, S_TS) = ts;
            I64(st, S_FLAGS) = flags;
            I64(st, S_PORT) = port;
            STOP(RX_SACK);
        }
        I64(st, S_UNACK) = u;
        I64(st, S_LPSN) = psn;
        I64(st, S_LEV) = ev;
        I64(st, S_LTS) = ts;
        I64(st, S_LPORT) = port;
        I64(st, S_LAST) = 1;
    }
#undef STOP
out:
    arr_close(a, NA);
    return Py_BuildValue("(in)", why, j);
fail:
    arr_close(a, NA);
    return NULL;
}

/* rx_parse(hdrs, ctl, k, csize, table, lens, ecn, ports) -> CE count: mmsg.parse_controls' kernel (each
 * received datagram's length from its mmsghdr, ECN-CE from IPV6_TCLASS, the plane port of the IPV6_PKTINFO
 * interface through `table`, 0 beyond it). Reads little-endian fields as the kernel laid them out. */
static PyObject *
c_rx_parse(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "rx_parse takes 8 arguments");
        return NULL;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[2]), csize = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    enum { HDRS, CTL, TABLE, LENS, ECN, PORTS, NA };
    arr a[NA];
    memset(a, 0, sizeof(a));
    if (arr_open(&a[HDRS], args[0], 1, 1, "Bbc", 0, "hdrs") || arr_open(&a[CTL], args[1], 1, 1, "Bbc", 0, "ctl")
        || arr_open(&a[TABLE], args[4], 1, 8, "ql", 0, "table") || arr_open(&a[LENS], args[5], 1, 8, "ql", 1, "lens")
        || arr_open(&a[ECN], args[6], 1, 1, "?Bb", 1, "ecn") || arr_open(&a[PORTS], args[7], 1, 8, "ql", 1, "ports")) {
        arr_close(a, NA);
        return NULL;
    }
    if (k < 0 || csize < 0 || k * 64 > a[HDRS].n || k > a[LENS].n || k > a[ECN].n || k > a[PORTS].n) {
        arr_close(a, NA);
        PyErr_SetString(PyExc_ValueError, "rx_parse: arrays of the wrong shapes");
        return NULL;
    }
    int64_t ce = 0, nctl = a[CTL].n;
#define B(x, i) ((int64_t)U8((x), (i)))
    for (Py_ssize_t j = 0; j < k; j++) {
        Py_ssize_t h = j * 64;
        int64_t n = 0, clen = 0;
        for (int b = 0; b < 4; b++)
            n |= B(a[HDRS], h + 56 + b) << (8 * b);
        for (int b = 0; b < 8; b++)
            clen |= B(a[HDRS], h + 40 + b) << (8 * b);
        I64(a[LENS], j) = n;
        int64_t tclass = -1, ifindex = 0, base = (int64_t)j * csize, off = 0;
        while (off + 16 <= clen && base + off + 16 <= nctl) {
            uint64_t ln = 0;
            for (int b = 0; b < 8; b++)
                ln |= (uint64_t)B(a[CTL], base + off + b) << (8 * b);
            if (ln < 16 || ln > (uint64_t)1 << 32)
                break;
            int64_t level = B(a[CTL], base + off + 8) | (B(a[CTL], base + off + 9) << 8);
            int64_t kind = B(a[CTL], base + off + 12) | (B(a[CTL], base + off + 13) << 8);
            if (level == 41) { /* IPPROTO_IPV6 */
                if (kind == 67 && ln >= 20 && base + off + 18 <= nctl) /* IPV6_TCLASS */
                    tclass = B(a[CTL], base + off + 16) | (B(a[CTL], base + off + 17) << 8);
                else if (kind == 50 && ln >= 36 && base + off + 36 <= nctl) { /* IPV6_PKTINFO's ifindex */
                    ifindex = 0;
                    for (int b = 0; b < 4; b++)
                        ifindex |= B(a[CTL], base + off + 32 + b) << (8 * b);
                }
            }
            off += (int64_t)((ln + 7) & ~(uint64_t)7);
        }
        int e = tclass >= 0 && (tclass & 3) == 3;
        U8(a[ECN], j) = (uint8_t)e;
        ce += e;
        I64(a[PORTS], j) = ifindex < a[TABLE].n ? I64(a[TABLE], ifindex) : 0;
    }
#undef B
    arr_close(a, NA);
    return PyLong_FromLongLong(ce);
}

/* rxbatch.py's numbering of the state row and of the stop reasons, as compiled here */
static PyObject *
c_rx_consts(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(a))
{
    return Py_BuildValue("{sisisisisisisisisisisisisisi}", "S_CUM", S_CUM, "S_END", S_END, "S_ECN", S_ECN,
                         "S_LAST", S_LAST, "S_PSN", S_PSN, "S_PORT", S_PORT, "S_NEED_EV", S_NEED_EV,
                         "S_LPORT", S_LPORT, "ST_LEN", ST_LEN, "DONE", RX_DONE, "SACK", RX_SACK, "PURE", RX_PURE,
                         "CTX", RX_CTX, "FULL", RX_FULL);
}

/* ---------------------------------------------------------------------------------------- setup */

struct slotspec {
    Py_ssize_t *off;
    const char *name;
};

static int
offsets(PyTypeObject *tp, const struct slotspec *s)
{
    for (; s->off != NULL; s++)
        if (slot_offset(tp, s->name, s->off) < 0)
            return -1;
    return 0;
}

#define S(o, n) {&o, n}

static PyObject *
c_setup(PyObject *Py_UNUSED(mod), PyObject *args)
{
    PyObject *qpt, *mrt, *wrt, *ict, *dgt, *rts, *rtr, *recv, *sack, *send, *sackt;
    unsigned long long crc_addr;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!OOOOOKO!:setup", &PyType_Type, &qpt, &PyType_Type, &mrt,
                          &PyType_Type, &wrt, &PyType_Type, &ict, &PyType_Type, &dgt,
                          &rts, &rtr, &recv, &sack, &send, &crc_addr, &PyType_Type, &sackt))
        return NULL;
    if (crc_addr == 0) {
        PyErr_SetString(PyExc_ValueError, "no CRC-32 function");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)dgt, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "Datagram must be a tuple type");
        return NULL;
    }
    ready = 0;
    const struct slotspec qps[] = {
        S(o_state, "state"), S(o_peer_gid, "peer_gid"), S(o_rx_icrc, "rx_icrc"), S(o_rcv_cum, "rcv_cum"),
        S(o_rbits, "rbits"), S(o_Wd, "Wd"), S(o_mrs, "mrs"), S(o_msgs, "msgs"), S(o_rx_packets, "rx_packets"),
        S(o_rx_bytes, "rx_bytes"), S(o_unacked, "unacked"), S(o_ack_coalesce, "ack_coalesce"),
        S(o_last_rx, "last_rx"), S(o_ack_deadline, "ack_deadline"), S(o_attr, "attr"),
        S(o_W, "W"), S(o_mtu, "mtu"), S(o_snd_nxt, "snd_nxt"), S(o_snd_una, "snd_una"), S(o_wlim, "wlim"),
        S(o_cc, "cc"), S(o_inflight, "inflight"), S(o_ack_floor, "ack_floor"), S(o_paths, "paths"),
        S(o_tx_state, "tx_state"), S(o_tx_len, "tx_len"), S(o_tx_ev, "tx_ev"), S(o_tx_time, "tx_time"),
        S(o_tx_serial, "tx_serial"), S(o_tx_wr, "tx_wr"), S(o_tx_off, "tx_off"), S(o_tx_retx, "tx_retx"),
        S(o_tx_icrc, "tx_icrc"), S(o_peer_qpn, "peer_qpn"), S(o_serial, "serial"), S(o_c, "c"),
        S(o_rto_deadline, "rto_deadline"), S(o_ts_off, "ts_off"), S(o_ackreq_since, "ackreq_since"),
        S(o_ackreq_div, "ackreq_div"), S(o_cur, "cur"), S(o_tx_bytes, "tx_bytes"),
        S(o_max_outstanding, "max_outstanding"), S(o_parked, "parked"), S(o_retx_q, "retx_q"),
        S(o_send_q, "send_q"), S(o_oow_q, "oow_q"), S(o_aux_deadline, "aux_deadline"),
        S(o_loss_deadline, "loss_deadline"), S(o_ack_coalesce_sum, "ack_coalesce_sum"),
        S(o_min_rtt, "min_rtt"), S(o_srtt, "srtt"), S(o_rttvar, "rttvar"), S(o_port_srtt, "port_srtt"),
        S(o_port_rttvar, "port_rttvar"), S(o_port_thr, "port_thr"), S(o_reo_extra, "reo_extra"),
        S(o_rack_calm, "rack_calm"), S(o_rack_reo, "rack_reo"), S(o_rack_rtt, "rack_rtt"),
        S(o_port_min_rtt, "port_min_rtt"), S(o_rack_thr, "rack_thr"), S(o_rack_ser, "rack_ser"),
        S(o_fast, "fast"), {NULL, NULL}};
    const struct slotspec mrs[] = {S(o_mr_addr, "addr"), S(o_mr_length, "length"),
                                   S(o_mr_remote_write, "remote_write"), S(o_mr_view, "view"), {NULL, NULL}};
    const struct slotspec wrs[] = {
        S(o_wr_msn, "msn"), S(o_wr_mr, "mr"), S(o_wr_offset, "offset"), S(o_wr_length, "length"),
        S(o_wr_remote_addr, "remote_addr"), S(o_wr_rkey, "rkey"), S(o_wr_imm, "imm"), S(o_wr_sent, "sent"),
        S(o_wr_first_psn, "first_psn"), S(o_wr_last_psn, "last_psn"), {NULL, NULL}};
    const struct slotspec ics[] = {S(o_i_start, "_start"), S(o_i_src, "_src"), S(o_i_dst, "_dst"),
                                   S(o_i_dport, "_dport"), {NULL, NULL}};
    if (offsets((PyTypeObject *)qpt, qps) || offsets((PyTypeObject *)mrt, mrs)
        || offsets((PyTypeObject *)wrt, wrs)
        || offsets((PyTypeObject *)ict, ics))
        return NULL;
    Py_XSETREF(qp_type, (PyTypeObject *)Py_NewRef(qpt));
    Py_XSETREF(mr_type, (PyTypeObject *)Py_NewRef(mrt));
    Py_XSETREF(wr_type, (PyTypeObject *)Py_NewRef(wrt));
    Py_XSETREF(icrc_type, (PyTypeObject *)Py_NewRef(ict));
    Py_XSETREF(dg_type, (PyTypeObject *)Py_NewRef(dgt));
    Py_XSETREF(sack_type, Py_NewRef(sackt));
    Py_XSETREF(st_rts, Py_NewRef(rts));
    Py_XSETREF(st_rtr, Py_NewRef(rtr));
    Py_XSETREF(py_receive, Py_NewRef(recv));
    Py_XSETREF(py_sack, Py_NewRef(sack));
    Py_XSETREF(py_send_new, Py_NewRef(send));
    crc32 = (crc_fn)(uintptr_t)crc_addr;
    ready = 1;
    Py_RETURN_NONE;
}

/* setup_ring(TxRing, slot): the ring type whose instances `datagrams_to_send` and `send_new` write into */
static PyObject *
c_setup_ring(PyObject *Py_UNUSED(mod), PyObject *args)
{
    PyObject *rt;
    Py_ssize_t slot;
    if (!PyArg_ParseTuple(args, "O!n:setup_ring", &PyType_Type, &rt, &slot))
        return NULL;
    if (slot != RING_SLOT) {
        PyErr_Format(PyExc_ValueError, "TxRing slots of %zd bytes; this build writes %d", slot, RING_SLOT);
        return NULL;
    }
    const struct slotspec rs[] = {S(o_r_cap, "cap"), S(o_r_data, "data"), S(o_r_lens, "lens"),
                                  S(o_r_ports, "ports"), S(o_r_evs, "evs"), S(o_r_dst, "dst"),
                                  S(o_r_head, "head"), S(o_r_tail, "tail"), {NULL, NULL}};
    Py_CLEAR(ring_type);
    if (offsets((PyTypeObject *)rt, rs))
        return NULL;
    ring_type = (PyTypeObject *)Py_NewRef(rt);
    Py_RETURN_NONE;
}

static PyObject *
c_consts(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(a))
{
    return Py_BuildValue(
        "{sisisisisisisisisisisisisisisisisisisisisisisisisKsisLsisIsisisi}",
        "WRITE_HDR_LEN", WRITE_HDR_LEN, "WRITE_IMM_HDR_LEN", WRITE_IMM_HDR_LEN, "ICRC_LEN", ICRC_LEN,
        "OP_WRITE", OP_WRITE, "OP_WRITE_IMM", OP_WRITE_IMM, "PKEY_PARTITION", PKEY_PARTITION,
        "DEFAULT_PKEY", DEFAULT_PKEY, "QPN_MASK", (int)QPN_MASK, "PSN_MASK", (int)PSN_MASK, "HALF", (int)HALF,
        "MXH_VERSION", MXH_VERSION, "MAX_PAYLOAD", MAX_PAYLOAD, "EV_INDEX_MAX", EV_INDEX_MAX,
        "EV_SPORT_BASE", EV_SPORT_BASE, "F_TRIMMED", F_TRIMMED, "F_RETX", F_RETX, "F_FIRST", F_FIRST,
        "F_LAST", F_LAST, "F_ACK_NOW", F_ACK_NOW, "S_RETX", S_RETX, "TX_INFLIGHT", TX_INFLIGHT, "TX_LOST", TX_LOST, "TX_ACKED", TX_ACKED,
        "CRC32_RESIDUE", (int)CRC32_RESIDUE, "ACKREQ_BIT", (unsigned long long)ACKREQ_BIT,
        "ICRC_LEN_", ICRC_LEN, "NEVER", (long long)NEVER, "UDP_LEN", UDP_LEN, "BTH4_ZERO", (unsigned int)BTH4_ZERO,
        "ICRC_CACHE_MAX", ICRC_CACHE_MAX, "RACK_CALM", RACK_CALM,
        "SACK_MAX_WORDS", SACK_MAX_WORDS);
}

static PyMethodDef methods[] = {
    {"receive", (PyCFunction)(void (*)(void))c_receive, METH_FASTCALL | METH_KEYWORDS,
     "receive(ctx, data, now, ecn=False, port=0, src=None): fastpath.receive, the common packet in C."},
    {"send_new", (PyCFunction)(void (*)(void))c_send_new, METH_FASTCALL,
     "send_new(qp, wr, now, out) -> bool: fastpath.send_new in C."},
    {"datagrams_to_send", (PyCFunction)(void (*)(void))c_datagrams_to_send, METH_FASTCALL,
     "datagrams_to_send(ctx, now[, ring]): Context.datagrams_to_send (datagrams_into with a TxRing) in C."},
    {"ack_bits", (PyCFunction)(void (*)(void))c_ack_bits, METH_FASTCALL,
     "Requester.on_sack's loop over newly acknowledged PSNs, up to the first LOST slot."},
    {"loss_scan", (PyCFunction)(void (*)(void))c_loss_scan, METH_FASTCALL,
     "Recovery._detect_losses' walk over first transmissions, up to the next one it declares lost."},
    {"rtt_sample", (PyCFunction)(void (*)(void))c_rtt_sample, METH_FASTCALL,
     "Recovery._rtt_sample and _rack_sample of one SACK's RTT."},
    {"next_deadline", c_next_deadline, METH_O, "next_deadline(ctx): Context.next_deadline in C."},
    {"loopback_run", c_loopback_run, METH_VARARGS,
     "The loopback harness's event loop for an unimpaired fabric (mrc/sim/loopback.py)."},
    {"setup", c_setup, METH_VARARGS, "Resolve the engine's slot offsets and the Python fallbacks."},
    {"setup_ring", c_setup_ring, METH_VARARGS, "setup_ring(TxRing, SLOT): the send ring's slot offsets."},
    {"consts", c_consts, METH_NOARGS, "The wire constants compiled in (checked against mrc.wire.consts)."},
    {"rx_run", (PyCFunction)(void (*)(void))c_rx_run, METH_FASTCALL,
     "rx_run(data, lens, ecn, ports, srcs, peer, j, k, st, words, mr, starts) -> (why, j): rxbatch's kernel."},
    {"rx_parse", (PyCFunction)(void (*)(void))c_rx_parse, METH_FASTCALL,
     "rx_parse(hdrs, ctl, k, csize, table, lens, ecn, ports) -> CE count: mmsg.parse_controls' kernel."},
    {"rx_consts", c_rx_consts, METH_NOARGS, "rxbatch's state row and stop reasons as compiled in."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "_fastc", "The engine's fast path in C (see fastpath.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fastc(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (m == NULL)
        return NULL;
    /* the interface between this file and fastpath.py (setup's arguments, the functions' contracts):
     * fastpath refuses a module built from another version of this file (a stale in-place build) */
    if (PyModule_AddIntConstant(m, "ABI", FASTC_ABI) < 0)
        return NULL;
#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return NULL
    if ((send_new_fn = PyObject_GetAttrString(m, "send_new")) == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    if ((receive_fn = PyObject_GetAttrString(m, "receive")) == NULL)
        return NULL;
    INTERN(s_qps, "qps");
    INTERN(s_out, "_out");
    INTERN(s_ack_delay_ns, "ack_delay_ns");
    INTERN(s_cwnd, "cwnd");
    INTERN(s_window_limited, "window_limited");
    INTERN(s_cwnd_limited, "cwnd_limited");
    INTERN(s_next_ev, "next_ev");
    INTERN(s_rto_interval, "_rto_interval");
    INTERN(s_start, "start");
    INTERN(s_pen, "pen");
    INTERN(s_active, "_active");
    INTERN(s_ctl_ev, "ctl_ev");
    INTERN(s_ev_port, "ev_port");
    INTERN(s_sack_tx, "sack_tx");
    INTERN(s_sack_rx, "sack_rx");
    INTERN(s_send, "send");
    INTERN(s_paths, "paths");
    INTERN(s_next_probe_deadline, "next_probe_deadline");
    INTERN(s_receive, "receive");
    INTERN(s_handle_timer, "handle_timer");
    INTERN(s_datagrams_to_send, "datagrams_to_send");
    INTERN(s_next_deadline_m, "next_deadline");
    INTERN(s_now, "now");
    INTERN(s_last_t, "last_t");
    INTERN(s_seq, "seq");
    INTERN(s_reserve, "reserve");
    INTERN(s_append, "append");
    return m;
}
