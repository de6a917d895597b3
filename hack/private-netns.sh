#!/usr/bin/env bash
# Development only: run a command in a private network + mount namespace with an address of its own, so
# a second local cluster there (its own PGOP_STATE, hence its own cgroup root) collides with nothing of
# the host's cluster: ports, bridge, iptables, pod netns files and the containerd run directory.
# Usage: unshare --net --mount hack/private-netns.sh <last octet 2-254> <state dir> <command...>
set -euo pipefail
octet=$1 state=$2; shift 2
ip link set lo up
ip link add "lkh${octet}a" type veth peer name "lkh${octet}b"
ip link set "lkh${octet}b" up
ip addr add "192.0.2.${octet}/24" dev "lkh${octet}a"
ip link set "lkh${octet}a" up
ip route add default via 192.0.2.1 dev "lkh${octet}a" onlink
mount --make-rprivate /
# The namespace starts with copies of the host cluster's mounts (containerd rootfs/shm, pod netns
# files); detach those copies here (private propagation: the host keeps its own) so this cluster's
# teardown neither sees nor reports them, then give both directories fresh tmpfs.
for d in /run/pg-operator-localkube /run/netns; do
  findmnt -rn -o TARGET | awk -v d="$d" 'index($0, d "/") == 1 || $0 == d' | sort -r | xargs -r umount -l
  mkdir -p "$d"; mount -t tmpfs tmpfs "$d"
done
export PGOP_STATE=$state
exec "$@"
