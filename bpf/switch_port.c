/* SPDX-License-Identifier: GPL-2.0 */
/*
 * switch_port - TC egress (clsact) on fabric ports, before the TBF qdisc (docs/design.md §5).
 *
 * The kernel here has no netem, RED or fq_codel: this program is the switch's AQM and fault injector.
 * Per port, keyed by the port's own MAC address, which is the source of every frame it sends (the
 * namespace cookie is no key here: a forwarded skb may still carry the sending host's socket):
 *   - faults: blackhole, or drop with a probability; optionally only packets of one EV (outer flow label);
 *   - a virtual queue: a token bucket drained at the port's rate. Above ecn_k queued bytes an ECN-capable
 *     packet is marked CE; above trim_t an MRC data packet (of MRC's versions: see trimmable()) is cut to
 *     the end of MXH (TRIMMED and PRIO set, outer and inner IPv6 payload lengths and UDP length fixed,
 *     UDP checksum 0, high skb priority); a packet (trimmed or not) that does not fit in buffer is
 *     dropped. Order of load: marks, then trims, then drops (trimmed headers overflow the buffer only far
 *     beyond the trimming threshold).
 * One action per packet, counted per (port, action). Ports without configuration pass everything.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "mrc_abi.h"
#include "mrc_consts.h"
#include "mrc_metrics.h"
#include "mrc_parse.h"

/* the port's MAC (low 48 bits, memory order) -> port id and virtual-queue configuration */
BPF_HASH(mrc_sw_ports, __u64, struct mrc_sw_port, MRC_MAX_PORTS);
/* port id -> virtual queue state */
BPF_ARRAY(mrc_sw_vq, struct mrc_vq, MRC_MAX_PORTS);
/* port id -> fault (absent: no fault) */
BPF_HASH(mrc_sw_faults, __u32, struct mrc_fault, MRC_MAX_PORTS);
/* per (port id, action): packets and bytes */
BPF_PERCPU_ARRAY(mrc_sw_actions, struct mrc_counter, MRC_MAX_PORTS * MRC_SW_ACT_MAX);

#define NEED (MRC_OFF_UDP_ENCAP + MRC_UDP_HLEN + MRC_MXH_OFF_WRITE_IMM + MRC_MXH_LEN)

static __always_inline int act(__u32 port, __u32 action, __u32 len)
{
	__u32 row = port * MRC_SW_ACT_MAX + action;
	mrc_add(mrc_sw_actions.lookup(&row), len);
	return action >= MRC_SW_DROP_BUFFER ? TC_ACT_SHOT : TC_ACT_OK;
}

/* Header length (BTH to end of MXH) if this is an untrimmed MRC data packet in IPv6-in-IPv6, else 0.
 * MRC's, by every version field (IPv6 6 outside and inside, BTH TVer 0, MXH version 1): where a trim
 * cuts and which flag bits it sets are version 1's layout, so a packet of another version (or not IPv6)
 * is never cut; it is forwarded like any other traffic and the receiver's host_ingress drops it by
 * reason (bad_version, bad_ip). */
static __always_inline __u32 trimmable(struct __sk_buff *skb)
{
	__u8 *data = (void *)(long)skb->data;
	__u8 *end = (void *)(long)skb->data_end;
	__u8 *outer = data + MRC_ETH_HLEN;
	__u8 *inner = outer + MRC_IP6_HLEN;
	__u8 *udp = inner + MRC_IP6_HLEN;
	__u8 *bth = udp + MRC_UDP_HLEN;
	if (bth + MRC_BTH_LEN > end)
		return 0;
	if (mrc_ip6_version(outer) != 6 || mrc_ip6_version(inner) != 6)
		return 0;
	if (outer[6] != MRC_NH_IPV6 || inner[6] != MRC_NH_UDP || mrc_be16(udp + 2) != MRC_UDP_PORT)
		return 0;
	if (!mrc_is_data(bth[0]) || (bth[1] & 0x0F)) /* BTH TVer */
		return 0;
	int off = mrc_mxh_off(bth[0]);
	if (off < 0)
		return 0;
	__u8 *mxh = bth + off;
	if (mxh + MRC_MXH_LEN > end)
		return 0;
	if (mxh[0] != MRC_MXH_VERSION || (mxh[MRC_MXH_OFF_FLAGS] & MRC_MXH_F_TRIMMED))
		return 0;
	return off + MRC_MXH_LEN;
}

