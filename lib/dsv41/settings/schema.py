"""dsv41's settings, declared once: each one's environment variable, kind, accepted values, default,
where it may be set and what it means (settings/kinds.py says what a setting is and checks a value).
The engine's own settings (its flags) are declared by its recipe's package (dsv41/vllm/settings.py)
and join these in table(): layers.py checks the environment and every profile against that table, and
`doit config`, the settings page (docs/settings.md) and bash completion are made from it.

Per-node values follow one scheme for any number of nodes: R<N>_IP, R<N>_IFNAME, R<N>_HCAS,
R<N>_GID_INDEX, R<N>_MODEL_DIR for rank N, where HEAD_* is R0_* and WORKER_* is R1_*.

    python -m dsv41.settings.schema          # prints docs/settings.md's table (a test compares the two)
"""
import os
import re
from typing import NamedTuple

from dsv41 import names
from dsv41.node import memguard
from dsv41.settings.setting import Setting, number
from dsv41.vllm import settings as ENGINE      # the engine dsv41 ships: its settings module

# preflight's checks (head/core/preflight.py registers them; a test keeps the two lists equal)
CHECK_NAMES = ("reachable", "fabric", "rdma", "subnet", "gid-type", "mtu", "ping", "link-speed", "docker",
               "nvidia-runtime", "disk", "memory", "ports", "door", "stale-containers", "kernel", "clock", "tools", "remove-ipc")
# a Hugging Face repo id as the Hub takes it: no part starting or ending with . or -, no .. or --
NAME_RE = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
REPO_ID_RE = rf"^(?!.*(?:\.\.|--)){NAME_RE}/{NAME_RE}$"
EMAILS_RE = r"^[^@\s,]+@[^@\s,]+(?:,[^@\s,]+@[^@\s,]+)*$"
PER_NODE_RE = re.compile(r"^(?:R(\d+)|HEAD|WORKER)_(IP|IFNAME|HCAS|GID_INDEX|MODEL_DIR)$")


def expanded(path):
    return os.path.expanduser(path)


def seconds(minutes):
    return 60 * minutes


def none_below_0(n):
    """-1 (detect it) is None in Config."""
    return None if n < 0 else n


def comma_list(text):
    return tuple(a for a in text.split(",") if a)


