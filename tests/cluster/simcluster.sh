#!/usr/bin/env bash
# simcluster.sh — reshard's simulated cluster: N "nodes" on this machine, each a network namespace
# with its own address on a private bridge, and MPICH ranks started inside them, so that ranks on
# different nodes talk TCP across the bridge (and through each node's own link counters) instead
# of shared memory. The filesystem stays shared by all nodes, like a cluster's parallel filesystem.
#
# Usage (as root; needs iproute2 and MPICH's hydra mpiexec):
#   simcluster.sh up N [RATE]          create nodes 0..N-1; RATE (e.g. 1gbit, 200mbit) caps every
#                                      node's link in both directions with a tbf qdisc
#   simcluster.sh run PPN -- CMD...    run CMD as N*PPN MPI ranks, PPN per node, in the cwd
#   simcluster.sh exec NODE -- CMD...  run CMD inside node NODE's namespace
#   simcluster.sh link NODE up|down    bring a node's link up or down (a lost node)
#   simcluster.sh pids NODE [NAME]     processes inside a node (named NAME), one pid a line
#   simcluster.sh counters             one line per node: NODE ADDRESS RX_BYTES TX_BYTES
#   simcluster.sh status               what exists for this id
#   simcluster.sh host-address         the host's address on the bridge, which nodes reach
#   simcluster.sh down                 remove everything this id created (idempotent)
#   simcluster.sh reap                 remove every id's cluster whose owner process is gone
#
# SIMCLUSTER_ID (1..250, default 1) names everything (bridge rsc<ID>br, namespaces rsc<ID>n<I>,
# subnet 10.213.<ID>.0/24), so parallel test runs each use their own id. `up` claims the id
# atomically by creating the bridge and records its owner (SIMCLUSTER_OWNER, default the calling
# process) in the bridge's alias; it exits 3 when a live owner holds the id, and reclaims an id
# whose owner died without `down`. A failed `up` removes what it built.
#
# Transport: MPICH built for ch4:ucx uses UCX, told to use TCP (UCX_TLS=tcp,self) on the node's
# link only (UCX_NET_DEVICES=eth0: every node's link is called eth0 inside its namespace), with
# ucx_close_at_destroy.c preloaded against a finalize deadlock of MPICH 4.0 over UCX tcp
# (SIMCLUSTER_SHIM=0 leaves it out, to see reshard end a job whose MPI_Finalize hangs);
# ch4:ofi builds get FI_PROVIDER=tcp. Ranks on one node still share memory, as on a real node.
# Hydra starts one proxy per node through this script (-launcher-exec), which stands in for ssh.
#
# The host has the address <subnet>.254 on the bridge (`host-address` prints it), so that the
# nodes reach a server the test runs on the host (an S3 server bound there). SIMCLUSTER_PRIVATE=DIR
# (an existing directory) gives every node of a `run` its own empty tmpfs mounted at DIR, which no
# other node sees (a node's local disk, as on a cloud GPU cluster without a shared file system);
# the rest of the file system stays shared.
set -euo pipefail

ID=${SIMCLUSTER_ID:-1}
if ! [[ $ID =~ ^[0-9]+$ ]] || ((ID < 1 || ID > 250)); then
  echo "simcluster: SIMCLUSTER_ID must be 1..250, not '$ID'" >&2
  exit 2
fi
TAG=rsc$ID
BRIDGE=${TAG}br
SUBNET=10.213.$ID
LINK=eth0
SELF=$(readlink -f "$0")

die() { echo "simcluster[$ID]: $*" >&2; exit 1; }
ns_of() { echo "${TAG}n$1"; }
addr_of() { echo "$SUBNET.$(($1 + 1))"; }
host_addr() { echo "$SUBNET.254"; }
host_end() { echo "${TAG}h$1"; }  # the bridge-side end of node I's link

# The namespaces of this id, in node order.
nodes() {
  ip netns list | awk '{print $1}' | { grep -E "^${TAG}n[0-9]+$" || true; } | sort -V
}
node_count() { nodes | wc -l; }

