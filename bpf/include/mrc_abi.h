/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mrc_abi.h - the one header whose numbers and structs Python also sees.
 *
 * Everything here mirrors mrc/wire/consts.py (wire format, docs/design.md §3); tests/unit/test_abi.py parses
 * this file and fails when the two disagree. BPF programs include it; userspace never hard-codes these.
 */
#ifndef MRC_ABI_H
#define MRC_ABI_H

/* RoCEv2 UDP destination port; UDP source port = MRC_EV_SPORT_BASE | EV index (14 bits). */
#define MRC_UDP_PORT 4791
#define MRC_EV_SPORT_BASE 0xC000
#define MRC_EV_INDEX_BITS 14

/* Header lengths in bytes. */
#define MRC_BTH_LEN 12
#define MRC_RETH_LEN 16
#define MRC_IMMDT_LEN 4
#define MRC_MXH_LEN 24
#define MRC_ICRC_LEN 4

/* BTH opcodes. */
#define MRC_OP_WRITE_ONLY 0x0A
#define MRC_OP_WRITE_ONLY_IMM 0x0B
#define MRC_OP_SACK 0xC0
#define MRC_OP_NACK 0xC1
#define MRC_OP_PROBE 0xC2
#define MRC_OP_PROBE_REPLY 0xC3
#define MRC_OP_PORT_STATUS 0xC4

/* MXH: version byte, flags byte, EV index (u16, network order) at these offsets inside MXH. */
#define MRC_MXH_VERSION 1
#define MRC_MXH_OFF_FLAGS 1
#define MRC_MXH_OFF_EV_INDEX 2
#define MRC_MXH_F_TRIMMED 0x01
#define MRC_MXH_F_RETX 0x02
#define MRC_MXH_F_FIRST 0x04
#define MRC_MXH_F_LAST 0x08
#define MRC_MXH_F_ACK_REQ_NOW 0x10
#define MRC_MXH_F_PRIO 0x20

/* Offset of MXH from the start of BTH, per opcode class. */
#define MRC_MXH_OFF_WRITE (MRC_BTH_LEN + MRC_RETH_LEN)
#define MRC_MXH_OFF_WRITE_IMM (MRC_BTH_LEN + MRC_RETH_LEN + MRC_IMMDT_LEN)
#define MRC_MXH_OFF_CONTROL MRC_BTH_LEN

/* ---------------------------------------------------------------------------------------------------
 * Dataplane ABI (docs/design.md §5): map keys/values and enums the programs and mrc.dataplane.abi share.
 * Only fixed-width types, explicit padding, natural alignment: the ctypes mirror in dataplane/abi.py
 * has the same fields in the same order (tests/unit/test_abi_structs.py checks names, types, offsets).
 */

/* Table sizes (rows of the per-port / per-host counter arrays; ids 0 are "unknown"). */
#define MRC_MAX_PORTS 1024
#define MRC_MAX_HOSTS 256
#define MRC_PATHS_MAX 65536
#define MRC_QPS_MAX 65536
#define MRC_EV_BUCKETS 32

/* Drop reasons (the Prometheus `reason` label): one closed set for all three programs. */
#define MRC_DROP_TRUNCATED 1
#define MRC_DROP_BAD_IP 2
#define MRC_DROP_BAD_LENGTH 3
#define MRC_DROP_BAD_VERSION 4
#define MRC_DROP_BAD_OPCODE 5
#define MRC_DROP_FOREIGN_QPN 6
#define MRC_DROP_NO_PATH 7
#define MRC_DROP_ENCAP_FAILED 8
#define MRC_DROP_BUFFER 9
#define MRC_DROP_FAULT 10
#define MRC_DROP_BLACKHOLE 11
#define MRC_DROP_MAX 12

/* What a switch port did with a packet (one action per packet; counters per port and action). */
#define MRC_SW_FORWARD 0
#define MRC_SW_ECN_MARK 1
#define MRC_SW_TRIM 2
#define MRC_SW_DROP_BUFFER 3
#define MRC_SW_DROP_FAULT 4
#define MRC_SW_DROP_BLACKHOLE 5
#define MRC_SW_ACT_MAX 6

/* Host ingress port flags. */
/* QP_FILTER: drop packets whose DestQP is not in mrc_allowed_qps; XDP_DECAP: strip the outer IPv6 in
 * XDP instead of leaving it to the kernel's End.DT6. */
#define MRC_PORT_F_QP_FILTER 0x1
#define MRC_PORT_F_XDP_DECAP 0x2

/* A fault matching every EV. */
#define MRC_FAULT_ANY_EV 0xFFFFFFFF

#ifndef __MRC_ABI_NO_STRUCTS

/* A packet and byte counter (per-CPU rows; userspace sums the CPUs). */
struct mrc_counter {
	__u64 packets;
	__u64 bytes;
};

/* host_egress: (host scope, destination GID, EV index) -> where the packet goes. */
struct mrc_path_key {
	__u64 netns_cookie;
	__u8 dst[16];
	__u32 ev_index;
	__u32 pad;
};

struct mrc_path {
	__u32 ifindex; /* plane port in the host's namespace */
	__u32 port_id; /* counter row of that port */
	__u8 smac[6];
	__u8 dmac[6];
	__u8 src[16]; /* outer source: the plane-port address */
	__u8 container[16]; /* outer destination: the micro-SID container */
	__u32 plane;
};

/* host_ingress: the receiving port, found by its own MAC (XDP has no netns cookie). */
struct mrc_in_port {
	__u32 port_id;
	__u32 host_id;
	__u32 plane;
	__u32 flags; /* MRC_PORT_F_* */
};

struct mrc_qp_key {
	__u32 host_id;
	__u32 qpn;
};

/* host_ingress counters per (port, EV bucket). */
struct mrc_ev_counters {
	__u64 packets;
	__u64 bytes;
	__u64 ce;
	__u64 trimmed;
};

/* switch_port: configuration of one port's virtual queue (rate 0 = no queue, faults only). */
struct mrc_sw_port {
	__u32 port_id;
	__u32 pad;
	__u64 rate_bps;
	__u32 ecn_k; /* mark ECN-CE above this many queued bytes */
	__u32 trim_t; /* trim MRC data packets above this many queued bytes */
	__u32 buffer; /* drop above this many queued bytes */
	__u32 pad2;
};

/* switch_port: the virtual queue's state (drained at rate_bps since last_ns). */
struct mrc_vq {
	__u64 last_ns;
	__u64 backlog;
};

/* switch_port: a fault on one port (egress). */
struct mrc_fault {
	__u32 drop_prob; /* drop probability as a fraction of 2^32 - 1 */
	__u32 blackhole; /* 1: drop everything that matches */
	__u32 ev_index; /* only this EV (outer flow label), or MRC_FAULT_ANY_EV */
	__u32 pad;
};

#endif /* __MRC_ABI_NO_STRUCTS */

#endif /* MRC_ABI_H */