S = Setting
OWN = (
    S("DSV41_PROFILE", "text", "", "apply conf/NAME.toml over the defaults", pattern=r"^[A-Za-z0-9_-]+$",
      expect="a profile name (a file in conf/)", env_only=True, shown="(none)", field="profile"),
    S("WORKER", "target", "", "ssh target of the worker, `user@<fabric address>`", shown="(none)", field=None),
    S("WORKERS", "targets", "", "comma list of workers for more than two nodes (ranks r1..rN in order)",
      shown="(none)", field=None),
    S("IMG", "image", "ghcr.io/0xsero/deepseek-v4.1-flash-spark@sha256:"
      "5668e35e5ee021da4b9ce88a1964caf0e082e8ca01d81d1d64b6213a55c6add5", "serving image, pinned by digest",
      shown="`ghcr.io/0xsero/deepseek-v4.1-flash-spark@sha256:5668e3…6add5`"),
    S("ALLOW_UNPINNED_IMAGE", "bool", False, "accept an image tag without a digest"),
    S("IMAGE_FILE", "path", "", "read the image reference from this file when `IMG` is unset", shown="(none)",
      field=None),
    S("HF_REPO", "text", "0xSero/DeepSeek-V4.1-Flash-Spark", "checkpoint repository", pattern=REPO_ID_RE,
      expect="a Hugging Face repo id, owner/name: letters, digits and _ . -, each part starting and ending "
      "with a letter, digit or _, no .. or --"),
    S("HF_ENDPOINT", "url", "", "the Hugging Face Hub `doit download` fetches from (a mirror, or a stand-in); "
      "huggingface_hub reads it too", env_only=True, shown="`https://huggingface.co`"),
    S("REVISION", "text", "", "pin a checkpoint commit", pattern=r"^(?!.*\.\.)[A-Za-z0-9_./-]+$",
      expect="a commit hash, branch or tag (no ..)", shown="(latest)"),
    S("HF_TOKEN", "secret", "", "Hugging Face token, if the repo is private (never printed)", env_only=True,
      shown="(none)"),
    S("PLAN_NAME", "text", "J268-ho-v31-K5n.json", "EXL3 allocation plan file in `exl3/plan/`",
      pattern=r"^[A-Za-z0-9._-]+\.json$", expect="a plan file name in exl3/plan/, e.g. J268-ho-v31-K5n.json"),
    S("SERVED_MODEL_NAME", "text", "deepseek-v4.1-flash", "the model name the API serves",
      pattern=r"^[A-Za-z0-9._/-]+$", expect="a model name of letters, digits and . _ / -"),
    S("MODEL_DIR", "path", "~/models/DeepSeek-V4.1-Flash-Spark", "model dir on the head", to=expanded),
    S("WORKER_MODEL_DIR", "path", "", "model dir on the workers", shown="head's path, home swapped", field=None),
    S("STATE_DIR", "path", names.DEFAULT_STATE_DIR,
      "runtime state on every node (key, plans, caches, receipts, doit's db)", to=expanded,
      also=(("state_dir_raw", None),)),       # as configured: each node resolves ~ against its home
    S("API_KEY_FILE", "path", "", "the API key (created once, mode 0600)", shown="`$STATE_DIR/api_key`"),
    S("PORT", "int", 8000, "API port on the head", lo=1, hi=65535),
    S("MPORT", "int", 29655, "rendezvous (master) port", lo=1, hi=65535),
    S("GATEWAY", "bool", True, "`dsv41-gateway` (HAProxy) on the head holds `PORT` in front of rank 0, which serves "
      "`127.0.0.1:ENGINE_PORT` (0: rank 0 serves `PORT` itself, with no drain, 503s or named keys)",
      absent=False),                              # a release recorded before the gateway ran without one
    S("ENGINE_PORT", "int", 18000, "rank 0's API server on the head's 127.0.0.1 behind the gateway", lo=1,
      hi=65535),
    S("DRAIN_S", "int", 120, "a planned restart (`doit stop`, a release, `doit rollback`) first waits this long "
      "at most for the requests in flight to finish, new ones answered 503", lo=0, hi=3600),
    S("KEY_RATE_PER_MIN", "int", 0, "requests per minute each key may make before the gateway answers 429 "
      "(0: no limit)", lo=0, hi=1000000),
    S("GATEWAY_TIMEOUT_S", "int", 3600, "the gateway cuts a connection silent this long (a long prefill or a "
      "non-streamed answer of a 262K-token context stays under it)", lo=10, hi=24 * 3600),
    S("MEMGUARD_GIB", "floor", memguard.DEFAULT_FLOOR_GIB,
      "memory guard floor: ranks are stopped below this MemAvailable", lo=memguard.FLOOR_GIB[0],
      hi=memguard.FLOOR_GIB[1]),
    S("MEMGUARD_MODE", "choice", memguard.DEFAULT_MODE, "`observe` only logs what the guard would do",
      choices=memguard.MODES),
    S("GROUPS", "int", 1, "serving groups behind the door: the nodes (the head, then `WORKERS`) split into this "
      "many of equal size, each its own tensor-parallel engine (docs/groups.md); more than 1 needs `GATEWAY=1`",
      lo=1, hi=64),
    S("ROUTING", "choice", "least", "with several groups, where the door sends a request: `least`, the group with "
      "the fewest in flight; `key`, one group per client key (its chats find their prefix in that group's cache), "
      "moved only when that group is out or holds half again the average load", choices=("least", "key")),
    S("TP_SIZE", "int", 0, "tensor-parallel size of a group: a multiple of its node count", lo=0, hi=1024,
      shown="a group's node count"),
    S("NNODES", "int", 0, "`--nnodes`: a group's node count", lo=0, hi=1024, shown="a group's node count"),
    S("NCCL_IB_GID_INDEX", "int", -1, "one GID index for every node", lo=-1, hi=255, shown="detected per node",
      to=none_below_0),
    S("SSH_OPTS", "sshopts", "", "extra ssh options (shell words)", shown="(none)"),
    S("SSH_TIMEOUT_S", "int", 10, "a node that does not answer over ssh (down, frozen, link gone) is "
      "reported after this long", lo=1, hi=300),
    S("KEEP_PARTS", "bool", False, "keep the `.partNN` files after their shard verified"),
    S("START_TIMEOUT_MIN", "float", 45, "how long launch waits for the API", lo=0, hi=24 * 60,
      field="start_timeout_s", to=seconds),
    S("METRICS_DIR", "path", "", "node_exporter textfile collector dir for the guard's and the watchdog's "
      "metrics", shown="(none)", to=expanded),
    S("WATCHDOG", "bool", True, "run `dsv41-watchdog` on the head (0: stopped and disabled)"),
    S("WATCHDOG_INTERVAL_S", "int", 10, "how often the watchdog looks", lo=1, hi=3600),
    S("WATCHDOG_STALL_S", "int", 30, "work running or waiting and no progress signal moved this long: the "
      "watchdog sends its own one-token probe (a token, or a signal moving meanwhile: busy; neither: wedged)", lo=1, hi=24 * 3600),
    S("WATCHDOG_PROBE_S", "int", 30, "the one-token probe's deadline (idle, or after a stall)", lo=1, hi=3600),
    S("WATCHDOG_MAX_RECOVERIES", "int", 2, "recoveries allowed per window before it gives up", lo=0, hi=100),
    S("WATCHDOG_WINDOW_MIN", "int", 60, "the window of `WATCHDOG_MAX_RECOVERIES`", lo=1, hi=7 * 24 * 60,
      field="watchdog_window_s", to=seconds),
    S("WATCHDOG_BACKOFF_S", "int", 30, "the n-th recovery inside the window waits this x 2^(n-2) after the "
      "previous one (none before the first)", lo=0, hi=24 * 3600),
    S("MEM_RETURN_GIB", "float", 8, "after the ranks stopped, each node's MemAvailable must be back within this "
      "of its baseline (recorded before its first rank started), else NEEDS_REBOOT", lo=0, hi=1024),
    S("MEM_RETURN_S", "int", 120, "how long a restart waits for the memory to come back", lo=0, hi=3600),
    S("INCIDENTS_KEEP", "int", 20, "incident folders kept in `$STATE_DIR/incidents` (the newest)", lo=1, hi=10000),
    S("RELEASES_KEEP", "int", 10, "releases kept in `$STATE_DIR/releases` (the newest; never the one in service "
      "or the last good one)", lo=1, hi=10000),
    S("ROLLOUT_HOLD_S", "int", 60, "a release is good once the API answered and the cluster stayed healthy this long",
      lo=0, hi=24 * 3600),
    S("ROLLOUT_MIN_TIMEOUT_MIN", "float", 10, "the rollout deadline (twice the last good release's start-up, at most "
      "`START_TIMEOUT_MIN`) is at least this", lo=0, hi=24 * 60, field="rollout_min_timeout_s", to=seconds),
    S("ROLLBACK", "bool", True, "a failed rollout restarts the ranks on the last good release (0: leaves it as it is)"),
    S("PROMETHEUS_PORT", "int", 9090, "`doit monitoring --install`: dsv41-prometheus's web UI and API on the head",
      lo=1, hi=65535),
    S("EXPORTER_PORT", "int", 9100, "prometheus-node-exporter's port on every node", lo=1, hi=65535),
    S("SCRAPE_INTERVAL_S", "int", 15, "how often Prometheus scrapes the engine and the exporters", lo=1, hi=3600),
    S("METRICS_WITH_KEY", "bool", False, "the engine's /metrics is behind the API key: Prometheus reads it from "
      "`API_KEY_FILE`"),
    S("ALERT_FOR_S", "int", 60, "a fault (API, rank, exporter, memory near the floor) lasts this long before it "
      "alerts", lo=0, hi=24 * 3600),
    S("ALERT_RECENT_MIN", "float", 15, "a rank restart or a watchdog recovery alerts this long; the window of the "
      "TTFT and decode rates", lo=0.1, hi=24 * 60),
    S("ALERT_TTFT_P95_S", "float", 30, "TTFT p95 above this alerts (published two-Spark prefill: a 32k prompt's "
      "first token in about 16 s)", lo=0, hi=3600),
    S("ALERT_DECODE_TOKS_MIN", "float", 15, "decode tok/s per stream below this alerts (published: 29 to 40)",
      lo=0, hi=10000),
    S("ALERT_MEM_MARGIN_GIB", "float", 4, "MemAvailable within this much of the memory guard's floor alerts",
      lo=0, hi=1024),
    S("CLUSTER_NAME", "text", "dsv41", "the cluster's name: Prometheus's external label `cluster`, by which "
      "Alertmanager groups and silences its alerts", pattern=r"^[A-Za-z0-9_.-]+$",
      expect="a name of letters, digits and . _ -"),
    S("ALERTMANAGER_PORT", "int", 9093, "`doit monitoring --install`: dsv41-alertmanager's API on the head "
      "(127.0.0.1 only)", lo=1, hi=65535),
    S("ALERT_WEBHOOK_URL", "webhook", "", "Alertmanager POSTs its JSON notifications here, e.g. an ntfy topic "
      "(semi-secret: only in the mode-0600 alertmanager.yml)", env_only=True, shown="(none)"),
    S("ALERT_EMAIL_TO", "text", "", "e-mail the alerts to these addresses (comma list)", pattern=EMAILS_RE,
      expect="e-mail addresses, a comma list", shown="(none)", to=comma_list),
    S("ALERT_EMAIL_FROM", "text", "", "the alerts' From address", pattern=r"^[^@\s,]+@[^@\s,]+$",
      expect="one e-mail address", shown="(none)"),
    S("ALERT_SMTP_SMARTHOST", "hostport", "", "the mail server the alerts go through, host:port", lo=1, hi=65535,
      shown="(none)"),
    S("ALERT_SMTP_USER", "text", "", "the mail server's user (with `ALERT_SMTP_PASSWORD_FILE`)",
      pattern=r"^[^\s]+$", expect="a user name without spaces", shown="(none)"),
    S("ALERT_SMTP_PASSWORD_FILE", "path", "", "a file holding the mail server's password, read by Alertmanager "
      "itself (`auth_password_file`)", shown="(none)", to=expanded),
    S("ALERT_SMTP_REQUIRE_TLS", "bool", True, "the mail server must offer STARTTLS"),
    S("ALERT_GROUP_WAIT_S", "int", 30, "a new incident's first notification waits this long for its other "
      "alerts (and the watchdog's own)", lo=0, hi=3600),
    S("ALERT_GROUP_INTERVAL_S", "int", 120, "a change to the cluster's firing alerts is notified after at most "
      "this long", lo=1, hi=24 * 3600),
    S("ALERT_REPEAT_INTERVAL_MIN", "int", 240, "alerts still firing are notified again after this long",
      lo=1, hi=7 * 24 * 60),
    S("ALERT_SILENCE_MAX_H", "int", 6, "a silence set by `doit stop` (or a restart) ends after at most this long",
      lo=1, hi=7 * 24),
    S("FREE_GIB_HEAD", "int", 700, "free disk preflight wants on the head (a download plus reassembly)", lo=0,
      hi=65536),
    S("FREE_GIB_WORKER", "int", 470, "free disk preflight wants on each worker", lo=0, hi=65536),
    S("SKIP_CHECKS", "list", "", "preflight checks to downgrade to WARN (comma list)", choices=CHECK_NAMES,
      shown="(none)"),
    S("GPUS", "gpus", "all", "`docker run --gpus`: `all`, device numbers `0,1` (or `device=0,1`), empty: none "
      "(as in the lab)", lo=0, hi=255),
    S("MEMLOCK", "text", "-1", "`docker run --ulimit memlock=` value", pattern=r"^(-1|[0-9]+(:[0-9]+)?)$",
      expect="-1 (unlimited) or a byte count, as docker run --ulimit memlock= takes"),
    S("PRIVILEGED", "bool", True, "run the rank containers `--privileged`"),
    S("DSV41_BASE_URL", "url", "", "`doit pi`: the API base URL Pi is given (`pi/install.sh` reads it too)",
      env_only=True, shown="`http://<R0_IP or 127.0.0.1>:<PORT>/v1`"),
)


