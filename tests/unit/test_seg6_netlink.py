"""SEG6_LOCAL_FLAVORS (NEXT-C-SID) and the seg6 encap.red mode, which pyroute2 0.9.7 lacks: encoded into
netlink bytes the kernel reads (checked against the UAPI layout) and decoded back. The root test
tests/netns/test_testbed.py installs them in a kernel and reads them back from a route dump."""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("pyroute2")

from mrc.dataplane import seg6


def _find_nla(data: bytes, nla_type: int) -> bytes:
    """Payload of the first attribute of ``nla_type`` anywhere in ``data`` (a naive nested walk)."""
    off = 0
    while off + 4 <= len(data):
        length, typ = struct.unpack_from("HH", data, off)
        if length < 4:
            break
        if typ & 0x3FFF == nla_type:
            return data[off + 4: off + length]
        off += (length + 3) & ~3
    raise KeyError(nla_type)


def test_flavors_encode_to_uapi_layout_and_decode_back() -> None:
    msg = seg6.seg6local_msg("fcbb:bbbb:100::", 48, 7, "End",
                             flavors={"operations": ["next-csid"], "lblen": 32, "nflen": 16})
    data = seg6.encode(msg)
    body = data[16 + 12:]  # nlmsghdr + rtmsg
    encap = _find_nla(body, 22)  # RTA_ENCAP
    flavors = _find_nla(encap, seg6.SEG6_LOCAL_FLAVORS)
    assert struct.unpack("I", _find_nla(flavors, 1))[0] == 1 << 4  # OPERATION bit NEXT_CSID
    assert _find_nla(flavors, 2)[0] == 32  # LCBLOCK_BITS
    assert _find_nla(flavors, 3)[0] == 16  # LCNODE_FN_BITS
    assert struct.unpack("I", _find_nla(encap, 1))[0] == 1  # SEG6_LOCAL_ACTION_END
    back = seg6.decode(data)
    assert seg6.describe_encap(back) == {
        "type": "seg6local", "action": "End",
        "flavors": {"operations": ["next-csid"], "lblen": 32, "nflen": 16},
    }
    assert back.get_attr("RTA_DST") == "fcbb:bbbb:100::"
    assert back["dst_len"] == 48


def test_several_flavors_and_dt6_table() -> None:
    msg = seg6.seg6local_msg("fcbb:bbbb:300::", 48, 3, "End", flavors={"operations": ["psp", "usd"]})
    described = seg6.describe_encap(seg6.decode(seg6.encode(msg)))
    assert described is not None and described["flavors"] == {"operations": ["psp", "usd"]}
    dt6 = seg6.seg6local_msg("fcbb:bbbb:300::", 48, 3, "End.DT6", table=255)
    assert seg6.describe_encap(seg6.decode(seg6.encode(dt6))) == {"type": "seg6local", "action": "End.DT6",
                                                                  "table": 255}


def test_encap_red_and_travel_order() -> None:
    segs = ["fc00:1::e", "fc00:2::e", "fcbb:bbbb:100:200::"]
    msg = seg6.seg6_encap_msg("fd00::1", 128, segs, mode="encap.red", oif=2, gateway="fc00::2",
                              src="fd00::a00:1:1:1")
    data = seg6.encode(msg)
    srh = _find_nla(_find_nla(data[28:], 22), 1)  # SEG6_IPTUNNEL_SRH
    assert struct.unpack_from("i", srh)[0] == 3  # SEG6_IPTUN_MODE_ENCAP_RED
    # the SRH lists segments last first: the first hop is the last address in the header
    assert srh[-16:] == bytes.fromhex("fc000001" + "00" * 10 + "000e")
    back = seg6.decode(data)
    assert seg6.describe_encap(back) == {"type": "seg6", "mode": "encap.red", "segs": segs}
    assert back.get_attr("RTA_SRC") == "fd00::a00:1:1:1" and back["src_len"] == 128


@pytest.mark.parametrize("bad", [{"operations": ["next-csid"], "lblen": 33}, {"operations": ["warp"]},
                                 {"operations": []}])
def test_bad_flavors_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        seg6.seg6local_msg("fcbb:bbbb:100::", 48, 1, "End", flavors=bad)


def test_unknown_mode_rejected() -> None:
    msg = seg6.seg6_encap_msg("fd00::1", 128, ["fcbb::"], mode="teleport", oif=1)
    with pytest.raises(ValueError, match="unknown seg6 encap mode"):
        seg6.encode(msg)
