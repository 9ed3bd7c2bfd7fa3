/* SPDX-License-Identifier: GPL-2.0 */
/*
 * host_egress - TC egress (clsact) on the host's MRC device `mrc0` (docs/design.md §5, docs/dataplane.md).
 *
 * The userspace engine sends plain IPv6/UDP 4791 to the peer's MRC address; a policy rule routes it
 * to mrc0, a dummy device. Here each packet's EV index (MXH bytes 2-3) and destination select a path:
 * plane port, MACs, outer source and micro-SID container. The program pushes the outer IPv6 header
 * (flow label = EV index, ECN = ECT(0)), writes UDP source port 0xC000 | EV, rewrites the MACs and
 * redirects the packet to the plane port. Unknown (destination, EV): counted drop, never sent plain.
 * A datagram shorter than its headers say (or whose IPv6/UDP length says more than the packet holds):
 * counted drop (truncated), never sent onto the fabric.
 * Anything that is not UDP 4791 passes (and ends in the dummy device).
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "mrc_abi.h"
#include "mrc_consts.h"
#include "mrc_metrics.h"
#include "mrc_parse.h"

/* (host namespace cookie, destination GID, EV index) -> plane port, MACs, outer addresses */
BPF_HASH(mrc_paths, struct mrc_path_key, struct mrc_path, MRC_PATHS_MAX);
/* host namespace cookie -> host id (row of mrc_egress_drops) */
BPF_HASH(mrc_hosts, __u64, __u32, MRC_MAX_HOSTS);
/* per port id: packets and bytes encapsulated and redirected to that plane port */
BPF_PERCPU_ARRAY(mrc_egress_tx, struct mrc_counter, MRC_MAX_PORTS);
/* per (host id, reason): packets dropped */
BPF_PERCPU_ARRAY(mrc_egress_drops, struct mrc_counter, MRC_MAX_HOSTS * MRC_DROP_MAX);

#define HDR_NEED (MRC_OFF_UDP_PLAIN + MRC_UDP_HLEN + MRC_MXH_OFF_WRITE_IMM + MRC_MXH_LEN)

static __always_inline int drop(__u64 cookie, __u32 reason, __u32 len)
{
	__u32 *hid = mrc_hosts.lookup(&cookie);
	__u32 host = hid ? mrc_id(*hid, MRC_MAX_HOSTS) : 0;
	__u32 row = host * MRC_DROP_MAX + reason;
	mrc_add(mrc_egress_drops.lookup(&row), len);
	return TC_ACT_SHOT;
}

