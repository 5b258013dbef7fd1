#!/usr/bin/env bash
# tests/lab/reboot.sh NODE: reboot one node of the lab that is up. Its systemd powers it off in order
# (SIGTERM to its systemd-nspawn, as down.sh does; killed after 20 s), then it boots again as up.sh boots
# it: the same root (what it wrote survives, as on a disk), namespace, binds and cgroups. Returns once
# ssh, systemd and dockerd answer again, as up.sh waits for them.
source "$(dirname "$0")/lib.sh"
need_root
n=${1:-}
lab_nodes | grep -qx -- "$n" || die "usage: tests/lab/reboot.sh NODE (NODE: $(lab_nodes | tr '\n' ' ')the lab must be up)"
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

# as up.sh boots a node
binds=("--bind=$STATE/nodes/$n/docker:/var/lib/docker")
[ "$n" = head ] && binds+=("--bind=$REPO" "--bind-ro=$CACHE:$NODE_CACHE")
for h in systemd unified; do mkdir -p "/sys/fs/cgroup/$h/lab-$n"; done
(
    echo "$BASHPID" > "/sys/fs/cgroup/systemd/lab-$n/cgroup.procs"
    echo "$BASHPID" > "/sys/fs/cgroup/unified/lab-$n/cgroup.procs"
    SYSTEMD_NSPAWN_API_VFS_WRITABLE=1 SYSTEMD_SECCOMP=0 exec setsid systemd-nspawn \
        -D "$STATE/nodes/$n/root" -M "$n" -b --keep-unit --register=no --capability=all \
        --network-namespace-path="/run/netns/$n" --console=pipe "${binds[@]}"
) < /dev/null >> "$STATE/$n.console.log" 2>&1 9>&- &
echo $! > "$STATE/$n.pid"

end=$((SECONDS + 60))
until lab_ssh "$n" true >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "ssh on $n not back after 60 s: $(tail -n 3 "$STATE/$n.console.log" | tr '\n' ' ')"
    sleep 0.3
done
st=$(lab_ssh "$n" systemctl is-system-running --wait || true)
[ "$st" = running ] || say "$n: systemd is $st; failed units: $(lab_ssh "$n" systemctl --failed --plain --no-legend | tr '\n' ' ')"
end=$((SECONDS + 60))
until lab_ssh "$n" docker info >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "docker on $n not back after 60 s"
    sleep 0.3
done
say "$n rebooted in $((SECONDS - start)) s"
