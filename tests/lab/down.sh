#!/usr/bin/env bash
# make lab-down: power the nodes off, stop the registry, remove namespaces, cgroups and node roots;
# then check nothing is left. Keeps the cache (/var/cache/dsv41-lab).
source "$(dirname "$0")/lib.sh"
need_root
exec 9>/run/dsv41-lab.lock.down
flock 9
start=$SECONDS

mapfile -t NODES < <(lab_nodes)          # the lab that is up, whatever LAB_NODES says now
NETNS=("${NODES[@]}" fabric)
pids=()
for n in "${NODES[@]}"; do
    p=$(node_pid "$n") || continue
    pids+=("$p")
    kill -TERM "$p"  # systemd-nspawn turns SIGTERM into an orderly poweroff of the node
done
end=$((SECONDS + 20))
for p in "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
    kill -0 "$p" 2>/dev/null && { say "node (pid $p) did not power off in time; killing it"; kill -KILL "$p"; }
done
if p=$(cat "$STATE/registry.pid" 2>/dev/null) && kill -0 "$p" 2>/dev/null; then
    kill -TERM "$p"; sleep 0.2; kill -0 "$p" 2>/dev/null && kill -KILL "$p"
fi

lab_cgroups() { find /sys/fs/cgroup/*/ -maxdepth 1 -type d \( -name 'lab-head*' -o -name 'lab-worker*' \) 2>/dev/null; }
# Stragglers: processes still in our namespaces or our cgroups.
for i in 1 2 3; do
    left=$( { for n in "${NETNS[@]}"; do ip netns pids "$n" 2>/dev/null; done
              for c in $(lab_cgroups); do find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null; done; } | sort -u)
    [ -z "$left" ] && break
    kill -KILL $left 2>/dev/null || true
    sleep 0.3
    left=$( { for n in "${NETNS[@]}"; do ip netns pids "$n" 2>/dev/null; done
              for c in $(lab_cgroups); do find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null; done; } | sort -u)
done
for n in $(ip netns list | awk '{print $1}' | grep -xE 'head|worker[0-9]*|fabric'); do ip netns del "$n" 2>/dev/null || true; done
for c in $(lab_cgroups); do find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true; done

for r in "$STATE"/nodes/*/root; do mountpoint -q "$r" && umount "$r"; done
if grep -q " $STATE" /proc/self/mountinfo; then
    die "mounts under $STATE remain; not deleting it: $(grep " $STATE" /proc/self/mountinfo | cut -d' ' -f5 | tr '\n' ' ')"
fi
rm -rf --one-file-system "$STATE"

leftover=()
for n in $(ip netns list | awk '{print $1}' | grep -xE 'head|worker[0-9]*|fabric'); do leftover+=("netns $n"); done
[ -z "$(lab_cgroups)" ] || leftover+=("cgroups $(lab_cgroups | tr '\n' ' ')")
grep -qE "/run/netns/(head|worker[0-9]*|fabric) " /proc/self/mountinfo && leftover+=("netns mounts")
[ -z "${left:-}" ] || leftover+=("processes $left")
[ ${#leftover[@]} = 0 ] || die "down, but left behind: ${leftover[*]}"
say "down in $((SECONDS - start)) s: no namespace, mount, cgroup or process left"
