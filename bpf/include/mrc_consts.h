/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mrc_consts.h - protocol numbers and header sizes the programs use that are not MRC's own (those are
 * in mrc_abi.h). No structs, no maps.
 */
#ifndef MRC_CONSTS_H
#define MRC_CONSTS_H

#define MRC_ETH_HLEN 14
#define MRC_IP6_HLEN 40
#define MRC_UDP_HLEN 8
#define MRC_ETH_P_IPV6 0x86DD
/* 802.1Q and 802.1ad tags, and how many a parser steps over */
#define MRC_ETH_P_8021Q 0x8100
#define MRC_ETH_P_8021AD 0x88A8
#define MRC_VLAN_HLEN 4
#define MRC_VLAN_MAX 4
#define MRC_NH_UDP 17
#define MRC_NH_IPV6 41
/* IPv6 extension headers (RFC 8200 §4) a parser steps over, and how many at most */
#define MRC_NH_HOPOPTS 0
#define MRC_NH_ROUTING 43
#define MRC_NH_FRAGMENT 44
#define MRC_NH_DSTOPTS 60
#define MRC_IP6_EXT_MAX 4

/* Offsets from the start of the frame for IPv6-in-IPv6 (no SRH: one micro-SID container). */
#define MRC_OFF_OUTER MRC_ETH_HLEN
#define MRC_OFF_INNER (MRC_ETH_HLEN + MRC_IP6_HLEN)
#define MRC_OFF_UDP_ENCAP (MRC_OFF_INNER + MRC_IP6_HLEN)
/* Offsets for a plain (not yet encapsulated) packet on the host's MRC device. */
#define MRC_OFF_UDP_PLAIN (MRC_ETH_HLEN + MRC_IP6_HLEN)

/* ECN codepoints (low two bits of the traffic class). */
#define MRC_ECN_NOT_ECT 0
#define MRC_ECN_ECT1 1
#define MRC_ECN_ECT0 2
#define MRC_ECN_CE 3

#define MRC_HOP_LIMIT 64
/* TC_PRIO_CONTROL: the priority trimmed packets leave with. */
#define MRC_PRIO_HIGH 7

#endif /* MRC_CONSTS_H */
