#!/bin/bash
#
# Emulated "real machines" for mrcd's configuration-file mode (`mrcd --config FILE`, docs/deploy.md).
#
# Network namespaces play machines with NIC ports named eth1..eth4 and, for the Clos, switches that run
# the kernel's own SRv6 (seg6local End with the NEXT-C-SID flavor), configured here with plain iproute2
# commands: nothing from mrc (no mrc.dataplane.testbed, no topology builder). Each machine gets a host
# configuration file in the form docs/deploy.md gives; mrcd is NOT started here (the tests start it in the
# machine's namespace, `ip netns exec <ns> mrcd --config DIR/mA.toml`), and the MRC addresses are left to
# mrcd to install.
#
#   machines.sh up b2b|clos DIR    build the machines; write DIR/mA.toml ..., DIR/env, DIR/state
#   machines.sh check DIR          ping every plane (b2b) / every micro-SID path (clos), before mrcd runs
#   machines.sh link DIR NODE PORT down|up   fail or repair one cable end (up puts the routes back)
#   machines.sh down DIR           remove everything `up` made (from DIR/state; safe to repeat)
#   machines.sh probe              exit 4 (skip) with the reason when this host cannot run the machines
#
# `check` needs the machines without mrcd: mrcd's XDP program would take its packets. It prints one
# "PASS ..." or "FAIL ..." line per probe and "check: N passed, M failed" last.
#
# Exit codes: 0 ok, 1 failure, 2 usage, 4 skip (kselftest's KSFT_SKIP: something is missing here).
#
# ---------------------------------------------------------------------------------------------------------
# Back to back (`up b2b DIR`): two machines, four planes, port k of mA cabled to port k of mB.
#
#      +----------- mA-<sfx> -----------+                  +----------- mB-<sfx> -----------+
#      |  eth1  fc00:0:1::1/64          |------ plane 0 ---|  eth1  fc00:0:1::2/64          |
#      |  eth2  fc00:0:2::1/64          |------ plane 1 ---|  eth2  fc00:0:2::2/64          |
#      |  eth3  fc00:0:3::1/64          |------ plane 2 ---|  eth3  fc00:0:3::2/64          |
#      |  eth4  fc00:0:4::1/64          |------ plane 3 ---|  eth4  fc00:0:4::2/64          |
#      |  MRC address fd00:0:0:1::1     |                  |  MRC address fd00:0:0:2::1     |
#      |  (installed by mrcd)           |                  |  (installed by mrcd)           |
#      +--------------------------------+                  +--------------------------------+
#
# ---------------------------------------------------------------------------------------------------------
# Clos (`up clos DIR`): four machines on two planes; each plane is 2 leaves + 2 spines of its own.
# Every machine has eth1 on plane 0 and eth2 on plane 1. Plane p = 0, 1:
#
#                 p<p>s0-<sfx>                         p<p>s1-<sfx>
#                 uSID 0xp200                          uSID 0xp201
#                 to-l0   to-l1                        to-l0   to-l1
#                   |         \                        /         |
#                   |           \____________________/           |
#                   |            ____________________            |
#                   |           /                    \           |
#                 to-s0   to-s1                        to-s0   to-s1
#                 p<p>l0-<sfx>                         p<p>l1-<sfx>
#                 uSID 0xp100                          uSID 0xp101
#                 to-mA   to-mB                        to-mC   to-mD
#                  /          \                        /          \
#           eth<p+1>        eth<p+1>            eth<p+1>        eth<p+1>
#           mA-<sfx>        mB-<sfx>            mC-<sfx>        mD-<sfx>
#           uSID 0xp300     uSID 0xp301         uSID 0xp302     uSID 0xp303
#           fd00:0:0:1::1   fd00:0:0:2::1       fd00:0:0:3::1   fd00:0:0:4::1   (MRC addresses, mrcd's)
#
# Micro-SIDs (F3216): block fcbb:bbbb::/32, 16-bit IDs 0x<p><r><nn>: p the plane, r the role (1 leaf,
# 2 spine, 3 machine), nn the index. Node X owns fcbb:bbbb:<X>::/48, a `local` route on lo (a plain
# route via lo would be a reject route; there is no dummy device to hang it on here) with a seg6local
# action and its packet counter (`count`, which `check` reads to see which spine a packet crossed):
#   switch:  End flavors next-csid lblen 32 nflen 16: shift the next micro-SID in; plus static routes to
#            each neighbour's /48 (a leaf: the spines' and its machines'; a spine: the leaves')
#   machine: End.DT6 table 255 (the local table): decapsulate. Only `check` relies on it (mrcd's XDP
#            strips the outer header itself, whatever its destination). Plus fcbb:bbbb:<p>000::/36
#            (plane p's IDs) via its gateway on eth<p+1>
# A path is one container: mA -> mD on plane 1 through spine 0 is [0x1100, 0x1200, 0x1101, 0x1303],
# fcbb:bbbb:1100:1200:1101:1303::; between machines on one leaf it is [leaf, machine].
#
# Addresses: a machine-leaf link is fc00:0:<machine ID>:<leaf ID>::/64 (machine ::1, leaf ::2: the
# machine's gateway), a leaf-spine link fc00:0:<leaf ID>:<spine ID>::/64 (leaf ::1, spine ::2).
# mA's plane-0 port is fc00:0:300:100::1/64 with gateway fc00:0:300:100::2 (docs/deploy.md's example).
#
# ---------------------------------------------------------------------------------------------------------
# Names: <node>-<sfx> with a random 4-hex-digit suffix, so parallel runs never collide; every veth is
# created directly inside its two namespaces (nothing in the root namespace). All links MTU 9000, DAD off,
# addresses kept on link down (so `link ... up` restores a failed cable). Machines forward nothing
# (forwarding=0); switches forward.
#
# DIR/mA.toml ...: host.name "ma" ... (names are lower case), mrc_prefix fd00::/48, the ports in plane
# order, back to back one [[peer]], on the Clos three with their two micro-SID paths per plane (one to a
# machine on the same leaf); metrics on [::1]:9471 (mA), 9472 (mB) ... inside the machine's namespace;
# control socket DIR/mA.sock.
#
# DIR/env (sourceable): SHAPE, SUFFIX, DIR, MACHINES="A B ...", SWITCHES="<ns> ...", and per machine X:
# NS_X, NAME_X (host.name), CONFIG_X, MRC_X, METRICS_X, SOCKET_X, PORTS_X, ADDRS_X, GATEWAYS_X (clos).
# DIR/state: what `down` removes, one "netns NAME" or "file PATH" per line, written as it is made.

