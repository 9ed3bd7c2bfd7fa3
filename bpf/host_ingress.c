/* SPDX-License-Identifier: GPL-2.0 */
/*
 * host_ingress - XDP on each plane port of a host (docs/design.md §5, docs/dataplane.md).
 *
 * For UDP 4791 in IPv6-in-IPv6 (MRC on the fabric), or in plain IPv6 (not the fabric's, but it reaches
 * the MRC socket all the same), behind up to MRC_VLAN_MAX VLAN tags: checks that it is addressed to a
 * known port's MAC, every header and length against the frame, the BTH TVer and MXH version, the
 * opcode, and (when the port says so) that DestQP is in the allowed-QP map; drops what fails, counted
 * per (port, reason).
 * Counts packets, bytes, ECN-CE and trimmed per (port, EV bucket); copies an outer CE into an ECT inner
 * header (RFC 6040); then either passes the packet to the kernel (End.DT6 decapsulates) or strips the
 * outer header here (MRC_PORT_F_XDP_DECAP).
 * Everything else (ICMPv6 probes, kernel traffic) passes untouched.
 *
 * Loaded with BPF_F_XDP_HAS_FRAGS (veth refuses plain XDP at MTU 9000): headers are read from the
 * linear part, lengths are checked against bpf_xdp_get_buff_len().
 */
#include <uapi/linux/bpf.h>

#include "mrc_abi.h"
#include "mrc_consts.h"
#include "mrc_metrics.h"
#include "mrc_parse.h"

/* the receiving port's own MAC (low 48 bits, network byte order packed big-endian) -> port info */
BPF_HASH(mrc_in_ports, __u64, struct mrc_in_port, MRC_MAX_PORTS);
/* (host id, QPN) -> 1 for every QP the host's daemon allows */
BPF_HASH(mrc_allowed_qps, struct mrc_qp_key, __u32, MRC_QPS_MAX);
/* per (port id, EV bucket): packets, bytes, ECN-CE, trimmed */
BPF_PERCPU_ARRAY(mrc_ingress_ev, struct mrc_ev_counters, MRC_MAX_PORTS * MRC_EV_BUCKETS);
/* per (port id, reason): packets dropped */
BPF_PERCPU_ARRAY(mrc_ingress_drops, struct mrc_counter, MRC_MAX_PORTS * MRC_DROP_MAX);

static __always_inline int drop(__u32 port, __u32 reason, __u32 len)
{
	__u32 row = port * MRC_DROP_MAX + reason;
	mrc_add(mrc_ingress_drops.lookup(&row), len);
	return XDP_DROP;
}

/* An IPv6 header followed by extension headers. MRC's fabric writes its path into the destination address
 * (micro-SIDs, no SRH) and sends no extension headers, while End.DT6 or the stack would hand MRC behind
 * them to the MRC socket past every check (the QP filter included): a tunnel behind them (`outer`), UDP
 * 4791 behind them, and a chain that leaves the linear data (-1: kilobytes of options) or is longer than
 * MRC_IP6_EXT_MAX (-2), which is nothing legitimate and must not hide either, are dropped: the reason,
 * or 0 for other traffic with extension headers (MLD's hop-by-hop, an ICMPv6 probe with options). */
static __always_inline __u32 ext_verdict(__u8 *ip6, const __u8 *end, int outer)
{
	__u8 *p = ip6 + MRC_IP6_HLEN;
	int last = mrc_ip6_skip_ext(&p, ip6[6], end);
	if (last < 0 || (outer && last == MRC_NH_IPV6))
		return MRC_DROP_BAD_IP;
	if (last == MRC_NH_UDP) {
		if (p + MRC_UDP_HLEN > end)
			return MRC_DROP_TRUNCATED;
		if (mrc_be16(p + 2) == MRC_UDP_PORT)
			return MRC_DROP_BAD_IP;
	}
	return 0;
}