# "owner=PID nodes=N rate=R" from the bridge's alias, empty when there is no bridge.
claim_info() { cat "/sys/class/net/$BRIDGE/ifalias" 2>/dev/null || true; }

# tbf needs a bucket of at least one maximum-size (GSO) packet and about a timer tick of traffic.
burst_for() {
  local rate=$1 num unit bits
  [[ $rate =~ ^([0-9]+)([kmgt]?)bit$ ]] || die "rate must look like 100mbit or 1gbit, not '$rate'"
  num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[2]}
  case $unit in k) bits=$((num * 1000)) ;; m) bits=$((num * 1000000)) ;;
    g) bits=$((num * 1000000000)) ;; t) bits=$((num * 1000000000000)) ;; *) bits=$num ;; esac
  local b=$((bits / 8 / 250))  # 4 ms of traffic
  ((b < 131072)) && b=131072
  echo "$b"
}

# Whether node 0 reaches ADDRESS: a TCP connect to a closed port there is refused at once when
# the path works, and times out when it does not (no ping needed).
reachable() {
  local out
  out=$(ip netns exec "$(ns_of 0)" timeout 2 bash -c "exec 3<>/dev/tcp/$1/9" 2>&1 || true)
  [[ $out == *refused* ]]
}

# Removes everything of this id. Processes still inside a node (ranks cut off by a downed link)
# are killed first: a namespace with processes in it outlives `ip netns del`, and with it its
# link, which would collide with the next `up`.
teardown() {
  local ns pid link
  for ns in $(nodes); do
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
      kill -9 "$pid" 2>/dev/null || true
    done
  done
  # Deleting one end of a veth pair deletes both, at once (namespace cleanup is asynchronous).
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | { grep -E "^${TAG}h[0-9]+$" || true; }); do
    ip link del "$link" 2>/dev/null || true
  done
  for ns in $(nodes); do ip netns del "$ns" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
}

cmd_up() {
  local n=${1:?usage: up N [RATE]} rate=${2:-}
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then die "N must be 1..200"; fi
  [[ $(id -u) == 0 ]] || die "needs root"
  local owner=${SIMCLUSTER_OWNER:-$PPID}
  # Claims are made one at a time on this machine, so that a claim and its owner record (or the
  # reclaim of a stale id) are never seen half done.
  exec 9>/tmp/reshard-simcluster.lock
  flock 9
  if ! ip link add "$BRIDGE" type bridge 2>/dev/null; then
    local info old
    info=$(claim_info)
    old=$(sed -n 's/.*owner=\([0-9]*\).*/\1/p' <<<"$info")
    if [[ -z $old ]] || kill -0 "$old" 2>/dev/null; then
      echo "simcluster[$ID]: id in use ($info)" >&2
      exit 3
    fi
    echo "simcluster[$ID]: reclaiming a stale cluster ($info)" >&2
    teardown
    ip link add "$BRIDGE" type bridge
  fi
  # From here on this invocation owns the id: undo everything if any step fails.
  trap 'echo "simcluster[$ID]: up failed, removing what it built" >&2; teardown' ERR
  ip link set "$BRIDGE" alias "owner=$owner nodes=$n rate=${rate:-none}"
  exec 9>&-
  ip addr add "$(host_addr)/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local burst=
  [[ -n $rate ]] && burst=$(burst_for "$rate")
  local i ns
  for ((i = 0; i < n; i++)); do
    ns=$(ns_of "$i")
    ip netns add "$ns"
    # Created as <tag>h<i> / <tag>t<i>, the node's end then renamed to eth0 inside its namespace.
    ip link add "$(host_end "$i")" type veth peer name "${TAG}t$i"
    ip link set "${TAG}t$i" netns "$ns"
    ip -n "$ns" link set "${TAG}t$i" name "$LINK"
    ip -n "$ns" addr add "$(addr_of "$i")/24" dev "$LINK"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$LINK" up
    ip link set "$(host_end "$i")" master "$BRIDGE"
    ip link set "$(host_end "$i")" up
    if [[ -n $rate ]]; then
      # Node egress on its end, node ingress on the bridge's end: a full-duplex link at RATE.
      tc -n "$ns" qdisc add dev "$LINK" root tbf rate "$rate" burst "$burst" latency 50ms
      tc qdisc add dev "$(host_end "$i")" root tbf rate "$rate" burst "$burst" latency 50ms
    fi
  done
  trap - ERR
  # Node 0 (where mpiexec runs) must reach every node before anyone launches ranks.
  for ((i = 1; i < n; i++)); do
    local tries=0
    until reachable "$(addr_of "$i")"; do
      tries=$((tries + 1))
      if ((tries > 20)); then teardown; die "node 0 cannot reach node $i"; fi
      sleep 0.1
    done
  done
  echo "simcluster[$ID]: $n nodes on $SUBNET.0/24${rate:+, links capped at $rate}"
}