int host_egress(struct __sk_buff *skb)
{
	__u32 len = skb->len;
	if (skb->protocol != bpf_htons(MRC_ETH_P_IPV6))
		return TC_ACT_OK;
	/* make the headers linear (the largest header set, or the whole packet if shorter) */
	bpf_skb_pull_data(skb, len < HDR_NEED ? len : HDR_NEED);
	__u8 *data = (void *)(long)skb->data;
	__u8 *end = (void *)(long)skb->data_end;
	__u8 *ip6 = data + MRC_ETH_HLEN;
	__u8 *udp = ip6 + MRC_IP6_HLEN;
	if (udp + MRC_UDP_HLEN > end)
		return TC_ACT_OK;
	if (ip6[6] != MRC_NH_UDP || mrc_be16(udp + 2) != MRC_UDP_PORT)
		return TC_ACT_OK; /* not MRC: untouched */

	__u64 cookie = bpf_get_netns_cookie(skb);
	/* The headers below are read from the packet; the datagram's own lengths must hold them too. Neither
	 * length may say more than the packet holds (len >= 62 here: the linear part holds the UDP header). */
	__u32 ip_plen = mrc_be16(ip6 + 4);
	__u32 udp_len = mrc_be16(udp + 4);
	if (ip_plen > len - MRC_ETH_HLEN - MRC_IP6_HLEN || udp_len > ip_plen)
		return drop(cookie, MRC_DROP_TRUNCATED, len);
	__u8 *bth = udp + MRC_UDP_HLEN;
	if (bth + MRC_BTH_LEN > end)
		return drop(cookie, MRC_DROP_TRUNCATED, len);
	int off = mrc_mxh_off(bth[0]);
	if (off < 0)
		return drop(cookie, MRC_DROP_BAD_OPCODE, len);
	__u8 *mxh = bth + off;
	if (mxh + MRC_MXH_LEN > end)
		return drop(cookie, MRC_DROP_TRUNCATED, len);
	if (mxh[0] != MRC_MXH_VERSION)
		return drop(cookie, MRC_DROP_BAD_VERSION, len);
	/* A datagram shorter than what its headers announce (MRC headers, a data packet's payload of RETH's
	 * DMA length and its pad, the ICRC) was encapsulated and sent, routed on an EV index that could lie
	 * past its end, for the receiver to drop: it never leaves the host. */
	__u64 need = MRC_UDP_HLEN + off + MRC_MXH_LEN + MRC_ICRC_LEN;
	if (mrc_is_data(bth[0]))
		need += (__u64)mrc_be32(bth + MRC_BTH_LEN + 12) + ((bth[1] >> 4) & 3);
	if ((__u64)udp_len < need)
		return drop(cookie, MRC_DROP_TRUNCATED, len);
	__u32 ev = mrc_be16(mxh + MRC_MXH_OFF_EV_INDEX);
	if (ev >> MRC_EV_INDEX_BITS) /* no EV has an index that wide: no path (it used to alias a lower one) */
		return drop(cookie, MRC_DROP_NO_PATH, len);

	struct mrc_path_key key = {};
	key.netns_cookie = cookie;
	__builtin_memcpy(key.dst, ip6 + 24, 16);
	key.ev_index = ev;
	struct mrc_path *p = mrc_paths.lookup(&key);
	if (!p)
		return drop(cookie, MRC_DROP_NO_PATH, len);

	/* UDP source port = 0xC000 | EV; a non-zero checksum is kept valid */
	__u16 old_sport = *(__u16 *)udp;
	__u16 new_sport = bpf_htons(MRC_EV_SPORT_BASE | ev);
	__u16 csum = *(__u16 *)(udp + 6);
	if (old_sport != new_sport) {
		if (csum)
			bpf_l4_csum_replace(skb, MRC_OFF_UDP_PLAIN + 6, old_sport, new_sport,
					    sizeof(__u16) | BPF_F_MARK_MANGLED_0);
		bpf_skb_store_bytes(skb, MRC_OFF_UDP_PLAIN, &new_sport, 2, 0);
	}

	/* outer IPv6: version 6, ECT(0), flow label = EV index, next header IPv6 */
	__u8 outer[MRC_IP6_HLEN];
	__u32 inner_len = len - MRC_ETH_HLEN;
	__u32 vtf = (6u << 28) | ((__u32)MRC_ECN_ECT0 << 20) | (ev & 0xFFFFF);
	*(__u32 *)outer = bpf_htonl(vtf);
	*(__u16 *)(outer + 4) = bpf_htons(inner_len);
	outer[6] = MRC_NH_IPV6;
	outer[7] = MRC_HOP_LIMIT;
	__builtin_memcpy(outer + 8, p->src, 16);
	__builtin_memcpy(outer + 24, p->container, 16);
	__u8 macs[12];
	__builtin_memcpy(macs, p->dmac, 6);
	__builtin_memcpy(macs + 6, p->smac, 6);
	__u32 ifindex = p->ifindex;
	__u32 port = mrc_id(p->port_id, MRC_MAX_PORTS);

	/* No BPF_F_ADJ_ROOM_ENCAP_* flags: they mark the skb as encapsulated (for GSO and checksum offload,
	 * which MRC datagrams never use), and bpf_skb_change_tail() refuses encapsulated skbs, so a switch
	 * downstream (switch_port) could not trim them. */
	if (bpf_skb_adjust_room(skb, MRC_IP6_HLEN, BPF_ADJ_ROOM_MAC, 0))
		return drop(cookie, MRC_DROP_ENCAP_FAILED, len);
	if (bpf_skb_store_bytes(skb, MRC_OFF_OUTER, outer, MRC_IP6_HLEN, 0) ||
	    bpf_skb_store_bytes(skb, 0, macs, 12, 0))
		return drop(cookie, MRC_DROP_ENCAP_FAILED, len);
	mrc_add(mrc_egress_tx.lookup(&port), skb->len);
	return bpf_redirect(ifindex, 0);
}