int host_ingress(struct xdp_md *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;
	__u32 len = bpf_xdp_get_buff_len(ctx);
	if (data + MRC_ETH_HLEN > end)
		return drop(0, MRC_DROP_TRUNCATED, len);

	__u64 mac = 0;
	__builtin_memcpy(&mac, data, 6);
	struct mrc_in_port *pi = mrc_in_ports.lookup(&mac);
	__u32 port = pi ? mrc_id(pi->port_id, MRC_MAX_PORTS) : 0;
	__u32 flags = pi ? pi->flags : 0;
	__u32 host = pi ? pi->host_id : 0;

	/* 802.1Q / 802.1ad tags are stepped over: the stack strips a priority tag (VID 0), however many, and a
	 * VLAN device on a real host takes the others, so tagged MRC reaches the socket like untagged MRC and
	 * must meet the same checks. More tags than anything legitimate must not hide what follows them. */
	__u16 proto = mrc_be16(data + 12);
	__u32 l2 = MRC_ETH_HLEN; /* the Ethernet header and its tags */
#pragma unroll
	for (int i = 0; i < MRC_VLAN_MAX; i++) {
		if (proto != MRC_ETH_P_8021Q && proto != MRC_ETH_P_8021AD)
			break;
		if (data + l2 + MRC_VLAN_HLEN > end)
			return drop(port, MRC_DROP_TRUNCATED, len);
		proto = mrc_be16(data + l2 + 2);
		l2 += MRC_VLAN_HLEN;
	}
	if (proto == MRC_ETH_P_8021Q || proto == MRC_ETH_P_8021AD)
		return drop(port, MRC_DROP_BAD_IP, len);
	if (proto != MRC_ETH_P_IPV6)
		return XDP_PASS;
	l2 &= 0x3F; /* at most 14 + 4 * MRC_VLAN_MAX: a bound the verifier sees */
	int tagged = l2 != MRC_ETH_HLEN;
	__u8 *outer = data + l2;
	if (outer + MRC_IP6_HLEN > end)
		return drop(port, MRC_DROP_TRUNCATED, len);
	if (mrc_ip6_version(outer) != 6)
		return drop(port, MRC_DROP_BAD_IP, len);
	if (mrc_ip6_is_ext(outer[6])) {
		__u32 why = ext_verdict(outer, end, 1);
		return why ? drop(port, why, len) : XDP_PASS;
	}
	/* MRC on the fabric is tunnelled (IPv6-in-IPv6). UDP 4791 straight to the host is not its fabric's,
	 * but addressed to the MRC address it reaches the MRC socket all the same: it is checked as MRC,
	 * with the outer header as its only one. */
	__u8 *inner = outer;
	int tunnelled = outer[6] == MRC_NH_IPV6;
	if (tunnelled) {
		inner = outer + MRC_IP6_HLEN;
		if (inner + MRC_IP6_HLEN > end)
			return drop(port, MRC_DROP_TRUNCATED, len);
		if (mrc_ip6_version(inner) != 6)
			return drop(port, MRC_DROP_BAD_IP, len);
		if (mrc_ip6_is_ext(inner[6])) { /* likewise inside the tunnel */
			__u32 why = ext_verdict(inner, end, 0);
			return why ? drop(port, why, len) : XDP_PASS;
		}
	}
	if (inner[6] != MRC_NH_UDP)
		return XDP_PASS; /* e.g. an ICMPv6 probe along a path, or kernel traffic */
	__u8 *udp = inner + MRC_IP6_HLEN;
	if (udp + MRC_UDP_HLEN > end)
		return drop(port, MRC_DROP_TRUNCATED, len);
	if (mrc_be16(udp + 2) != MRC_UDP_PORT)
		return XDP_PASS;

	/* MRC from here on. Its fabric sends it to a port's own MAC; to any other (broadcast, multicast, a
	 * stale or foreign unicast) no port can be named, so no port's QP filter or decapsulation would apply,
	 * while the stack takes a group-addressed frame and End.DT6 delivers it to the MRC socket: dropped,
	 * under port id 0 ("unknown"; counters.unknown_port_rx_drops reads it). */
	if (!pi)
		return drop(0, MRC_DROP_BAD_IP, len);
	/* every length must agree with the frame */
	__u32 avail = len - l2 - MRC_IP6_HLEN; /* the UDP header is in the frame */
	__u32 outer_plen = mrc_be16(outer + 4);
	if (outer_plen > avail)
		return drop(port, MRC_DROP_TRUNCATED, len);
	if (outer_plen != avail ||
	    (tunnelled && mrc_be16(inner + 4) + MRC_IP6_HLEN != outer_plen))
		return drop(port, MRC_DROP_BAD_LENGTH, len);
	__u32 udp_len = mrc_be16(udp + 4);
	if (udp_len != mrc_be16(inner + 4) || udp_len < MRC_UDP_HLEN)
		return drop(port, MRC_DROP_BAD_LENGTH, len);

	__u8 *bth = udp + MRC_UDP_HLEN;
	if (bth + MRC_BTH_LEN > end)
		return drop(port, MRC_DROP_TRUNCATED, len);
	if (bth[1] & 0x0F)
		return drop(port, MRC_DROP_BAD_VERSION, len); /* BTH TVer */
	int off = mrc_mxh_off(bth[0]);
	if (off < 0)
		return drop(port, MRC_DROP_BAD_OPCODE, len);
	__u8 *mxh = bth + off;
	if (mxh + MRC_MXH_LEN > end)
		return drop(port, MRC_DROP_TRUNCATED, len);
	if (mxh[0] != MRC_MXH_VERSION)
		return drop(port, MRC_DROP_BAD_VERSION, len);
	__u32 hl = off + MRC_MXH_LEN;
	__u32 mrc_len = udp_len - MRC_UDP_HLEN;
	__u8 mflags = mxh[MRC_MXH_OFF_FLAGS];
	int trimmed = mflags & MRC_MXH_F_TRIMMED;
	if (mrc_is_data(bth[0])) {
		if (trimmed) {
			if (mrc_len != hl)
				return drop(port, MRC_DROP_BAD_LENGTH, len);
		} else {
			__u64 dma = mrc_be32(bth + MRC_BTH_LEN + 12);
			__u64 pad = (bth[1] >> 4) & 3;
			if ((__u64)mrc_len != hl + dma + pad + MRC_ICRC_LEN)
				return drop(port, MRC_DROP_BAD_LENGTH, len);
		}
	} else if (trimmed || mrc_len < hl + MRC_ICRC_LEN || mrc_len > hl + 148 + MRC_ICRC_LEN) {
		return drop(port, MRC_DROP_BAD_LENGTH, len);
	}
	if (flags & MRC_PORT_F_QP_FILTER) {
		struct mrc_qp_key qk = {};
		qk.host_id = host;
		qk.qpn = mrc_be24(bth + 5);
		if (!mrc_allowed_qps.lookup(&qk))
			return drop(port, MRC_DROP_FOREIGN_QPN, len);
	}

	__u32 ev = mrc_be16(mxh + MRC_MXH_OFF_EV_INDEX) & ((1 << MRC_EV_INDEX_BITS) - 1);
	__u32 row = port * MRC_EV_BUCKETS + (ev % MRC_EV_BUCKETS);
	int ce = mrc_ip6_ecn(outer) == MRC_ECN_CE;
	struct mrc_ev_counters *c = mrc_ingress_ev.lookup(&row);
	if (c) {
		c->packets += 1;
		c->bytes += len;
		c->ce += ce;
		c->trimmed += trimmed ? 1 : 0;
	}
	/* RFC 6040: outer CE onto an ECN-capable inner header (a Not-ECT inner stays as it is) */
	if (ce && tunnelled) {
		__u8 iecn = mrc_ip6_ecn(inner);
		if (iecn == MRC_ECN_ECT0 || iecn == MRC_ECN_ECT1)
			mrc_ip6_set_ecn(inner, MRC_ECN_CE);
	}
	/* a tagged frame keeps its tunnel for End.DT6: only an untagged Ethernet header is moved here */
	if ((flags & MRC_PORT_F_XDP_DECAP) && tunnelled && !tagged) {
		__u8 eth[MRC_ETH_HLEN];
		__builtin_memcpy(eth, data, MRC_ETH_HLEN);
		if (bpf_xdp_adjust_head(ctx, MRC_IP6_HLEN))
			return XDP_PASS; /* End.DT6 still decapsulates */
		data = (void *)(long)ctx->data;
		end = (void *)(long)ctx->data_end;
		if (data + MRC_ETH_HLEN > end)
			return XDP_DROP;
		__builtin_memcpy(data, eth, MRC_ETH_HLEN);
	}
	return XDP_PASS;
}