cmd_run() {
  local ppn=${1:?usage: run PPN -- CMD...}
  shift
  [[ ${1:-} == -- ]] && shift
  (($# > 0)) || die "usage: run PPN -- CMD..."
  local n hosts="" i
  n=$(node_count)
  ((n > 0)) || die "no nodes: run 'up' first"
  for ((i = 0; i < n; i++)); do hosts+="$(addr_of "$i"):$ppn,"; done
  export SIMCLUSTER_ID=$ID
  local shim=()
  if [[ ${SIMCLUSTER_SHIM:-1} != 0 ]] && mpich_over_ucx; then
    local so
    so=$(finalize_shim) && shim=(-genv LD_PRELOAD "$so")
  fi
  # mpiexec lives on node 0; -localhost makes the proxies call it back at node 0's address
  # (hydra would otherwise pass this machine's hostname, which names 127.0.0.1 everywhere).
  # No shared-memory transport in UCX_TLS: UCX would take it between namespaces (they share
  # /dev/shm), bypassing the network; MPICH still uses its own shared memory within a node.
  exec ip netns exec "$(ns_of 0)" unshare --uts "$SELF" hostname-and-exec 0 "$SELF" private \
    mpiexec -launcher ssh -launcher-exec "$SELF" \
    -hosts "${hosts%,}" -n $((n * ppn)) -localhost "$(addr_of 0)" \
    -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES "$LINK" -genv FI_PROVIDER tcp \
    "${shim[@]}" -genv SIMCLUSTER_ID "$ID" "$@"
}

mpich_over_ucx() {
  command -v mpichversion >/dev/null && mpichversion 2>/dev/null | grep -q 'ch4:ucx'
}

# Builds (once per source version, shared by parallel runs) the preload library that works
# around MPICH 4.0's finalize deadlock over UCX tcp (see ucx_close_at_destroy.c) and prints its
# path. Without a C compiler it warns and prints nothing: runs may then hang in MPI_Finalize
# (reshard still ends them, after its finalize deadline: RESHARD_FINALIZE_TIMEOUT, 10 s).
finalize_shim() {
  local src sum so
  src=$(dirname "$SELF")/ucx_close_at_destroy.c
  sum=$(cksum <"$src" | cut -d' ' -f1)
  so=${TMPDIR:-/tmp}/reshard-simcluster-$sum.so
  if [[ ! -e $so ]]; then
    local cc
    cc=$(command -v cc || command -v gcc || true)
    if [[ -z $cc ]]; then
      echo "simcluster[$ID]: no C compiler: MPI_Finalize may hang (MPICH 4.0 over UCX tcp)" >&2
      return 1
    fi
    "$cc" -shared -fPIC -O2 -o "$so.$$" "$src" && mv -f "$so.$$" "$so"
  fi
  echo "$so"
}

# Hydra's "ssh": [-x] HOST COMMAND. The command arrives as shell words, as ssh would pass them.
cmd_launch() {
  [[ ${1:-} == -x ]] && shift
  local host=$1
  shift
  [[ $host == "$SUBNET".* ]] || die "launcher: $host is not a node of this cluster"
  local i=$((${host##*.} - 1))
  exec ip netns exec "$(ns_of "$i")" unshare --uts "$SELF" hostname-and-exec "$i" \
    "$SELF" private sh -c "exec $*"
}

# With SIMCLUSTER_PRIVATE set: COMMAND in a mount namespace of its own, with a fresh tmpfs at
# that directory (the node's local disk); without it, COMMAND as it is.
cmd_private() {
  if [[ -n ${SIMCLUSTER_PRIVATE:-} ]]; then
    exec unshare -m --propagation private \
      sh -c 'mount -t tmpfs simcluster-local "$0" && exec "$@"' "$SIMCLUSTER_PRIVATE" "$@"
  fi
  exec "$@"
}

# Inside a node's own UTS namespace: name it node<I>, so that what ranks report about their
# host tells the nodes apart, then become COMMAND.
cmd_hostname_and_exec() {
  local i=$1
  shift
  hostname "node$i"
  exec "$@"
}

cmd_exec() {
  local i=${1:?usage: exec NODE -- CMD...}
  shift
  [[ ${1:-} == -- ]] && shift
  exec ip netns exec "$(ns_of "$i")" "$@"
}

cmd_link() {
  local i=${1:?usage: link NODE up|down} state=${2:?usage: link NODE up|down}
  [[ $state == up || $state == down ]] || die "link state must be up or down"
  ip -n "$(ns_of "$i")" link set "$LINK" "$state"
}

# Processes running inside node NODE (optionally only those whose command name is NAME).
cmd_pids() {
  local i=${1:?usage: pids NODE [NAME]} name=${2:-} pid comm
  for pid in $(ip netns pids "$(ns_of "$i")"); do
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    [[ -z $name || $comm == "$name" ]] && echo "$pid"
  done
  return 0
}

cmd_counters() {
  local ns i=0 rx tx
  for ns in $(nodes); do
    rx=$(ip netns exec "$ns" cat "/sys/class/net/$LINK/statistics/rx_bytes")
    tx=$(ip netns exec "$ns" cat "/sys/class/net/$LINK/statistics/tx_bytes")
    echo "$i $(addr_of "$i") $rx $tx"
    i=$((i + 1))
  done
}

cmd_status() {
  local info
  info=$(claim_info)
  if [[ -z $info ]] && [[ -z $(nodes) ]]; then
    echo "simcluster[$ID]: down"
    return
  fi
  echo "simcluster[$ID]: bridge $BRIDGE ($info), subnet $SUBNET.0/24"
  echo "node address rx_bytes tx_bytes"
  cmd_counters
}

# Removes the clusters of every id whose owner is gone (a test run killed before its `down`).
cmd_reap() {
  local br id owner
  for br in $(ip -o link show type bridge | awk -F': ' '{print $2}' | { grep -E '^rsc[0-9]+br$' || true; }); do
    id=${br#rsc}; id=${id%br}
    owner=$(sed -n 's/.*owner=\([0-9]*\).*/\1/p' "/sys/class/net/$br/ifalias" 2>/dev/null || true)
    if [[ -z $owner ]] || ! kill -0 "$owner" 2>/dev/null; then
      echo "simcluster: removing stale cluster $id" >&2
      SIMCLUSTER_ID=$id "$SELF" down
    fi
  done
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  run) shift; cmd_run "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  link) shift; cmd_link "$@" ;;
  pids) shift; cmd_pids "$@" ;;
  hostname-and-exec) shift; cmd_hostname_and_exec "$@" ;;
  private) shift; cmd_private "$@" ;;
  host-address) host_addr ;;
  counters) cmd_counters ;;
  status) cmd_status ;;
  down) teardown ;;
  reap) cmd_reap ;;
  -x | 10.213.*) cmd_launch "$@" ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SELF" >&2; exit 2 ;;
esac
