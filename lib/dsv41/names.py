"""Every name and path dsv41 uses on a node, defined once. Standard library only: shipped to nodes.

On every node, $STATE_DIR holds:
    lib/                 the shipped package (node code runs from here)
    memguard.json        the memory guard's floor and mode (re-read on `systemctl reload`)
    memguard.tripped     the trip marker: while it exists no rank unit starts
    memguard.log         the guard's log (also in the journal)
    checkpoint-receipt.json  what was verified in the model dir (size, mtime, sha256)
    plans/<plan>         the EXL3 plan with bank paths rewritten for the container (/plans)
    cache/<key>/         the engine's kernel and compile caches, one folder per image (/cache in the
                         container; <key>: cache_key(image)), one subfolder per library (ENGINE_CACHES)
    run/                 cidfiles of the rank containers
    secrets/api_key      rank 0 only: the API key, 0600, mounted read-only into its container
    sidedoor/            a serving group's first node off the head: its side door's config and key map
and on the head also api_key (the key, 0600), units/r<N>/ (rendered units), doit.db (doit's own
record of what ran), doit.lock (the run lock), image.stamp (the image ids `doit image` saw), ssh/ (ssh
master sockets), releases/ (one folder per release), incidents/ (one evidence folder per
incident), monitoring/, needs-reboot.json, and the watchdog's watchdog.json (its settings),
watchdog.status.json (what it last saw), watchdog.gaveup (while it exists the watchdog is hands-off),
incidents.jsonl and ready.json (when a readiness wait last saw a token). The head reads and writes its
files through dsv41.head.core.statefiles, each into a typed value whose shape is checked. In MODEL_DIR,
.cache/dsv41/download.json records what `doit download` fetched (each file's etag, size and mtime).
"""
import hashlib
import os
import re

DEFAULT_STATE_DIR = "~/.dsv41-two-sparks"   # STATE_DIR's default, on every node (each resolves ~ itself)
UNIT_DIR = "/etc/systemd/system"
MEMGUARD_UNIT = "dsv41-memguard.service"
WATCHDOG_UNIT = "dsv41-watchdog.service"
WATCHDOG_BY = "dsv41-watchdog"                     # who carries a release on when its process died
RANK_PREFIX = "dsv41-r"
RANK_NAME_RE = re.compile(rf"^{re.escape(RANK_PREFIX)}(\d+)$")
RANK_UNIT_RE = re.compile(rf"\b{re.escape(RANK_PREFIX)}(\d+)\.service\b")
RANK_ENV = "DSV41_RANK"               # set in every rank container: the guard finds rank processes by it