def table(engine=ENGINE, own=OWN):
    """Every setting: dsv41's own, then the engine's (`engine`: a module or object with SETTINGS)."""
    return own + tuple(engine.SETTINGS)


SETTINGS = table()
BY_NAME = {s.name: s for s in SETTINGS}
BY_KEY = {s.key: s for s in SETTINGS if not s.env_only}


class PerNode(NamedTuple):
    kind: str
    help: str
    shown: str = "detected"
    lo: int | None = None
    hi: int | None = None


PER_NODE = {
    "IP": PerNode("ip", "rank N's fabric address"),
    "IFNAME": PerNode("ifname", "rank N's fabric interface"),
    "HCAS": PerNode("hcas", "rank N's RDMA devices, comma list"),
    "GID_INDEX": PerNode("int", "rank N's RoCE v2 GID index", "detected", 0, 255),
    "MODEL_DIR": PerNode("path", "rank N's model dir (not the head's: that is `MODEL_DIR`)",
                         "`WORKER_MODEL_DIR`"),
}


def per_node_setting(var):
    """The Setting a per-node variable (R3_IP, HEAD_HCAS, WORKER_IFNAME) is checked as, or None."""
    m = PER_NODE_RE.match(var)
    if not m:
        return None
    p = PER_NODE[m.group(2)]
    return Setting(var, p.kind, "", p.help, lo=p.lo, hi=p.hi)


