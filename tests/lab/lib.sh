# Shared settings and helpers for the two-node lab scripts (sourced, not run).
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$LAB_DIR/../.." && pwd)
CACHE=${LAB_CACHE:-/var/cache/dsv41-lab}
STATE=${LAB_STATE:-/var/lib/dsv41-lab}
# LAB_NODES nodes: head (198.51.100.11) and worker1..workerN-1 (198.51.100.13, .14, ...), each in its
# own network namespace, all on one "fabric": a bridge in the namespace `fabric`, reached from every
# node through its interface fab0.
LAB_NODES=${LAB_NODES:-2}
[[ $LAB_NODES =~ ^[2-8]$ ]] || { printf 'lab: LAB_NODES=%s: expected 2 to 8 nodes\n' "$LAB_NODES" >&2; exit 2; }
NODES=(head)
declare -A IP=([head]=198.51.100.11)
for ((i = 1; i < LAB_NODES; i++)); do NODES+=("worker$i"); IP[worker$i]=198.51.100.$((12 + i)); done
FABRIC_IF=fab0
REGISTRY=198.51.100.11:5000
SUITE=bookworm
NODE_PKGS=systemd,systemd-sysv,dbus,openssh-server,rsync,python3,python3-venv,iproute2,iputils-ping,docker.io,iptables,curl,ca-certificates,procps,prometheus,prometheus-node-exporter,prometheus-alertmanager,haproxy
# Debian ships these services enabled. The lab masks Debian's Prometheus, Alertmanager and HAProxy (dsv41 runs its own
# units) and only disables the exporter: `doit launch` enables it, with a drop-in, where METRICS_DIR is set.
NODE_MASKED=(prometheus.service prometheus-alertmanager.service haproxy.service)
NODE_DISABLED=(prometheus-node-exporter.service)
ENGINE_PKGS=python3
VLLM_PKGS=python3,python3-venv,python3-dev,libnuma1,g++   # g++ and the headers: torch compiles its CPU kernels
# The head's /opt/dsv41-venv gets the project's own pinned dependencies (one list: pyproject.toml).
mapfile -t VENV_REQS < <(python3 -c 'import sys, tomllib; print(*tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"], sep="\n")' "$REPO/pyproject.toml")
NODE_TOOLS=(py-spy==0.4.3)            # every node's /usr/local/bin: incident evidence (stacks of stuck ranks)
# The cached template is rebuilt when its recipe (bump TEMPLATE_VERSION) or the dependencies change.
TEMPLATE_VERSION="7 ${VENV_REQS[*]} ${NODE_TOOLS[*]}"
LAB_ENGINE=${LAB_ENGINE:-standin}     # the lab's engine: standin (tests/lab/engine) or vllm (tests/lab/vllm)
case $LAB_ENGINE in standin|vllm) ;; *) printf 'lab: LAB_ENGINE=%s: expected standin or vllm\n' "$LAB_ENGINE" >&2; exit 2;; esac
VLLM=$CACHE/vllm                     # the real engine's rootfs tar and the tiny model's Hub repo
NODE_CACHE=/srv/dsv41-lab-cache      # $CACHE as the head sees it (read-only)
CGROUP_CONTROLLERS=(cpu cpuacct cpuset memory devices freezer blkio pids)

say() { printf 'lab: %s\n' "$*" >&2; }
die() { printf 'lab: %s\n' "$*" >&2; exit 2; }

need_root() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces, systemd-nspawn): run as root"
}

need_tools() {
    local t missing=()
    for t in systemd-nspawn debootstrap docker-registry ssh ssh-keygen rsync ip curl; do
        command -v "$t" >/dev/null || missing+=("$t")
    done
    [ ${#missing[@]} = 0 ] || die "missing ${missing[*]}: run 'bash tests/setup/lab.sh' as root"
}

# The Debian mirror configured for apt (deb822 .sources or one-line .list), overridable by LAB_MIRROR.
mirror() {
    if [ -n "${LAB_MIRROR:-}" ]; then echo "$LAB_MIRROR"; return; fi
    local m
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | awk '$1=="deb" && $0 ~ (" " s "( |$)") {for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' s="$SUITE" || true)
    if [ -z "$m" ]; then
        m=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$SUITE" '
            /^$/ {if (ok && uri) {print uri; exit} ok=0; uri=""}
            /^URIs:/ {uri=$2}
            /^Suites:/ {for(i=2;i<=NF;i++) if ($i==s) ok=1}
            END {if (ok && uri) print uri}' | head -n1 || true)
    fi
    [ -n "$m" ] || die "no Debian $SUITE mirror in /etc/apt/sources.list*: set LAB_MIRROR=<url>"
    echo "$m"
}

# Who brought the lab up: the checkout, then what for (LAB_FOR: lab-up, demo, tests, bench). A lab is
# used only by its own checkout, for what it was brought up for, or when `make lab-up` made it.
OWNER=$STATE/owner
LAB_FOR=${LAB_FOR:-lab-up}

claim_lab() {  # one line and exit 2 when a lab (up or partial) is another checkout's, or made for another use
    [ -e "$STATE" ] || ip netns list | grep -wE '^(head|worker[0-9]*|fabric)' >/dev/null || return 0
    local repo="" for=""
    { read -r repo; read -r for; } < "$OWNER" 2>/dev/null || true
    [ "$repo" = "$REPO" ] && { [ "$for" = "$LAB_FOR" ] || [ "$for" = lab-up ]; } && return 0
    local who="$for from $repo" by=$repo
    [ -n "$repo" ] || { who="not recorded as any checkout's"; by=$REPO; }
    die "the lab that is up is $who, not this one's ($LAB_FOR from $REPO): take it down with 'make -C $by lab-down' (it stops what runs there), then try again"
}

lab_nodes() {  # the nodes of the lab that is up (whatever LAB_NODES says now)
    [ -d "$STATE/nodes" ] && ls "$STATE/nodes"
}

lab_ssh() {  # lab_ssh NODE CMD... : run on a node from the host
    local node=$1; shift
    ip netns exec head ssh -F "$STATE/ssh_config" "$node" -- "$@"
}

node_pid() {  # PID of the systemd-nspawn process of a node, if alive
    local f="$STATE/$1.pid" p
    [ -f "$f" ] || return 1
    p=$(cat "$f")
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"
}

boot_node() {  # boot_node NODE: start its systemd-nspawn in the background (up.sh, reboot.sh)
    local n=$1 binds h
    # /var/lib/docker on the host's filesystem: overlay2 cannot stack on the overlay root.
    binds=("--bind=$STATE/nodes/$n/docker:/var/lib/docker")
    # the head also sees the repo (doit runs there) and the cache (engine images, the Hub stand-in's repo)
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
}

wait_for() {  # wait_for SECONDS WHAT LOG CMD...: poll CMD; on timeout fail with LOG's tail
    local t=$1 what=$2 log=$3 end=$(($SECONDS + $1)); shift 3
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || die "$what not ready after ${t} s: $(tail -n 3 "$log" 2>/dev/null | tr '\n' ' ')"
        sleep 0.3
    done
}

node_ready() {  # node_ready NODE: wait until ssh, systemd and dockerd answer on a booting node
    local n=$1 st
    wait_for 60 "ssh on $n" "$STATE/$n.console.log" lab_ssh "$n" true
    st=$(lab_ssh "$n" systemctl is-system-running --wait || true)
    [ "$st" = running ] || say "$n: systemd is $st; failed units: $(lab_ssh "$n" systemctl --failed --plain --no-legend | tr '\n' ' ')"
    wait_for 60 "docker on $n" /dev/null lab_ssh "$n" docker info
}
