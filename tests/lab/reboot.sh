#!/usr/bin/env bash
# tests/lab/reboot.sh NODE: reboot one node of the lab that is up. Its systemd powers it off in order
# (SIGTERM to its systemd-nspawn, as down.sh does; killed after 20 s), then it boots again as up.sh boots
# it: the same root (what it wrote survives, as on a disk), namespace, binds and cgroups. Returns once
# ssh, systemd and dockerd answer again, as up.sh waits for them.
source "$(dirname "$0")/lib.sh"
need_root
n=${1:-}
lab_nodes | grep -x -- "$n" >/dev/null || die "usage: tests/lab/reboot.sh NODE (NODE: $(lab_nodes | tr '\n' ' ')the lab must be up)"
exec 9>/run/dsv41-lab.lock
flock 9
start=$SECONDS

p=$(node_pid "$n") || die "$n is not running"
kill -TERM "$p"
end=$((SECONDS + 20))
while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
kill -0 "$p" 2>/dev/null && { say "$n did not power off in 20 s; killing it"; kill -KILL "$p"; sleep 0.5; }
left=$(cat /sys/fs/cgroup/unified/lab-$n/cgroup.procs 2>/dev/null || true)
[ -z "$left" ] || { say "$n: killing what outlived its poweroff: $(echo $left)"; kill -KILL $left 2>/dev/null || true; }
say "$n powered off in $((SECONDS - start)) s; booting it again"

boot_node "$n"
node_ready "$n"
say "$n rebooted in $((SECONDS - start)) s"
