#!/usr/bin/env bash
# Build the lab's cached inputs once: node template rootfs (with /opt/dsv41-venv), engine rootfs tar,
# Python wheelhouse, root ssh keys. Safe to re-run: finished pieces are kept.
source "$(dirname "$0")/lib.sh"
need_root
need_tools
mkdir -p "$CACHE/logs" "$CACHE/ssh"

bootstrap() {  # bootstrap DIR PACKAGES LOGNAME
    local dir=$1 pkgs=$2 log="$CACHE/logs/$3.log"
    rm -rf "$dir"
    mkdir -p "$CACHE/debs/$3"  # one package cache per build: the two builds run at once
    say "debootstrap $SUITE ($3) from $(mirror), log in $log"
    # Progress: debootstrap's stage lines only (not one line per package).
    if ! debootstrap --variant=minbase --cache-dir="$CACHE/debs/$3" --include="$pkgs" \
            "$SUITE" "$dir" "$(mirror)" < /dev/null 2>&1 | tee "$log" \
            | awk -v n="$3" 'NF > 3 && /^I: / && !/^I: (Validating|Retrieving) / {print "lab:   " n ": " $0; fflush()}' >&2; then
        tail -n 15 "$log" >&2
        rm -rf "$dir"
        die "debootstrap failed (log: $log)"
    fi
    rm -f "$dir"/var/cache/apt/archives/*.deb
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/locale/*
}

wheelhouse() {
    [ -f "$CACHE/wheels/.done" ] && return
    local py=$REPO/.venv/bin/python
    if [ ! -x "$py" ]; then
        [ -x "$CACHE/pip-venv/bin/python" ] || python3 -m venv "$CACHE/pip-venv"
        py=$CACHE/pip-venv/bin/python
    fi
    say "building the wheelhouse for /opt/dsv41-venv"
    rm -rf "$CACHE/wheels.tmp"
    "$py" -m pip wheel -q --wheel-dir "$CACHE/wheels.tmp" "${VENV_REQS[@]}" \
        2> >(grep -v 'is ignored: it is' >&2) || die "pip wheel failed (needs PyPI): ${VENV_REQS[*]}"
    touch "$CACHE/wheels.tmp/.done"
    rm -rf "$CACHE/wheels" && mv "$CACHE/wheels.tmp" "$CACHE/wheels"
}

template() {
    [ "$(cat "$CACHE/template/.lab-template" 2>/dev/null)" = "$TEMPLATE_VERSION" ] && return
    [ ! -e "$STATE/nodes" ] || die "the template needs a rebuild but the lab uses it: run 'make lab-down' first"
    local t=$CACHE/template.tmp
    bootstrap "$t" "$NODE_PKGS" template
    say "configuring the node template"
    rm -f "$t"/etc/ssh/ssh_host_*
    cat > "$t/etc/ssh/sshd_config.d/lab.conf" <<'CONF'
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
HostKey /etc/ssh/ssh_host_ed25519_key
CONF
    : > "$t/etc/machine-id"
    install -d -m 700 "$t/root/.ssh"
    # Docker needs the v1 cgroup controllers writable; nspawn mounts them read-only.
    cat > "$t/etc/systemd/system/lab-cgroup-rw.service" <<CONF
[Unit]
Description=Make cgroup v1 controllers writable for dockerd (lab)
DefaultDependencies=no
Before=containerd.service docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for c in ${CGROUP_CONTROLLERS[*]}; do mount -o remount,bind,rw /sys/fs/cgroup/\$c; done'

[Install]
WantedBy=multi-user.target
CONF
    ln -sf /etc/systemd/system/lab-cgroup-rw.service "$t/etc/systemd/system/multi-user.target.wants/"
    for u in ssh.service docker.service containerd.service; do
        [ -e "$t/etc/systemd/system/multi-user.target.wants/$u" ] \
            || ln -sf "/lib/systemd/system/$u" "$t/etc/systemd/system/multi-user.target.wants/$u"
    done
    for u in console-getty.service getty@.service apt-daily.timer apt-daily-upgrade.timer \
             dpkg-db-backup.timer e2scrub_all.timer fstrim.timer; do
        ln -sf /dev/null "$t/etc/systemd/system/$u"
    done
    say "installing /opt/dsv41-venv offline from the wheelhouse"
    cp -a "$CACHE/wheels" "$t/tmp/wheels"
    chroot "$t" python3 -m venv /opt/dsv41-venv
    chroot "$t" env -i PATH=/usr/bin:/bin HOME=/root /opt/dsv41-venv/bin/pip install -q --no-index --find-links /tmp/wheels "${VENV_REQS[@]}" \
        || die "installing the venv into the template failed"
    rm -rf "$t/tmp/wheels"
    echo "$TEMPLATE_VERSION" > "$t/.lab-template"
    rm -rf "$CACHE/template" && mv "$t" "$CACHE/template"
}

engine_rootfs() {
    [ -f "$CACHE/engine-rootfs.tar" ] && return
    local t=$CACHE/engine.tmp
    bootstrap "$t" "$ENGINE_PKGS" engine
    tar --numeric-owner -C "$t" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
        -cf "$CACHE/engine-rootfs.tar.tmp" .
    mv "$CACHE/engine-rootfs.tar.tmp" "$CACHE/engine-rootfs.tar"
    rm -rf "$t"
}

keys() {
    local k
    for k in id_ed25519 head_id_ed25519; do
        [ -f "$CACHE/ssh/$k" ] || ssh-keygen -q -t ed25519 -N '' -C "dsv41-lab-$k" -f "$CACHE/ssh/$k"
    done
}

start=$SECONDS
keys
wheelhouse
engine_rootfs & engine_job=$!  # the two debootstraps overlap: mostly waiting on the network and dpkg
template
wait $engine_job || die "building the engine rootfs failed"
say "cache ready in $CACHE ($((SECONDS - start)) s; $(du -sh "$CACHE" | cut -f1))"