static __always_inline int trim(struct __sk_buff *skb, __u32 hl)
{
	__u32 keep = MRC_OFF_UDP_ENCAP + MRC_UDP_HLEN + hl;
	if (keep >= skb->len)
		return 0;
	if (bpf_skb_change_tail(skb, keep, 0))
		return -1;
	__u16 outer_plen = bpf_htons(keep - MRC_ETH_HLEN - MRC_IP6_HLEN);
	__u16 inner_plen = bpf_htons(keep - MRC_OFF_UDP_ENCAP);
	__u16 zero = 0;
	if (bpf_skb_store_bytes(skb, MRC_OFF_OUTER + 4, &outer_plen, 2, 0) ||
	    bpf_skb_store_bytes(skb, MRC_OFF_INNER + 4, &inner_plen, 2, 0) ||
	    bpf_skb_store_bytes(skb, MRC_OFF_UDP_ENCAP + 4, &inner_plen, 2, 0) ||
	    bpf_skb_store_bytes(skb, MRC_OFF_UDP_ENCAP + 6, &zero, 2, 0))
		return -1;
	__u32 foff = MRC_OFF_UDP_ENCAP + MRC_UDP_HLEN + hl - MRC_MXH_LEN + MRC_MXH_OFF_FLAGS;
	__u8 f = 0;
	if (bpf_skb_load_bytes(skb, foff, &f, 1))
		return -1;
	f |= MRC_MXH_F_TRIMMED | MRC_MXH_F_PRIO;
	if (bpf_skb_store_bytes(skb, foff, &f, 1, 0))
		return -1;
	skb->priority = MRC_PRIO_HIGH;
	return 0;
}

int switch_port(struct __sk_buff *skb)
{
	__u8 *d0 = (void *)(long)skb->data;
	__u8 *e0 = (void *)(long)skb->data_end;
	if (d0 + MRC_ETH_HLEN > e0)
		return TC_ACT_OK;
	__u64 mac = 0;
	__builtin_memcpy(&mac, d0 + 6, 6);
	struct mrc_sw_port *cfg = mrc_sw_ports.lookup(&mac);
	if (!cfg)
		return TC_ACT_OK;
	__u32 port = mrc_id(cfg->port_id, MRC_MAX_PORTS);
	__u32 len = skb->len;
	if (skb->protocol != bpf_htons(MRC_ETH_P_IPV6))
		return act(port, MRC_SW_FORWARD, len);
	bpf_skb_pull_data(skb, len < NEED ? len : NEED);
	__u8 *data = (void *)(long)skb->data;
	__u8 *end = (void *)(long)skb->data_end;
	__u8 *outer = data + MRC_ETH_HLEN;
	if (outer + MRC_IP6_HLEN > end)
		return act(port, MRC_SW_FORWARD, len);
	__u32 ev = mrc_ip6_flow_label(outer);
	__u8 ecn = mrc_ip6_ecn(outer);

	struct mrc_fault *f = mrc_sw_faults.lookup(&port);
	if (f && (f->ev_index == MRC_FAULT_ANY_EV || f->ev_index == ev)) {
		if (f->blackhole)
			return act(port, MRC_SW_DROP_BLACKHOLE, len);
		if (f->drop_prob && bpf_get_prandom_u32() < f->drop_prob)
			return act(port, MRC_SW_DROP_FAULT, len);
	}
	if (!cfg->rate_bps)
		return act(port, MRC_SW_FORWARD, len);

	struct mrc_vq *q = mrc_sw_vq.lookup(&port);
	if (!q)
		return act(port, MRC_SW_FORWARD, len);
	/* drain since the last packet (races between CPUs only blur the queue by a packet or two) */
	__u64 now = bpf_ktime_get_ns();
	__u64 dt = now - q->last_ns;
	if (dt > 1000000000ull)
		dt = 1000000000ull;
	__u64 drained = dt * (cfg->rate_bps / 8) / 1000000000ull;
	__u64 backlog = q->backlog > drained ? q->backlog - drained : 0;
	q->last_ns = now;
	__u32 action = MRC_SW_FORWARD;
	/* above T an MRC data packet is cut to its headers first: only what still does not fit is dropped */
	if (backlog > cfg->trim_t) {
		__u32 hl = trimmable(skb);
		if (hl && trim(skb, hl) == 0 && skb->len < len) {
			action = MRC_SW_TRIM;
			len = skb->len;
		}
	}
	if (backlog + len > cfg->buffer) {
		q->backlog = backlog;
		return act(port, MRC_SW_DROP_BUFFER, len);
	}
	if (action == MRC_SW_FORWARD && backlog > cfg->ecn_k && ecn != MRC_ECN_NOT_ECT) {
		data = (void *)(long)skb->data;
		end = (void *)(long)skb->data_end;
		outer = data + MRC_ETH_HLEN;
		if (outer + MRC_IP6_HLEN <= end) {
			mrc_ip6_set_ecn(outer, MRC_ECN_CE);
			action = MRC_SW_ECN_MARK;
		}
	}
	q->backlog = backlog + len;
	return act(port, action, len);
}
