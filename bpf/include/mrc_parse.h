/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mrc_parse.h - bounds-checked reading of MRC headers, shared by the XDP and TC programs (they pass
 * data/data_end, which both contexts have). Nothing here trusts a length field.
 */
#ifndef MRC_PARSE_H
#define MRC_PARSE_H

#include "mrc_abi.h"
#include "mrc_consts.h"

/* Offset of MXH from the start of BTH for a known opcode, or -1 (unknown opcode). */
static __always_inline int mrc_mxh_off(__u8 opcode)
{
	if (opcode == MRC_OP_WRITE_ONLY)
		return MRC_MXH_OFF_WRITE;
	if (opcode == MRC_OP_WRITE_ONLY_IMM)
		return MRC_MXH_OFF_WRITE_IMM;
	if (opcode >= MRC_OP_SACK && opcode <= MRC_OP_PORT_STATUS)
		return MRC_MXH_OFF_CONTROL;
	return -1;
}

static __always_inline int mrc_is_data(__u8 opcode)
{
	return opcode == MRC_OP_WRITE_ONLY || opcode == MRC_OP_WRITE_ONLY_IMM;
}

/* Big-endian loads from byte pointers the caller has bounds-checked. */
static __always_inline __u16 mrc_be16(const __u8 *p)
{
	return ((__u16)p[0] << 8) | p[1];
}

static __always_inline __u32 mrc_be24(const __u8 *p)
{
	return ((__u32)p[0] << 16) | ((__u32)p[1] << 8) | p[2];
}

static __always_inline __u32 mrc_be32(const __u8 *p)
{
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
}

/* The IPv6 version/traffic class/flow label word, split. */
static __always_inline int mrc_ip6_is_ext(__u8 nh)
{
	return nh == MRC_NH_HOPOPTS || nh == MRC_NH_ROUTING || nh == MRC_NH_FRAGMENT || nh == MRC_NH_DSTOPTS;
}

/* Step over the IPv6 extension headers at *p (the first one's type `nh`): the upper-layer next header,
 * *p moved past them; -1 when one is cut by the end of the linear data, -2 after MRC_IP6_EXT_MAX of
 * them (a chain longer than anything legitimate, which must not hide what follows it). */
static __always_inline int mrc_ip6_skip_ext(__u8 **p, __u8 nh, const __u8 *end)
{
	__u8 *q = *p;
#pragma unroll
	for (int i = 0; i < MRC_IP6_EXT_MAX; i++) {
		if (!mrc_ip6_is_ext(nh)) {
			*p = q;
			return nh;
		}
		if (q + 8 > end)
			return -1;
		__u8 next = q[0];
		__u32 hl = nh == MRC_NH_FRAGMENT ? 8 : ((__u32)q[1] + 1) * 8;
		q += hl;
		nh = next;
	}
	if (mrc_ip6_is_ext(nh))
		return -2;
	*p = q;
	return nh;
}

static __always_inline __u8 mrc_ip6_version(const __u8 *ip6)
{
	return ip6[0] >> 4;
}

static __always_inline __u8 mrc_ip6_ecn(const __u8 *ip6)
{
	return (ip6[1] >> 4) & 3;
}

static __always_inline void mrc_ip6_set_ecn(__u8 *ip6, __u8 ecn)
{
	ip6[1] = (ip6[1] & 0xCF) | ((ecn & 3) << 4);
}

static __always_inline __u32 mrc_ip6_flow_label(const __u8 *ip6)
{
	return ((__u32)(ip6[1] & 0x0F) << 16) | ((__u32)ip6[2] << 8) | ip6[3];
}

#endif /* MRC_PARSE_H */