LIB = "lib"
GUARD_SETTINGS = "memguard.json"
TRIP_MARKER = "memguard.tripped"
GUARD_LOG = "memguard.log"
RECEIPT = "checkpoint-receipt.json"
PLANS = "plans"
CACHE = "cache"
CONTAINER_CACHE = "/cache"            # where a rank's container sees its image's cache folder
# Every cache the engine keeps across a restart: (library, the variable the library reads, its folder under
# cache/<key>/), each variable pointing the library at /cache/<folder> (docs/operating.md says where each
# library reads it). XDG_CACHE_HOME=/cache stays for whatever else follows it.
ENGINE_CACHES = (
    ("vLLM", "VLLM_CACHE_ROOT", "vllm"),
    ("torch inductor", "TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("Triton", "TRITON_CACHE_DIR", "triton"),
    ("FlashInfer", "FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("TileLang", "TILELANG_CACHE_DIR", "tilelang"),
    ("CuTeDSL", "CUTE_DSL_CACHE_DIR", "cutedsl"),
    ("DeepGEMM", "DG_JIT_CACHE_DIR", "deep_gemm"),
    ("b12x", "B12X_COMPILE_CACHE_DIR", "b12x"),
    ("b12x RoCE", "B12X_ROCE_CACHE_DIR", "b12x-roce"),
)
RUN = "run"
SECRET_KEY = "secrets/api_key"        # rank 0 only: its key, 0600, mounted read-only into its container and
                                      # read by the gateway (the engine key; the client key with GATEWAY=0)
KEY_ENV = "api_key.env"               # where earlier versions kept the key for --env-file (removed)
KEY = "api_key"                       # the head's key file (API_KEY_FILE may move it)
UNITS = "units"
WATCHDOG_SETTINGS = "watchdog.json"
WATCHDOG_STATUS = "watchdog.status.json"
WATCHDOG_GAVEUP = "watchdog.gaveup"
INCIDENTS = "incidents.jsonl"
READY = "ready.json"                  # on the head: when a readiness wait last saw a token
MEM_BASELINE = "mem-baseline.json"    # on every node: its MemAvailable before its first rank started
STARTUP = "startup.json"              # on the head: the last start-up's phases (core/startup.py)
NEEDS_REBOOT = "needs-reboot.json"    # on the head: a restart stopped because a node's memory did not come back
DOIT_DB = "doit.db"                    # on the head: doit's record of what ran (sqlite)
DOIT_LOCK = "doit.lock"               # on the head: the run lock (core/runlock.py)
GROUP_RECORDS = "groups"              # on the head, with GROUPS > 1: groups/g<N>/, one serving group's records (its
GROUP_DIR_RE = re.compile(r"g\d+")    # watchdog's status, incidents and evidence, readiness, start-up, run lock)
IMAGE_STAMP = "image.stamp"           # on the head: the image ids every node held at the last `doit image`
SSH = "ssh"                           # on the head: the ssh master sockets
RELEASES = "releases"                 # on the head: releases/<NNNN>/release.json
RELEASE_RECORD = "release.json"
RELEASE_CURRENT = "current.json"      # what an older version kept of the release in service: removed
INCIDENT_DIRS = "incidents"           # on the head: incidents/<UTC time>-<verdict>/summary.json, ...
INCIDENT_SUMMARY = "summary.json"
DOWNLOAD_DIR = os.path.join(".cache", "dsv41")   # in MODEL_DIR, on the head: partial downloads, and
DOWNLOAD_RECORDS = os.path.join(DOWNLOAD_DIR, "download.json")   # what `doit download` fetched
CONTAINER_SECRET = "/run/secrets/dsv41_api_key"   # where rank 0's container reads the key
# ---- monitoring (head/monitoring.py, head/exporter.py) ----
PROMETHEUS_UNIT = "dsv41-prometheus.service"      # the head's Prometheus (doit monitoring --install)
ALERTMANAGER_UNIT = "dsv41-alertmanager.service"  # the head's Alertmanager (doit monitoring --install)
DEBIAN_ALERTMANAGER_UNIT = "prometheus-alertmanager.service"   # the package's own: masked, never used
MONITORING = "monitoring"                          # on the head: its config, rules, dashboard, data/
EXPORTER_UNIT = "prometheus-node-exporter.service"  # Debian's, on every node, enabled when METRICS_DIR is set
EXPORTER_DROPIN = "prometheus-node-exporter.service.d/dsv41.conf"   # its flags, under UNIT_DIR
# ---- the gateway (head/core/gateway.py, node/gateway.py): HAProxy on PORT in front of rank 0 ----
GATEWAY_UNIT = "dsv41-gateway.service"
GATEWAY_SOCKET_UNIT = "dsv41-gateway.socket"       # systemd holds PORT and hands it to HAProxy at each start:
                                                   # while HAProxy restarts, connections wait in the kernel
GATEWAY_LISTEN_FD = 3                              # where HAProxy finds it (`bind fd@3`: SD_LISTEN_FDS_START)
DEBIAN_HAPROXY_UNIT = "haproxy.service"            # the package's own: masked, never used
GATEWAY_CONFIG = "gateway/haproxy.cfg"             # rendered; no secret in it (a release records it)
ENGINE_KEY_SOURCE = "engine_key"                   # rank 0's own key behind the gateway (0600): it and dsv41 only
GATEWAY_KEYS = "gateway/keys.map"                  # sha256 of each client key -> its name, 0600, never in a release
GATEWAY_KEYS_LOCK = "gateway/keys.lock"            # held by every writer of the key map (node/gateway.py)
KEY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")    # a new client key's name (fullmatch)
KEY_OLD_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")           # any name a key map of an earlier version holds
DEFAULT_KEY = "default"                            # the client key of API_KEY_FILE (Pi, smoke, bench): never revoked
GATEWAY_STATE = "gateway/state.map"                # the door: open or closed, why, when the engine is expected
GATEWAY_SOCKET = "/run/dsv41-gateway/admin.sock"   # HAProxy's runtime API (RuntimeDirectory=dsv41-gateway)
GATEWAY_METRICS_PATH = "/gateway/metrics"          # HAProxy's own Prometheus exporter, on PORT
GATEWAY_ROUTES = (                                 # all the door forwards, with a client key (docs/gateway.md)
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("GET", "/v1/models"),
    ("POST", "/tokenize"),                         # prompt token counts (doit bench)
)


DOOR_BACKEND = "engine"                            # the door's backend: one server a serving group


def door_server(index, groups):
    """The door's server of serving group `index` of `groups`: r0 when there is one (the name every version
    of the gateway gave rank 0), else g<index>."""
    return "r0" if groups == 1 else f"g{index}"


def key_hash(key):
    """How a door knows a key: its sha256, in hex (HAProxy: `sha2(256),hex,lower`)."""
    return hashlib.sha256(key.encode()).hexdigest()


def gateway_map(rel, config=GATEWAY_CONFIG):
    """A map of a door's config (the gateway's, or a side door's: SIDE_DOOR_CONFIG) as that config and its admin
    socket name it: relative to the config's folder."""
    return os.path.relpath(rel, os.path.dirname(config))


# ---- a side door (head/core/units.py): HAProxy on a group's first node, when that group's rank 0 is not on the
# head, in front of that group's engine; only the head's door (the gateway) may pass it ----
SIDE_DOOR_UNIT = "dsv41-sidedoor.service"
SIDE_DOOR_CONFIG = "sidedoor/haproxy.cfg"          # rendered; no secret in it
SIDE_DOOR_KEYS = "sidedoor/door_key.map"           # sha256 of the head door's engine key -> SIDE_DOOR_KEY_NAME, 0600
SIDE_DOOR_KEY_NAME = "door"                        # the one name that map holds: the head's door
SIDE_DOOR_SOCKET = "/run/dsv41-sidedoor/admin.sock"   # HAProxy's runtime API (RuntimeDirectory=dsv41-sidedoor)
SIDE_DOOR_ROUTES = GATEWAY_ROUTES + (("GET", "/health"), ("GET", "/metrics"))   # the gateway's, the engine's health
                                                   # for its check and its metrics for the head's watchdog


def rank_name(rank):
    """Container name, and the stem of the rank's unit."""
    return f"{RANK_PREFIX}{rank}"


def rank_unit(rank):
    return f"{rank_name(rank)}.service"


def cidfile(rank):
    return f"{RUN}/{rank_name(rank)}.cid"


CIDFILE_RE = re.compile(rf"^{re.escape(RANK_PREFIX)}(\d+)\.cid$")


def cache_key(image):
    """The folder of cache/ that belongs to an image: the first 12 hex digits of its digest, so another image
    never reuses a cache; an unpinned tag (ALLOW_UNPINNED_IMAGE): "tag-" and 12 of the reference's sha256
    (a tag moved to another build keeps its caches)."""
    _, _, digest = image.partition("@sha256:")
    return digest[:12] if digest else "tag-" + hashlib.sha256(image.encode()).hexdigest()[:12]


def state_path(state_dir, *parts):
    """A file of the state layout above (or one inside its folders), under one node's state dir."""
    return os.path.join(state_dir, *parts)
