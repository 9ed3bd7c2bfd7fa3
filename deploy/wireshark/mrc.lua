-- mrc.lua: Wireshark/tshark dissector for the MRC transport (Multipath Reliable Connection).
--
-- Wire format: docs/design.md §3 and mrc/wire/{bth,mxh,control}.py (the source of truth). MRC packets are
-- RoCEv2 (UDP 4791) with standard InfiniBand BTH/RETH/ImmDt, followed by our extension header (MXH)
-- and, on control opcodes 0xC0-0xC4, a control body. This script chains onto UDP port 4791: it first
-- calls the dissector that was registered there (Wireshark's InfiniBand/RRoCE dissector, which keeps
-- decoding BTH, RETH, ImmDt and the ICRC exactly as before) and then adds an "MRC" tree with MXH and
-- the control body. Works on IPv6-in-IPv6 fabric frames (the outer header is decoded by IPv6 itself).
--
-- Use:     tshark -X lua_script:deploy/wireshark/mrc.lua -r capture.pcapng -O mrc  (pcap or pcapng)
--          or copy to ~/.local/lib/wireshark/plugins/ (or ~/.config/wireshark/plugins/ on older builds)
-- As root, Debian's init.lua has run_user_scripts_when_superuser = true, so -X lua_script works.
--
-- MXH offset from the start of BTH: 0x0A WRITE Only 12+16 = 28; 0x0B WRITE Only w/ Immediate
-- 12+16+4 = 32; control 0xC0-0xC4: 12. The body of a control packet follows MXH (24 bytes) and ends
-- 4 bytes (the ICRC) before the end of the UDP payload.
--
-- Fields (filter name, type, meaning):
--   mrc.opcode                       uint8   BTH opcode, named (WRITE, WRITE_IMM, SACK, NACK, ...)
--   mrc.mxh                          bytes   the whole 24-byte MXH
--   mrc.mxh.version                  uint8   MXH version (1)
--   mrc.mxh.flags                    uint8   flags byte; bits below
--   mrc.mxh.flags.trimmed            bool    0x01 payload trimmed by a switch (ICRC not checked)
--   mrc.mxh.flags.retx               bool    0x02 retransmission
--   mrc.mxh.flags.first              bool    0x04 first packet of its message
--   mrc.mxh.flags.last               bool    0x08 last packet of its message
--   mrc.mxh.flags.ack_req_now        bool    0x10 acknowledge at once
--   mrc.mxh.flags.prio               bool    0x20 sent at high priority (set with TRIMMED)
--   mrc.mxh.ev_index                 uint16  entropy value index the packet was sprayed on
--   mrc.mxh.msn                      uint32  message sequence number
--   mrc.mxh.msg_len                  uint32  bytes in the whole message
--   mrc.mxh.msg_offset               uint32  offset of this packet's payload in the message
--   mrc.mxh.timestamp                uint64  sender clock at send time, ns
--   mrc.payload_len                  uint32  payload bytes after MXH, pad excluded (data; 0 if trimmed),
--                                            from the packet's length on the wire (a 4096-byte WRITE
--                                            cut by the capture's snaplen still shows 4096)
--   mrc.truncated                    bool    (generated) the capture kept fewer bytes than the packet
--                                            had (snaplen, `editcap -s`): headers are decoded, lengths
--                                            are the on-the-wire ones, the ICRC cannot be checked
--   mrc.sack.cum_psn                 uint32  (24 bits) lowest PSN not yet received
--   mrc.sack.echo_ev_index           uint16  EV index of the packet that triggered the SACK
--   mrc.sack.echo_flags              uint8   bits: mrc.sack.echo_flags.ecn_ce (0x01), .retx (0x02),
--                                            .duplicate (0x04)
--   mrc.sack.words                   uint8   64-bit bitmap words that follow (1..16)
--   mrc.sack.echo_timestamp          uint64  MXH timestamp of the triggering packet, ns
--   mrc.sack.service_time            uint32  ns the receiver held the triggering packet
--   mrc.sack.bitmap                  bytes   bit i (byte i//8, LSB first) <=> PSN cum_psn+1+i received
--   mrc.sack.acked_psn               uint32  (generated, repeated) each PSN the bitmap reports received
--   mrc.nack.code                    uint8   TRIMMED 1, OUT_OF_WINDOW 2, BAD_RKEY 3, BAD_VA 4,
--                                            BAD_LENGTH 5, NO_RECV_BUFFER 6, BAD_QPN 7
--   mrc.nack.echo_ev_index           uint16  EV index the refused packet arrived on
--   mrc.nack.cum_psn                 uint32  (24 bits) as in SACK
--   mrc.nack.echo_timestamp          uint64  MXH timestamp of the refused packet, ns
--   mrc.probe.request_id             uint16  probe request ID
--   mrc.probe.reply_qpn              uint32  (24 bits) QPN the reply is addressed to
--   mrc.probe_reply.request_id       uint16  copied from the probe
--   mrc.probe_reply.echo_ev_index    uint16  MXH EV index of the probe
--   mrc.probe_reply.flags            uint8   bit mrc.probe_reply.flags.service_time_valid (0x01)
--   mrc.probe_reply.echo_timestamp   uint64  MXH timestamp of the probe, ns
--   mrc.probe_reply.service_time     uint32  ns between probe arrival and reply
--   mrc.port_status.request_id       uint16
--   mrc.port_status.port             uint8   the sender's plane port
--   mrc.port_status.state            uint8   DOWN 0, UP 1
--   mrc.port_status.epoch            uint32  increases with every change
--   mrc.icrc                         uint32  the trailing ICRC of a control packet, as displayed by
--                                            the InfiniBand dissector for data packets
--   mrc.icrc.status                  uint8   ICRC verified by this script, every packet: 0 good, 1 bad,
--                                            2 not checked (trimmed: no ICRC), 3 not checked (the
--                                            capture did not keep the whole packet), 4 not checked
--                                            (no inner IPv6 header found, or the check is switched off)
-- Expert infos: mrc.expert.trimmed (note), mrc.expert.malformed (error: a packet shorter on the wire
-- than its headers or lengths say, bad version, and every other rejection of mrc.wire.parse: TVer,
-- EV index, PadCnt on a control packet, DMA length against the packet and the message, a NACK code or
-- PORT_STATUS state outside its values, a TRIMMED packet longer than its headers), mrc.expert.bad_icrc
-- (error). A packet the
-- capture's snaplen cut is not malformed: it gets mrc.truncated and a "[cut by snaplen]" in Info.
--
-- UDP checksum 0: RoCEv2 senders put 0 in the UDP checksum over IPv6 (as RFC 6935/6936 allow for
-- tunnels; the ICRC, checked above, covers the packet end to end), which Wireshark's UDP dissector
-- flags as an Error "Illegal checksum value (0)" on every packet. Loading this script therefore sets
-- the UDP preference udp.ignore_ipv6_zero_checksum to TRUE (it cannot be set for port 4791 alone);
-- `-o udp.ignore_ipv6_zero_checksum:FALSE` on the command line, or the preference in the GUI, puts it
-- back. MRC packets say so in their tree ("UDP checksum 0: ...") either way. Set the MRC preference
-- mrc.check_icrc to FALSE to skip the ICRC check (a CRC-32 in Lua, about 4 KiB per data packet).

local MXH_LEN = 24
local ICRC_LEN = 4
local MAX_PAYLOAD = 8192 -- mrc.wire.consts.MAX_PAYLOAD: the largest DMA length of a data packet
local ROCEV2_PORT = 4791

local OPCODES = {
    [0x0A] = "WRITE", [0x0B] = "WRITE_IMM",
    [0xC0] = "SACK", [0xC1] = "NACK", [0xC2] = "PROBE", [0xC3] = "PROBE_REPLY", [0xC4] = "PORT_STATUS",
}
-- Bytes from BTH to MXH per opcode.
local MXH_OFFSET = {
    [0x0A] = 12 + 16, [0x0B] = 12 + 16 + 4,
    [0xC0] = 12, [0xC1] = 12, [0xC2] = 12, [0xC3] = 12, [0xC4] = 12,
}
-- Fixed body sizes of the control packets (SACK adds 8 bytes per bitmap word to its 20).
local BODY_LEN = { [0xC1] = 16, [0xC2] = 8, [0xC3] = 20, [0xC4] = 8 }
local SACK_FIXED_LEN = 20
local NACK_CODES = {
    [1] = "TRIMMED", [2] = "OUT_OF_WINDOW", [3] = "BAD_RKEY", [4] = "BAD_VA", [5] = "BAD_LENGTH",
    [6] = "NO_RECV_BUFFER", [7] = "BAD_QPN",
}
local PORT_STATES = { [0] = "DOWN", [1] = "UP" }
local ICRC_GOOD, ICRC_BAD, ICRC_TRIMMED, ICRC_TRUNCATED, ICRC_UNCHECKED = 0, 1, 2, 3, 4
local ICRC_STATUS = {
    [ICRC_GOOD] = "Good", [ICRC_BAD] = "Bad", [ICRC_TRIMMED] = "Not checked (trimmed: no ICRC)",
    [ICRC_TRUNCATED] = "Not checked (not all of the packet was captured)",
    [ICRC_UNCHECKED] = "Not checked",
}
local MXH_FLAG_NAMES = {
    { 0x01, "TRIMMED" }, { 0x02, "RETX" }, { 0x04, "FIRST" }, { 0x08, "LAST" },
    { 0x10, "ACK_REQ_NOW" }, { 0x20, "PRIO" },
}

local mrc = Proto("mrc", "MRC Transport (Multipath Reliable Connection)")

local pf = {
    opcode = ProtoField.uint8("mrc.opcode", "Opcode", base.HEX, OPCODES),
    mxh = ProtoField.bytes("mrc.mxh", "MRC Extension Header"),
    version = ProtoField.uint8("mrc.mxh.version", "Version", base.DEC),
    flags = ProtoField.uint8("mrc.mxh.flags", "Flags", base.HEX),
    f_trimmed = ProtoField.bool("mrc.mxh.flags.trimmed", "Trimmed", 8, nil, 0x01),
    f_retx = ProtoField.bool("mrc.mxh.flags.retx", "Retransmission", 8, nil, 0x02),
    f_first = ProtoField.bool("mrc.mxh.flags.first", "First", 8, nil, 0x04),
    f_last = ProtoField.bool("mrc.mxh.flags.last", "Last", 8, nil, 0x08),
    f_ack_req_now = ProtoField.bool("mrc.mxh.flags.ack_req_now", "Ack request now", 8, nil, 0x10),
    f_prio = ProtoField.bool("mrc.mxh.flags.prio", "Priority", 8, nil, 0x20),
    ev_index = ProtoField.uint16("mrc.mxh.ev_index", "EV index", base.DEC),
    msn = ProtoField.uint32("mrc.mxh.msn", "Message sequence number", base.DEC),
    msg_len = ProtoField.uint32("mrc.mxh.msg_len", "Message length", base.DEC),
    msg_offset = ProtoField.uint32("mrc.mxh.msg_offset", "Message offset", base.DEC),
    timestamp = ProtoField.uint64("mrc.mxh.timestamp", "Timestamp (ns)", base.DEC),
    payload_len = ProtoField.uint32("mrc.payload_len", "Payload length", base.DEC),

    sack_cum_psn = ProtoField.uint32("mrc.sack.cum_psn", "Cumulative PSN", base.DEC, nil, 0x00FFFFFF),
    sack_echo_ev = ProtoField.uint16("mrc.sack.echo_ev_index", "Echo EV index", base.DEC),
    sack_echo_flags = ProtoField.uint8("mrc.sack.echo_flags", "Echo flags", base.HEX),
    sack_ecn_ce = ProtoField.bool("mrc.sack.echo_flags.ecn_ce", "ECN-CE", 8, nil, 0x01),
    sack_retx = ProtoField.bool("mrc.sack.echo_flags.retx", "Retransmission", 8, nil, 0x02),
    sack_dup = ProtoField.bool("mrc.sack.echo_flags.duplicate", "Duplicate", 8, nil, 0x04),
    sack_words = ProtoField.uint8("mrc.sack.words", "Bitmap words", base.DEC),
    sack_echo_ts = ProtoField.uint64("mrc.sack.echo_timestamp", "Echo timestamp (ns)", base.DEC),
    sack_service = ProtoField.uint32("mrc.sack.service_time", "Service time (ns)", base.DEC),
    sack_bitmap = ProtoField.bytes("mrc.sack.bitmap", "Bitmap"),
    sack_acked = ProtoField.uint32("mrc.sack.acked_psn", "Acked PSN", base.DEC),

    nack_code = ProtoField.uint8("mrc.nack.code", "Code", base.DEC, NACK_CODES),
    nack_echo_ev = ProtoField.uint16("mrc.nack.echo_ev_index", "Echo EV index", base.DEC),
    nack_cum_psn = ProtoField.uint32("mrc.nack.cum_psn", "Cumulative PSN", base.DEC, nil, 0x00FFFFFF),
    nack_echo_ts = ProtoField.uint64("mrc.nack.echo_timestamp", "Echo timestamp (ns)", base.DEC),

    probe_rid = ProtoField.uint16("mrc.probe.request_id", "Request ID", base.DEC),
    probe_reply_qpn = ProtoField.uint32("mrc.probe.reply_qpn", "Reply QPN", base.HEX, nil, 0x00FFFFFF),

    pr_rid = ProtoField.uint16("mrc.probe_reply.request_id", "Request ID", base.DEC),
    pr_echo_ev = ProtoField.uint16("mrc.probe_reply.echo_ev_index", "Echo EV index", base.DEC),
    pr_flags = ProtoField.uint8("mrc.probe_reply.flags", "Flags", base.HEX),
    pr_stv = ProtoField.bool("mrc.probe_reply.flags.service_time_valid", "Service time valid", 8, nil, 0x01),
    pr_echo_ts = ProtoField.uint64("mrc.probe_reply.echo_timestamp", "Echo timestamp (ns)", base.DEC),
    pr_service = ProtoField.uint32("mrc.probe_reply.service_time", "Service time (ns)", base.DEC),

    ps_rid = ProtoField.uint16("mrc.port_status.request_id", "Request ID", base.DEC),
    ps_port = ProtoField.uint8("mrc.port_status.port", "Port", base.DEC),
    ps_state = ProtoField.uint8("mrc.port_status.state", "State", base.DEC, PORT_STATES),
    ps_epoch = ProtoField.uint32("mrc.port_status.epoch", "Epoch", base.DEC),

    icrc = ProtoField.uint32("mrc.icrc", "Invariant CRC", base.HEX),
    icrc_status = ProtoField.uint8("mrc.icrc.status", "ICRC status", base.DEC, ICRC_STATUS),
    truncated = ProtoField.bool("mrc.truncated", "Cut by the capture's snaplen"),
}
local field_list = {}
for _, f in pairs(pf) do field_list[#field_list + 1] = f end
mrc.fields = field_list

local ex_trimmed = ProtoExpert.new("mrc.expert.trimmed", "Payload trimmed in the fabric",
    expert.group.SEQUENCE, expert.severity.NOTE)
local ex_malformed = ProtoExpert.new("mrc.expert.malformed", "Malformed MRC packet",
    expert.group.MALFORMED, expert.severity.ERROR)
local ex_bad_icrc = ProtoExpert.new("mrc.expert.bad_icrc", "ICRC mismatch",
    expert.group.CHECKSUM, expert.severity.ERROR)
mrc.experts = { ex_trimmed, ex_malformed, ex_bad_icrc }

mrc.prefs.check_icrc = Pref.bool("Check the ICRC", true,
    "Verify the RoCEv2 invariant CRC of every packet (a CRC-32 computed in Lua)")

-- See the header: RoCEv2's zero UDP checksum over IPv6 is not an error. The user's own choice
-- (-o or the preferences file, applied after scripts load) still wins.
if set_preference ~= nil and get_preference ~= nil then
    pcall(function()
        if get_preference("udp.ignore_ipv6_zero_checksum") == false then
            set_preference("udp.ignore_ipv6_zero_checksum", true)
        end
    end)
end

-- ---------------------------------------------------------------------------------------- ICRC
-- IEEE CRC-32 (zlib's), table-driven; the ICRC as mrc/wire/icrc.py computes it: 8 bytes 0xFF, the
-- inner IPv6 header with Traffic Class, Flow Label, Hop Limit all ones, the UDP header with checksum
-- 0xFFFF, BTH with byte 4 0xFF, the rest up to the ICRC; stored least significant byte first.
local CRC_TABLE = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if bit32.band(c, 1) ~= 0 then
            c = bit32.bxor(0xEDB88320, bit32.rshift(c, 1))
        else
            c = bit32.rshift(c, 1)
        end
    end
    CRC_TABLE[i] = c
end

local function crc_update(crc, s)
    local band, bxor, rshift, byte = bit32.band, bit32.bxor, bit32.rshift, string.byte
    for i = 1, #s do
        crc = bxor(CRC_TABLE[band(bxor(crc, byte(s, i)), 0xFF)], rshift(crc, 8))
    end
    return crc
end

local f_ip6_src = Field.new("ipv6.src")
local f_ip6_dst = Field.new("ipv6.dst")
local f_udp_checksum = Field.new("udp.checksum")
-- The UDP ports from UDP itself: the InfiniBand dissector overwrites pinfo's ports with QP numbers.
local f_udp_srcport = Field.new("udp.srcport")
local f_udp_dstport = Field.new("udp.dstport")

local function last(field)
    local all = { field() }
    return all[#all]
end

local function u16(v) return string.char(bit32.rshift(v, 8) % 256, v % 256) end

-- The ICRC status of the MRC packet in `tvb` (BTH at 0), wholly captured, not trimmed.
local function check_icrc(tvb)
    local src, dst = last(f_ip6_src), last(f_ip6_dst)
    local sport, dport = last(f_udp_srcport), last(f_udp_dstport)
    if src == nil or dst == nil or sport == nil or dport == nil then return ICRC_UNCHECKED end
    local n = tvb:len()
    local udp_len = n + 8
    local pseudo = string.rep("\255", 8) .. "\111\255\255\255" .. u16(udp_len) .. "\017\255"
        .. src.range:raw() .. dst.range:raw()
        .. u16(sport.value) .. u16(dport.value) .. u16(udp_len) .. "\255\255"
    local crc = crc_update(0xFFFFFFFF, pseudo)
    crc = crc_update(crc, tvb:raw(0, 4) .. "\255" .. tvb:raw(5, n - 4 - 5))
    crc = bit32.bxor(crc, 0xFFFFFFFF)
    if crc == tvb(n - ICRC_LEN, ICRC_LEN):le_uint() then return ICRC_GOOD end
    return ICRC_BAD
end

local function flag_names(value, names)
    local out = {}
    local known = 0
    for _, pair in ipairs(names) do
        if bit32.band(value, pair[1]) ~= 0 then out[#out + 1] = pair[2] end
        known = bit32.bor(known, pair[1])
    end
    -- reserved bits set stay visible, as `mrcctl wire decode` shows them (FIRST|0xc0)
    local rest = bit32.band(value, bit32.bnot(known))
    if rest ~= 0 then out[#out + 1] = string.format("0x%02x", rest) end
    return table.concat(out, "|")
end

-- Returns false when fewer than `need` bytes are left from `off`: after an expert info when the
-- packet was that short on the wire (malformed), after a plain note when only the capture's snaplen
-- cut it (the packet was whole; nothing is wrong with it).
local function have(tvb, tree, off, need, what)
    if tvb:reported_len() - off < need then
        tree:add_proto_expert_info(ex_malformed,
            string.format("%s truncated: %d bytes, %d needed", what, tvb:reported_len() - off, need))
        return false
    end
    if tvb:len() - off < need then
        tree:add(string.format("[%s not captured: the capture kept %d of %d bytes]", what, tvb:len(),
            tvb:reported_len()))
        return false
    end
    return true
end

local function dissect_sack(tvb, tree, off, body_len)
    if not have(tvb, tree, off, SACK_FIXED_LEN, "SACK body") then return "" end
    local cum = bit32.band(tvb(off, 4):uint(), 0x00FFFFFF)
    local words = tvb(off + 7, 1):uint()
    local st = tree:add(tvb(off, body_len), "SACK body")
    st:add(pf.sack_cum_psn, tvb(off, 4))
    st:add(pf.sack_echo_ev, tvb(off + 4, 2))
    local ft = st:add(pf.sack_echo_flags, tvb(off + 6, 1))
    ft:add(pf.sack_ecn_ce, tvb(off + 6, 1))
    ft:add(pf.sack_retx, tvb(off + 6, 1))
    ft:add(pf.sack_dup, tvb(off + 6, 1))
    st:add(pf.sack_words, tvb(off + 7, 1))
    st:add(pf.sack_echo_ts, tvb(off + 8, 8))
    st:add(pf.sack_service, tvb(off + 16, 4))
    local nbytes = 8 * words
    if words < 1 or words > 16 or body_len ~= SACK_FIXED_LEN + nbytes then
        st:add_proto_expert_info(ex_malformed,
            string.format("SACK with %d bitmap words in a %d-byte body", words, body_len))
        return string.format(" cum=%d", cum)
    end
    local bstart = off + SACK_FIXED_LEN
    local bt = st:add(pf.sack_bitmap, tvb(bstart, nbytes))
    local acked = 0
    for i = 0, nbytes - 1 do
        local byte = tvb(bstart + i, 1):uint()
        for b = 0, 7 do
            if bit32.band(byte, bit32.lshift(1, b)) ~= 0 then
                local psn = (cum + 1 + 8 * i + b) % 0x1000000
                bt:add(pf.sack_acked, tvb(bstart + i, 1), psn):set_generated()
                acked = acked + 1
            end
        end
    end
    return string.format(" cum=%d acked=%d", cum, acked)
end

local function dissect_nack(tvb, tree, off)
    local code = tvb(off, 1):uint()
    local st = tree:add(tvb(off, 16), "NACK body")
    local ct = st:add(pf.nack_code, tvb(off, 1))
    if NACK_CODES[code] == nil then
        ct:add_proto_expert_info(ex_malformed, string.format("NACK code %d is none of 1..7", code))
    end
    st:add(pf.nack_echo_ev, tvb(off + 2, 2))
    st:add(pf.nack_cum_psn, tvb(off + 4, 4))
    st:add(pf.nack_echo_ts, tvb(off + 8, 8))
    return " code=" .. (NACK_CODES[code] or tostring(code))
end

local function dissect_probe(tvb, tree, off)
    local st = tree:add(tvb(off, 8), "PROBE body")
    st:add(pf.probe_rid, tvb(off, 2))
    st:add(pf.probe_reply_qpn, tvb(off + 4, 4))
    return string.format(" id=%d", tvb(off, 2):uint())
end

local function dissect_probe_reply(tvb, tree, off)
    local st = tree:add(tvb(off, 20), "PROBE_REPLY body")
    st:add(pf.pr_rid, tvb(off, 2))
    st:add(pf.pr_echo_ev, tvb(off + 2, 2))
    local ft = st:add(pf.pr_flags, tvb(off + 4, 1))
    ft:add(pf.pr_stv, tvb(off + 4, 1))
    st:add(pf.pr_echo_ts, tvb(off + 8, 8))
    st:add(pf.pr_service, tvb(off + 16, 4))
    return string.format(" id=%d", tvb(off, 2):uint())
end

local function dissect_port_status(tvb, tree, off)
    local st = tree:add(tvb(off, 8), "PORT_STATUS body")
    st:add(pf.ps_rid, tvb(off, 2))
    st:add(pf.ps_port, tvb(off + 2, 1))
    local sti = st:add(pf.ps_state, tvb(off + 3, 1))
    st:add(pf.ps_epoch, tvb(off + 4, 4))
    local state = tvb(off + 3, 1):uint()
    if PORT_STATES[state] == nil then
        sti:add_proto_expert_info(ex_malformed, string.format("PORT_STATUS state %d is neither DOWN 0 nor UP 1", state))
    end
    return string.format(" port=%d %s", tvb(off + 2, 1):uint(), PORT_STATES[state] or tostring(state))
end

-- Decodes MXH and the control body of the MRC packet in `tvb` (BTH at offset 0). Never throws on
-- short or foreign packets: it adds an expert info and returns.
local function dissect_mrc(tvb, pinfo, tree)
    if tvb:len() < 12 then return end
    local opcode = tvb(0, 1):uint()
    local moff = MXH_OFFSET[opcode]
    if moff == nil then return end -- not an MRC opcode: leave it to InfiniBand alone
    local t = tree:add(mrc, tvb(0, tvb:len()))
    t:add(pf.opcode, tvb(0, 1))
    local captured, reported = tvb:len(), tvb:reported_len()
    local cut = captured < reported
    t:add(pf.truncated, cut):set_generated()
    local cut_note = ""
    if cut then
        cut_note = string.format(" [cut by snaplen: %d of %d bytes captured]", captured, reported)
        pinfo.cols.protocol:set("MRC")
        -- The InfiniBand dissector fences "Invalid Packet Length from LRH! [Malformed Packet]" into
        -- Info for a payload the capture did not keep; the packet is not malformed: say what it is.
        pinfo.cols.info:clear_fence()
        pinfo.cols.info:set(string.format("MRC %s", OPCODES[opcode]) .. cut_note)
    end
    if not have(tvb, t, moff, MXH_LEN, "MXH") then return end
    local version = tvb(moff, 1):uint()
    local flags = tvb(moff + 1, 1):uint()
    local ev = tvb(moff + 2, 2):uint()
    local mt = t:add(pf.mxh, tvb(moff, MXH_LEN))
    mt:set_text("MRC Extension Header")
    mt:add(pf.version, tvb(moff, 1))
    if version ~= 1 then
        mt:add_proto_expert_info(ex_malformed, string.format("MXH version %d, expected 1", version))
        return
    end
    -- the rejections of mrc.wire.parse (docs/wire.md), each as an expert Error: a packet the parser
    -- refuses must not look valid here, its ICRC good or not
    local b1 = tvb(1, 1):uint()
    local pad = bit32.band(bit32.rshift(b1, 4), 3)
    if bit32.band(b1, 0x0F) ~= 0 then
        t:add_proto_expert_info(ex_malformed, string.format("BTH TVer %d, expected 0", bit32.band(b1, 0x0F)))
    end
    if ev > 0x3FFF then
        t:add_proto_expert_info(ex_malformed, string.format("MXH EV index 0x%04x > 0x3fff", ev))
    end
    local fnames = flag_names(flags, MXH_FLAG_NAMES)
    local ft = mt:add(pf.flags, tvb(moff + 1, 1))
    if fnames ~= "" then ft:append_text(" (" .. fnames .. ")") end
    ft:add(pf.f_trimmed, tvb(moff + 1, 1))
    ft:add(pf.f_retx, tvb(moff + 1, 1))
    ft:add(pf.f_first, tvb(moff + 1, 1))
    ft:add(pf.f_last, tvb(moff + 1, 1))
    ft:add(pf.f_ack_req_now, tvb(moff + 1, 1))
    ft:add(pf.f_prio, tvb(moff + 1, 1))
    mt:add(pf.ev_index, tvb(moff + 2, 2))
    mt:add(pf.msn, tvb(moff + 4, 4))
    mt:add(pf.msg_len, tvb(moff + 8, 4))
    mt:add(pf.msg_offset, tvb(moff + 12, 4))
    mt:add(pf.timestamp, tvb(moff + 16, 8))

    local name = OPCODES[opcode]
    local info = string.format("MRC %s ev=%d", name, ev)
    if fnames ~= "" then info = info .. " [" .. fnames .. "]" end
    local body = moff + MXH_LEN
    local trimmed = bit32.band(flags, 0x01) ~= 0
    -- Lengths come from the packet's length on the wire (`reported`), never from what was captured.
    if opcode == 0x0A or opcode == 0x0B then
        local plen = 0
        local dma = tvb(12 + 12, 4):uint()
        if trimmed then
            if reported ~= body then
                -- a trimmed packet ends right after MXH: anything else is a corrupted full packet
                -- whose TRIMMED bit flipped (no ICRC vouches for a trimmed packet; its length does)
                t:add_proto_expert_info(ex_malformed,
                    string.format("trimmed packet of %d bytes, headers end at %d", reported, body))
            else
                t:add_proto_expert_info(ex_trimmed, string.format("Payload trimmed: %d bytes lost", dma))
            end
        else
            plen = math.max(reported - body - pad - ICRC_LEN, 0)
            local moffv, mlen = tvb(moff + 12, 4):uint(), tvb(moff + 8, 4):uint()
            if dma > MAX_PAYLOAD then
                t:add_proto_expert_info(ex_malformed, string.format("DMA length %d > %d", dma, MAX_PAYLOAD))
            elseif (dma + pad) % 4 ~= 0 then
                t:add_proto_expert_info(ex_malformed,
                    string.format("DMA length %d + pad %d not a multiple of 4", dma, pad))
            elseif reported ~= body + dma + pad + ICRC_LEN then
                t:add_proto_expert_info(ex_malformed, string.format(
                    "%d bytes, headers and DMA length say %d", reported, body + dma + pad + ICRC_LEN))
            end
            if moffv + dma > mlen then
                t:add_proto_expert_info(ex_malformed,
                    string.format("offset %d + %d beyond message length %d", moffv, dma, mlen))
            end
        end
        t:add(pf.payload_len, plen):set_generated()
    else
        if pad ~= 0 then
            t:add_proto_expert_info(ex_malformed, "PadCnt set on a control packet")
        end
        local body_len = reported - body - ICRC_LEN
        if trimmed then
            t:add_proto_expert_info(ex_malformed, "TRIMMED set on a control packet")
        end
        local need = BODY_LEN[opcode] or SACK_FIXED_LEN
        if body_len < need then
            t:add_proto_expert_info(ex_malformed,
                string.format("%s body truncated: %d bytes, %d needed", name, math.max(body_len, 0), need))
        elseif have(tvb, t, body, body_len, name .. " body") then
            if opcode == 0xC0 then
                info = info .. dissect_sack(tvb, t, body, body_len)
            elseif opcode == 0xC1 then
                info = info .. dissect_nack(tvb, t, body)
            elseif opcode == 0xC2 then
                info = info .. dissect_probe(tvb, t, body)
            elseif opcode == 0xC3 then
                info = info .. dissect_probe_reply(tvb, t, body)
            else
                info = info .. dissect_port_status(tvb, t, body)
            end
            if opcode ~= 0xC0 and body_len ~= need then
                t:add_proto_expert_info(ex_malformed,
                    string.format("%s body is %d bytes, %d expected", name, body_len, need))
            end
            if not cut then t:add(pf.icrc, tvb(reported - ICRC_LEN, ICRC_LEN)) end
        end
    end

    local status
    if trimmed and (opcode == 0x0A or opcode == 0x0B) and reported == body then
        status = ICRC_TRIMMED
    elseif cut then
        status = ICRC_TRUNCATED
    elseif not mrc.prefs.check_icrc or reported < 12 + ICRC_LEN then
        status = ICRC_UNCHECKED
    else
        status = check_icrc(tvb)
    end
    local st = t:add(pf.icrc_status, status)
    st:set_generated()
    if status == ICRC_BAD then st:add_proto_expert_info(ex_bad_icrc) end
    local ck = last(f_udp_checksum)
    if ck ~= nil and ck.value == 0 then
        t:add("[UDP checksum 0: RoCEv2 practice over IPv6 (RFC 6935/6936); the ICRC covers the packet]")
    end

    t:append_text(", " .. info:sub(5) .. cut_note)
    pinfo.cols.protocol:set("MRC")
    pinfo.cols.info:clear_fence()
    pinfo.cols.info:set(info .. cut_note)
end

-- Chain onto UDP 4791: keep whatever dissector was there (InfiniBand's RRoCE) and add our tree after.
local udp_port = DissectorTable.get("udp.port")
local previous = udp_port:get_dissector(ROCEV2_PORT)

function mrc.dissector(tvb, pinfo, tree)
    if previous ~= nil then
        -- An exception in the InfiniBand dissector (e.g. on a trimmed packet) must not hide MXH. pcall
        -- catches what Dissector.call turns into a Lua error (a "malformed" ReportedBoundsError), but
        -- not a read past the bytes the capture kept (BoundsError, "Packet size limited during
        -- capture"): that unwinds through the Lua state, skips MXH and, repeated, corrupts the state
        -- ("C stack overflow" on every later packet). So a packet cut by the snaplen goes to InfiniBand
        -- as a packet of the captured length, and only when that holds all of InfiniBand's own headers
        -- (BTH, RETH, ImmDt: what comes before MXH) and the 4 bytes it then takes for the ICRC; cut
        -- inside them, the MRC tree alone says what was captured (InfiniBand would report a packet
        -- shorter than its headers as malformed).
        local captured = tvb:len()
        if captured >= tvb:reported_len() then
            pcall(function() previous:call(tvb, pinfo, tree) end)
        else
            local headers = captured >= 1 and MXH_OFFSET[tvb(0, 1):uint()] or nil
            if headers == nil or captured >= headers + ICRC_LEN then
                local kept = tvb:range(0, captured):tvb()
                pcall(function() previous:call(kept, pinfo, tree) end)
            end
        end
    end
    dissect_mrc(tvb, pinfo, tree)
    return tvb:len()
end

udp_port:add(ROCEV2_PORT, mrc)