def per_node_rank(var):
    """The rank a per-node variable names: R<N> -> N, HEAD -> 0, WORKER -> 1."""
    m = PER_NODE_RE.match(var)
    return int(m.group(1)) if m.group(1) is not None else (0 if var.startswith("HEAD_") else 1)


# ---- docs/settings.md's table -------------------------------------------------------------------

KIND_TYPES = {"int": "integer", "float": "number", "floor": "number (GiB)", "bool": "boolean", "choice": "choice",
              "text": "text", "secret": "text (secret)", "webhook": "URL (secret)", "url": "URL", "path": "path",
              "words": "shell words", "sshopts": "ssh options", "command": "command", "hostport": "host:port",
              "target": "ssh target", "targets": "ssh targets",
              "list": "list", "caps": "list of integers", "gpus": "GPU devices", "image": "image reference",
              "ip": "IPv4 address", "ifname": "interface name", "hcas": "list of RDMA devices"}
# what a kind accepts, in words, when the setting itself does not say more (settings/kinds.py checks it)
KIND_ACCEPTS = {
    "bool": "1 or 0 (also true/false, yes/no, on/off); a profile writes true or false",
    "secret": "any text; never printed",
    "webhook": "an http:// or https:// URL",
    "url": "an http:// or https:// URL (or empty)",
    "path": "an absolute path or one starting with `~/`",
    "words": "shell words with balanced quotes; no `--api-key` or `--hf-token`",
    "sshopts": "ssh options as shell words, e.g. `-p 2222 -o StrictHostKeyChecking=accept-new`: each word an "
               "option or its value",
    "target": "`user@host` (the host alone too), neither starting with `-`; at most 255 characters",
    "targets": "a comma list of distinct ssh targets, `user@a,user@b`",
    "image": "`name@sha256:<64 hex digits>`; a tag without a digest only with `ALLOW_UNPINNED_IMAGE`",
    "ip": "an IPv4 address on the fabric network",
    "ifname": "an interface name as `ip -br a` shows it (1 to 15 of letters, digits, `_ . : -`)",
    "hcas": "a comma list of RDMA devices as `rdma link` shows them, e.g. `rocep1s0f1`",
}