set -euo pipefail

readonly ksft_skip=4
readonly MTU=9000
readonly USID_BLOCK=fcbb:bbbb            # the /32 locator block
readonly MRC_PREFIX=fd00::/48
readonly CHECK_PREFIX=fd99::/16          # `check`'s test addresses on the machines' lo
readonly LETTERS=(A B C D)
readonly ROLE_LEAF=1 ROLE_SPINE=2 ROLE_MACHINE=3
readonly CLOS_PLANES=2 CLOS_LEAVES=2 CLOS_SPINES=2 CLOS_MACHINES=4
readonly B2B_PLANES=4
readonly PINGS=2                          # echo requests per check

SUFFIX=""
DIR=""
STATE=""
up_pending=""
check_pending=""

log() { printf 'machines.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
skip() { log "SKIP: $*"; exit "$ksft_skip"; }
usage() {
	sed -n 's/^#   machines.sh/machines.sh/p' "$0" >&2
	exit 2
}

# ------------------------------------------------------------------------------------------ cleanup

cleanup() {
	local rc=$?
	trap - EXIT
	set +e
	[ -n "$check_pending" ] && check_undo
	if [ -n "$up_pending" ]; then
		log "up did not finish: removing what it made"
		teardown
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------------------------------------ prerequisites

require_host() {
	[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
	command -v ip >/dev/null || skip "no 'ip' (apt-get install iproute2)"
	command -v sysctl >/dev/null || skip "no 'sysctl' (apt-get install procps)"
	[ -n "$(python3_bin)" ] || skip "no python3 (check's ICMPv6 echo)"
}

python3_bin() {
	if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else command -v python3 || true; fi
}

# A throwaway namespace: can it hold one and take a NEXT-C-SID End route?
probe_next_csid() {
	local ns ok=1
	ns="mrcprobe-$(printf '%04x' $((SRANDOM & 0xffff)))"
	ip netns add "$ns" 2>/dev/null || skip "cannot create a network namespace"
	ip -n "$ns" link set lo up || ok=0
	ip -n "$ns" -6 route add local "$USID_BLOCK:100::/48" \
		encap seg6local action End flavors next-csid lblen 32 nflen 16 dev lo 2>/dev/null || ok=0
	ip netns del "$ns"
	[ "$ok" = 1 ] || skip "no seg6local End with flavors next-csid here (needs kernel and iproute2 >= 6.1)"
}

# ------------------------------------------------------------------------------------------ naming

new_suffix() {
	local sfx
	while :; do
		sfx=$(printf '%04x' $((SRANDOM & 0xffff)))
		netns_exists_like "-$sfx\b" || break
	done
	echo "$sfx"
}

netns_exists_like() {  # an ERE on `ip netns list`'s lines
	local list
	list=$(ip netns list)
	grep -Eq -- "$1" <<<"$list"
}

ns() { echo "$1-$SUFFIX"; }                         # node name -> namespace name

usid() { printf '%x' $(( $1 << 12 | $2 << 8 | $3 )); }  # plane role index -> ID in hex, no 0x
leaf_id() { usid "$1" "$ROLE_LEAF" "$2"; }
spine_id() { usid "$1" "$ROLE_SPINE" "$2"; }
machine_id() { usid "$1" "$ROLE_MACHINE" "$2"; }

container() {                                       # ID ... -> fcbb:bbbb:ID:ID::
	local IFS=:
	echo "$USID_BLOCK:$*::"
}

machine_leaf() { echo $(( $1 / (CLOS_MACHINES / CLOS_LEAVES) )); }
port_of_plane() { echo "eth$(( $1 + 1 ))"; }

# per machine index m: its label, host name, MRC address, metrics address, control socket
label() { echo "m${LETTERS[$1]}"; }
host_name() { local l; l=$(label "$1"); echo "${l,,}"; }
mrc_address() { echo "fd00:0:0:$(( $1 + 1 ))::1"; }
metrics_address() { echo "[::1]:$(( 9471 + $1 ))"; }
socket_path() { echo "$DIR/$(label "$1").sock"; }

# b2b plane k's link: mA is ::1, mB ::2
b2b_address() { echo "fc00:0:$(( $1 + 1 ))::$(( $2 + 1 ))"; }

# clos: machine m's port on plane p and its gateway (the leaf's end of the link)
clos_link() { echo "fc00:0:$(machine_id "$1" "$2"):$(leaf_id "$1" "$(machine_leaf "$2")")"; }
clos_address() { echo "$(clos_link "$1" "$2")::1"; }
clos_gateway() { echo "$(clos_link "$1" "$2")::2"; }
fabric_link() { echo "fc00:0:$(leaf_id "$1" "$2"):$(spine_id "$1" "$3")"; }   # plane leaf spine

# The micro-SIDs from machine a to machine b on plane p through spine s ("-": same leaf, no spine)
clos_usids() {
	local p=$1 a=$2 b=$3 s=$4 la lb
	la=$(machine_leaf "$a")
	lb=$(machine_leaf "$b")
	if [ "$la" = "$lb" ]; then
		echo "$(leaf_id "$p" "$la") $(machine_id "$p" "$b")"
	else
		echo "$(leaf_id "$p" "$la") $(spine_id "$p" "$s") $(leaf_id "$p" "$lb") $(machine_id "$p" "$b")"
	fi
}

# The spines a path from a to b can take: "-" (none) on one leaf
clos_spines() {
	if [ "$(machine_leaf "$1")" = "$(machine_leaf "$2")" ]; then echo "-"; else seq 0 $((CLOS_SPINES - 1)); fi
}

# ------------------------------------------------------------------------------------------ state

record() { printf '%s\n' "$*" >>"$STATE"; }

load_env() {
	[ -f "$DIR/env" ] || die "$DIR/env: no machines are up there"
	# shellcheck disable=SC1091
	source "$DIR/env"
}

# ------------------------------------------------------------------------------------------ building blocks

# A namespace with lo up, DAD off and addresses kept on link down; forwarding 0 (machine) or 1 (switch)
netns_add() {
	local node=$1 forwarding=$2 name
	name=$(ns "$node")
	ip netns add "$name"
	record "netns $name"
	ip -n "$name" link set lo up
	ip netns exec "$name" sysctl -qw \
		net.ipv6.conf.all.forwarding="$forwarding" \
		net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
		net.ipv6.conf.all.keep_addr_on_down=1 net.ipv6.conf.default.keep_addr_on_down=1
}

# One cable end: MTU, DAD off, up
port_up() {
	local name dev=$2
	name=$(ns "$1")
	ip netns exec "$name" sysctl -qw net.ipv6.conf."$dev".accept_dad=0 net.ipv6.conf."$dev".keep_addr_on_down=1
	ip -n "$name" link set "$dev" mtu "$MTU" up
}

# cable NODE_A PORT_A NODE_B PORT_B: a veth pair, each end inside its own namespace
cable() {
	ip -n "$(ns "$1")" link add "$2" type veth peer name "$4" netns "$(ns "$3")"
	port_up "$1" "$2"
	port_up "$3" "$4"
}

# ------------------------------------------------------------------------------------------ back to back

b2b_build() {
	local k
	netns_add mA 0
	netns_add mB 0
	for k in $(seq 0 $((B2B_PLANES - 1))); do
		cable mA "$(port_of_plane "$k")" mB "$(port_of_plane "$k")"
		ip -n "$(ns mA)" -6 addr add "$(b2b_address "$k" 0)/64" dev "$(port_of_plane "$k")" nodad
		ip -n "$(ns mB)" -6 addr add "$(b2b_address "$k" 1)/64" dev "$(port_of_plane "$k")" nodad
	done
}

# ------------------------------------------------------------------------------------------ Clos

clos_build() {
	local p l s m
	for p in $(seq 0 $((CLOS_PLANES - 1))); do
		for s in $(seq 0 $((CLOS_SPINES - 1))); do netns_add "p${p}s$s" 1; done
		for l in $(seq 0 $((CLOS_LEAVES - 1))); do netns_add "p${p}l$l" 1; done
	done
	for m in $(seq 0 $((CLOS_MACHINES - 1))); do netns_add "$(label "$m")" 0; done
	for p in $(seq 0 $((CLOS_PLANES - 1))); do
		for l in $(seq 0 $((CLOS_LEAVES - 1))); do
			for s in $(seq 0 $((CLOS_SPINES - 1))); do clos_cable_leaf_spine "$p" "$l" "$s"; done
		done
		for m in $(seq 0 $((CLOS_MACHINES - 1))); do clos_cable_machine "$p" "$m"; done
	done
	clos_routes
}

clos_cable_leaf_spine() {
	local p=$1 l=$2 s=$3 net
	net=$(fabric_link "$p" "$l" "$s")
	cable "p${p}l$l" "to-s$s" "p${p}s$s" "to-l$l"
	ip -n "$(ns "p${p}l$l")" -6 addr add "$net::1/64" dev "to-s$s" nodad
	ip -n "$(ns "p${p}s$s")" -6 addr add "$net::2/64" dev "to-l$l" nodad
}

clos_cable_machine() {
	local p=$1 m=$2 leaf machine port
	leaf="p${p}l$(machine_leaf "$m")"
	machine=$(label "$m")
	port=$(port_of_plane "$p")
	cable "$machine" "$port" "$leaf" "to-$machine"
	ip -n "$(ns "$machine")" -6 addr add "$(clos_address "$p" "$m")/64" dev "$port" nodad
	ip -n "$(ns "$leaf")" -6 addr add "$(clos_gateway "$p" "$m")/64" dev "to-$machine" nodad
}

# Every switch's and machine's static routes (`replace`: `link ... up` runs it again after a repair)
clos_routes() {
	local p l s m
	for p in $(seq 0 $((CLOS_PLANES - 1))); do
		for s in $(seq 0 $((CLOS_SPINES - 1))); do clos_spine_routes "$p" "$s"; done
		for l in $(seq 0 $((CLOS_LEAVES - 1))); do clos_leaf_routes "$p" "$l"; done
		for m in $(seq 0 $((CLOS_MACHINES - 1))); do clos_machine_routes "$p" "$m"; done
	done
}

clos_spine_routes() {
	local p=$1 s=$2 l name
	name=$(ns "p${p}s$s")
	ip -n "$name" -6 route replace local "$USID_BLOCK:$(spine_id "$p" "$s")::/48" \
		encap seg6local action End count flavors next-csid lblen 32 nflen 16 dev lo
	for l in $(seq 0 $((CLOS_LEAVES - 1))); do
		ip -n "$name" -6 route replace "$USID_BLOCK:$(leaf_id "$p" "$l")::/48" \
			via "$(fabric_link "$p" "$l" "$s")::1" dev "to-l$l"
	done
}

clos_leaf_routes() {
	local p=$1 l=$2 s m name
	name=$(ns "p${p}l$l")
	ip -n "$name" -6 route replace local "$USID_BLOCK:$(leaf_id "$p" "$l")::/48" \
		encap seg6local action End count flavors next-csid lblen 32 nflen 16 dev lo
	for s in $(seq 0 $((CLOS_SPINES - 1))); do
		ip -n "$name" -6 route replace "$USID_BLOCK:$(spine_id "$p" "$s")::/48" \
			via "$(fabric_link "$p" "$l" "$s")::2" dev "to-s$s"
	done
	for m in $(seq 0 $((CLOS_MACHINES - 1))); do
		[ "$(machine_leaf "$m")" = "$l" ] || continue
		ip -n "$name" -6 route replace "$USID_BLOCK:$(machine_id "$p" "$m")::/48" \
			via "$(clos_address "$p" "$m")" dev "to-$(label "$m")"
	done
}

clos_machine_routes() {
	local p=$1 m=$2 name port
	name=$(ns "$(label "$m")")
	port=$(port_of_plane "$p")
	ip -n "$name" -6 route replace local "$USID_BLOCK:$(machine_id "$p" "$m")::/48" \
		encap seg6local action End.DT6 table 255 count dev lo
	ip -n "$name" -6 route replace "$USID_BLOCK:${p}000::/36" via "$(clos_gateway "$p" "$m")" dev "$port"
}

# ------------------------------------------------------------------------------------------ config files

# The parts every machine's file shares: [host] ... and, after the peers, [metrics] and [control]
config_host() {
	local m=$1
	cat <<-EOF
	# $(label "$m") ($(ns "$(label "$m")")): written by tests/netns/machines.sh up $SHAPE (docs/deploy.md)
	[host]
	name = "$(host_name "$m")"
	mrc_address = "$(mrc_address "$m")"
	mrc_prefix = "$MRC_PREFIX"
	EOF
}

config_tail() {
	local m=$1
	cat <<-EOF

	[metrics]
	address = "$(metrics_address "$m")"

	[control]
	socket = "$(socket_path "$m")"
	EOF
}

b2b_config() {
	local m=$1 peer=$(( 1 - $1 )) k
	config_host "$m"
	for k in $(seq 0 $((B2B_PLANES - 1))); do
		printf '\n[[plane]]\ninterface = "%s"\naddress = "%s/64"\n' \
			"$(port_of_plane "$k")" "$(b2b_address "$k" "$m")"
	done
	printf '\n[fabric]\nshape = "back-to-back"\n'
	printf '\n[[peer]]\nname = "%s"\nmrc_address = "%s"\n' "$(host_name "$peer")" "$(mrc_address "$peer")"
	for k in $(seq 0 $((B2B_PLANES - 1))); do
		printf '\n[[peer.plane]]\naddress = "%s"\n' "$(b2b_address "$k" "$peer")"
	done
	config_tail "$m"
}

clos_config() {
	local m=$1 p b
	config_host "$m"
	for p in $(seq 0 $((CLOS_PLANES - 1))); do
		printf '\n[[plane]]\ninterface = "%s"\naddress = "%s/64"\ngateway = "%s"   # p%sl%s, port to-%s\n' \
			"$(port_of_plane "$p")" "$(clos_address "$p" "$m")" "$(clos_gateway "$p" "$m")" \
			"$p" "$(machine_leaf "$m")" "$(label "$m")"
	done
	printf '\n[fabric]\nshape = "clos"\nusid_block = "%s::/32"\n' "$USID_BLOCK"
	for b in $(seq 0 $((CLOS_MACHINES - 1))); do
		[ "$b" = "$m" ] || clos_config_peer "$m" "$b"
	done
	config_tail "$m"
}

clos_config_peer() {
	local a=$1 b=$2 p s id
	printf '\n[[peer]]\nname = "%s"\nmrc_address = "%s"\n' "$(host_name "$b")" "$(mrc_address "$b")"
	for p in $(seq 0 $((CLOS_PLANES - 1))); do
		printf '\n[[peer.plane]]\naddress = "%s"\npaths = [\n' "$(clos_address "$p" "$b")"
		for s in $(clos_spines "$a" "$b"); do
			printf '  ['
			local sep=""
			for id in $(clos_usids "$p" "$a" "$b" "$s"); do printf '%s0x%04x' "$sep" "0x$id"; sep=", "; done
			if [ "$s" = "-" ]; then printf '],   # p%sl%s\n' "$p" "$(machine_leaf "$a")"
			else printf '],   # through p%ss%s\n' "$p" "$s"; fi
		done
		printf ']\n'
	done
}

write_configs() {
	local m n
	n=$(machine_count)
	for m in $(seq 0 $((n - 1))); do
		record "file $DIR/$(label "$m").toml"
		"${SHAPE}_config" "$m" >"$DIR/$(label "$m").toml"
	done
}

machine_count() { if [ "$SHAPE" = clos ]; then echo "$CLOS_MACHINES"; else echo 2; fi; }
plane_count() { if [ "$SHAPE" = clos ]; then echo "$CLOS_PLANES"; else echo "$B2B_PLANES"; fi; }

write_env() {
	local m
	record "file $DIR/env"
	{
		env_fabric
		for m in $(seq 0 $(( $(machine_count) - 1 ))); do env_machine "$m"; done
	} >"$DIR/env"
}

env_fabric() {
	local m letters="" switches="" node
	for m in $(seq 0 $(( $(machine_count) - 1 ))); do letters="$letters ${LETTERS[$m]}"; done
	if [ "$SHAPE" = clos ]; then
		for node in $(clos_switch_nodes); do switches="$switches $(ns "$node")"; done
	fi
	echo "# tests/netns/machines.sh up $SHAPE: source this file"
	echo "SHAPE=$SHAPE"
	echo "SUFFIX=$SUFFIX"
	echo "DIR=$DIR"
	echo "MACHINES=\"${letters# }\""
	echo "SWITCHES=\"${switches# }\""
}

env_machine() {
	local m=$1 x=${LETTERS[$1]} p ports="" addrs="" gws=""
	for p in $(seq 0 $(( $(plane_count) - 1 ))); do
		ports="$ports $(port_of_plane "$p")"
		addrs="$addrs $(port_address "$p" "$m")/64"
		[ "$SHAPE" = b2b ] || gws="$gws $(clos_gateway "$p" "$m")"
	done
	echo "NS_$x=$(ns "$(label "$m")")"
	echo "NAME_$x=$(host_name "$m")"
	echo "CONFIG_$x=$DIR/$(label "$m").toml"
	echo "MRC_$x=$(mrc_address "$m")"
	echo "METRICS_$x='$(metrics_address "$m")'"
	echo "SOCKET_$x=$(socket_path "$m")"
	echo "PORTS_$x=\"${ports# }\""
	echo "ADDRS_$x=\"${addrs# }\""
	echo "GATEWAYS_$x=\"${gws# }\""
}

port_address() {  # plane machine
	if [ "$SHAPE" = clos ]; then clos_address "$1" "$2"; else b2b_address "$1" "$2"; fi
}

clos_switch_nodes() {
	local p l s
	for p in $(seq 0 $((CLOS_PLANES - 1))); do
		for l in $(seq 0 $((CLOS_LEAVES - 1))); do echo "p${p}l$l"; done
		for s in $(seq 0 $((CLOS_SPINES - 1))); do echo "p${p}s$s"; done
	done
}

# ------------------------------------------------------------------------------------------ check

# ICMPv6 echo from SRC to DST inside a namespace (ping(8) is not among the project's packages): prints
# "got/count", exit 0 only when every request was answered.
read -r -d '' ECHO6_PY <<'EOF' || true
import os, socket, struct, sys, time
src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.bind((src, 0))
ident, got = os.getpid() & 0xFFFF, 0
end = time.monotonic() + 1.0  # one second for all of them: a dead path costs one second
for seq in range(count):
    try:
        s.sendto(struct.pack("!BBHHH", 128, 0, 0, ident, seq) + b"mrc-machines", (dst, 0))
    except OSError:  # no route, port down: no reply
        continue
    while (left := end - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            data = s.recv(2048)
        except TimeoutError:
            break
        if len(data) < 8:
            continue
        kind, _code, _sum, who, n = struct.unpack("!BBHHH", data[:8])
        if kind == 129 and who == ident and n == seq:  # our echo reply
            got += 1
            break
print(f"{got}/{count}")
sys.exit(0 if got == count else 1)
EOF

echo6() {  # NODE SRC DST
	ip netns exec "$(ns "$1")" "$(python3_bin)" -c "$ECHO6_PY" "$2" "$3" "$PINGS"
}

passed=0
failed=0
verdict() {  # ok|fail TEXT
	if [ "$1" = ok ]; then
		passed=$((passed + 1))
		echo "PASS $2"
	else
		failed=$((failed + 1))
		echo "FAIL $2"
	fi
}

b2b_check() {
	local k a b dst replies ok
	for k in $(seq 0 $((B2B_PLANES - 1))); do
		for a in 0 1; do
			b=$((1 - a))
			dst=$(b2b_address "$k" "$b")
			ok=ok
			replies=$(echo6 "$(label "$a")" "$(b2b_address "$k" "$a")" "$dst") || ok=fail
			verdict "$ok" "b2b plane $k $(label "$a") $(port_of_plane "$k") -> $(label "$b") $dst ($replies replies)"
		done
	done
}

check_address() { echo "fd99::$(( $1 + 1 ))"; }   # machine m's test address on lo

# The End counter (packets) of a switch's own micro-SID route
end_packets() {  # NODE ID
	ip -n "$(ns "$1")" -s -6 route show table local "$USID_BLOCK:$2::/48" |
		sed -n 's/.* packets \([0-9]*\) .*/\1/p'
}

spine_counters() {  # plane -> "n0 n1"
	local s out=""
	for s in $(seq 0 $((CLOS_SPINES - 1))); do out="$out $(end_packets "p${1}s$s" "$(spine_id "$1" "$s")")"; done
	echo "${out# }"
}

clos_check() {
	local m a b p s
	check_pending=1
	for m in $(seq 0 $((CLOS_MACHINES - 1))); do
		ip -n "$(ns "$(label "$m")")" -6 addr replace "$(check_address "$m")/128" dev lo nodad
	done
	for a in $(seq 0 $((CLOS_MACHINES - 1))); do
		for b in $(seq $((a + 1)) $((CLOS_MACHINES - 1))); do
			for p in $(seq 0 $((CLOS_PLANES - 1))); do
				for s in $(clos_spines "$a" "$b"); do clos_check_path "$p" "$a" "$b" "$s"; done
			done
		done
	done
	check_undo
}

# Steer a's test address to b's through one path and b's back through the same spine; echo both ways
clos_check_path() {
	local p=$1 a=$2 b=$3 s=$4 fwd rev
	# shellcheck disable=SC2046 # one micro-SID a word
	fwd=$(container $(clos_usids "$p" "$a" "$b" "$s"))
	# shellcheck disable=SC2046
	rev=$(container $(clos_usids "$p" "$b" "$a" "$s"))
	if steer "$p" "$a" "$b" "$fwd" && steer "$p" "$b" "$a" "$rev"; then
		clos_echo "$p" "$a" "$b" "$s" "$fwd"
		clos_echo "$p" "$b" "$a" "$s" "$rev"
	else
		verdict fail "$(path_name "$p" "$a" "$b" "$s") $fwd (no test route: a port is down)"
		verdict fail "$(path_name "$p" "$b" "$a" "$s") $rev (no test route: a port is down)"
	fi
	ip -n "$(ns "$(label "$a")")" -6 route del "$(check_address "$b")/128" 2>/dev/null || true
	ip -n "$(ns "$(label "$b")")" -6 route del "$(check_address "$a")/128" 2>/dev/null || true
}

# Route machine a's packets to b's test address through one container (H.Encaps.Red: no SRH)
steer() {  # plane a b container
	ip -n "$(ns "$(label "$2")")" -6 route replace "$(check_address "$3")/128" \
		encap seg6 mode encap.red segs "$4" via "$(clos_gateway "$1" "$2")" dev "$(port_of_plane "$1")"
}

# "clos plane 0 mA -> mC via p0s1": a path is named by its spine, or by the leaf between machines on one
path_name() {  # plane a b spine|-
	local via="p${1}s$4"
	[ "$4" != "-" ] || via="p${1}l$(machine_leaf "$2")"
	echo "clos plane $1 $(label "$2") -> $(label "$3") via $via"
}

# One echo exchange a -> b, and which spine's End saw it: requests and replies, 2 x PINGS packets, all
# through spine s (none through a spine between machines on one leaf)
clos_echo() {
	local p=$1 a=$2 b=$3 s=$4 segs=$5 before after replies ok=ok i want got
	read -ra before <<<"$(spine_counters "$p")"
	replies=$(echo6 "$(label "$a")" "$(check_address "$a")" "$(check_address "$b")") || ok=fail
	read -ra after <<<"$(spine_counters "$p")"
	local seen=""
	for i in $(seq 0 $((CLOS_SPINES - 1))); do
		got=$(( after[i] - before[i] ))
		want=0
		[ "$i" = "$s" ] && want=$((2 * PINGS))
		[ "$got" = "$want" ] || ok=fail
		seen="$seen, p${p}s$i End +$got"
	done
	verdict "$ok" "$(path_name "$p" "$a" "$b" "$s") $segs ($replies replies$seen)"
}

# Remove check's test routes and addresses (also when check fails half-way)
check_undo() {
	local m name
	for m in $(seq 0 $((CLOS_MACHINES - 1))); do
		name=$(ns "$(label "$m")")
		ip -n "$name" -6 route flush root "$CHECK_PREFIX" 2>/dev/null || true
		ip -n "$name" -6 addr del "$(check_address "$m")/128" dev lo 2>/dev/null || true
	done
	check_pending=""
}

# ------------------------------------------------------------------------------------------ teardown

# Stop what still runs in a namespace (an mrcd the tests started), then delete it: its links go with it
netns_del() {
	local name=$1 pids i
	netns_exists_like "^$name\b" || return 0
	pids=$(ip netns pids "$name" 2>/dev/null || true)
	if [ -n "$pids" ]; then
		log "$name: stopping $(echo "$pids" | tr '\n' ' ')"
		# shellcheck disable=SC2086 # one pid a word
		kill -TERM $pids 2>/dev/null || true
		for i in $(seq 20); do
			[ -z "$(ip netns pids "$name" 2>/dev/null)" ] && break
			sleep 0.1
		done
		pids=$(ip netns pids "$name" 2>/dev/null || true)
		# shellcheck disable=SC2086
		[ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
	fi
	ip netns del "$name"
}

teardown() {
	local kind what
	[ -f "$STATE" ] || { log "$DIR: nothing to remove"; return 0; }
	tac "$STATE" | while read -r kind what; do
		case $kind in
		netns) netns_del "$what" || log "could not delete namespace $what" ;;
		file) rm -f -- "$what" ;;
		esac
	done
	rm -f -- "$STATE"
	up_pending=""
}

# ------------------------------------------------------------------------------------------ commands

set_dir() {
	[ -n "${1:-}" ] || usage
	[ -d "$1" ] || die "$1: no such directory"
	DIR=$(cd -- "$1" && pwd)
	STATE=$DIR/state
}

cmd_up() {
	SHAPE=${1:-}
	case $SHAPE in b2b | clos) ;; *) usage ;; esac
	[ -n "${2:-}" ] || usage
	mkdir -p -- "$2"
	set_dir "$2"
	require_host
	probe_next_csid
	[ ! -e "$STATE" ] || die "$DIR already holds machines ($STATE): machines.sh down $DIR first"
	local sock
	sock=$(socket_path 0)
	[ "${#sock}" -le 107 ] || die "$sock: ${#sock} bytes, a socket path holds at most 107: use a shorter DIR"
	SUFFIX=$(new_suffix)
	up_pending=1
	: >"$STATE"
	log "up $SHAPE: suffix $SUFFIX, files in $DIR"
	"${SHAPE}_build"
	write_configs
	write_env
	up_pending=""
	log "up $SHAPE: $(grep -c '^netns' "$STATE") namespaces; source $DIR/env"
}

cmd_check() {
	set_dir "${1:-}"
	load_env
	"${SHAPE}_check"
	echo "check: $passed passed, $failed failed"
	[ "$failed" = 0 ]
}

cmd_link() {
	set_dir "${1:-}"
	local node=${2:-} port=${3:-} how=${4:-}
	[ -n "$node" ] && [ -n "$port" ] || usage
	case $how in down | up) ;; *) usage ;; esac
	load_env
	ip -n "$(ns "$node")" link set "$port" "$how"
	log "$(ns "$node") $port $how"
	[ "$how" = up ] || return 0
	neigh_reset "$node" "$port"
	# put back the routes the kernel dropped with the port; those through a port still down fail
	# (quietly) and come back when that one is repaired
	if [ "$SHAPE" = clos ]; then clos_routes 2>/dev/null || true; fi
}

# Forget what both ends of a repaired cable learnt while it was down: the far end holds INCOMPLETE
# entries that would drop the first packets for seconds
neigh_reset() {
	local name peer
	name=$(ns "$1")
	peer=$(ip -n "$name" -o link show "$2" | sed -n 's/.* link-netns \([^ ]*\).*/\1/p')
	ip -n "$name" neigh flush dev "$2"
	[ -z "$peer" ] || ip -n "$peer" neigh flush all
}

cmd_down() {
	[ -n "${1:-}" ] || usage
	[ -d "$1" ] || { log "$1: no such directory, nothing to remove"; return 0; }
	set_dir "$1"
	teardown
}

main() {
	local cmd=${1:-}
	[ $# -gt 0 ] && shift
	case $cmd in
	up) cmd_up "$@" ;;
	check) cmd_check "$@" ;;
	link) cmd_link "$@" ;;
	down) cmd_down "$@" ;;
	probe) require_host; probe_next_csid ;;
	*) usage ;;
	esac
}

main "$@"
