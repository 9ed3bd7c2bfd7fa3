/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mrc_abi.h - the one header whose numbers and structs Python also sees.
 *
 * Everything here mirrors mrc/wire/consts.py (wire format, DESIGN.md §3); tests/unit/test_abi.py parses
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

#endif /* MRC_ABI_H */