def accepts(s):
    """A setting's accepted values in words: its range, its choices or what its kind and pattern take."""
    if s.kind == "int":
        return f"{number(s.lo)} to {number(s.hi)}" if s.hi is not None else f"{number(s.lo)} or more"
    if s.kind == "float":
        return f"more than {number(s.lo)}, at most {number(s.hi)}"
    if s.kind == "hostport":
        return f"host:port, the port {number(s.lo)} to {number(s.hi)}, e.g. `mail.example.org:587`"
    if s.kind == "floor":
        return f"{number(s.lo)} to {number(s.hi)}"
    if s.kind == "choice":
        return ", ".join(f"`{c}`" for c in s.choices)
    if s.kind == "caps":
        return f"a comma list of whole numbers {number(s.lo)} to {number(s.hi)}, e.g. `1,2,4,8`"
    if s.kind == "gpus":
        return f"`all`, empty (no GPU), or device numbers {number(s.lo)} to {number(s.hi)} as a comma list, e.g. `0,1`"
    if s.kind == "list":
        return "a comma list of " + ", ".join(f"`{c}`" for c in s.choices)
    if s.kind in ("text", "command"):
        said = s.expect or (f"matching `{s.pattern}`" if s.pattern else "any text")
        return said.replace("|", "\\|")
    words = KIND_ACCEPTS.get(s.kind, "")
    return words + (" (or empty)" if s.kind == "path" and s.default == "" else "")


def shown_default(s):
    if s.shown:
        return s.shown
    if s.kind == "bool":
        return "1" if s.default else "0"
    return f"`{s.default}`" if isinstance(s.default, str) else f"{s.default:g}" if isinstance(
        s.default, float) else str(s.default)


def docs_table(engine=ENGINE, own=OWN):
    """The markdown table docs/settings.md holds (a test compares the two): every setting's name, type,
    accepted values, default, where it may be set and meaning, then the per-node ones."""
    def row(name, s, default, where):
        return f"| {name} | {KIND_TYPES[s.kind]} | {accepts(s)} | {default} | {where} | {s.help} |"

    rows = ["| name | type | range or choices | default | where | meaning |",
            "| --- | --- | --- | --- | --- | --- |"]
    rows += [row(f"`{s.name}`", s, shown_default(s), s.where) for s in table(engine, own)]
    rows += [row(f"`R<N>_{k}` (`HEAD_{k}` = R0, `WORKER_{k}` = R1)", Setting(k, p.kind, "", p.help, lo=p.lo, hi=p.hi),
                 p.shown, "environment, profile `[overrides]`") for k, p in PER_NODE.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(docs_table())
