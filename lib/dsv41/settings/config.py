"""The resolved settings as one frozen Config (and a NodeSpec per rank): what every verb and the
machinery read. settings/layers.py makes one from the defaults, a profile and the environment;
settings/resolved.py writes and reads the copy a later service runs on. The engine's own settings
(its flags, declared by its recipe: dsv41/vllm/settings.py) are in `engine`, by variable name."""
import dataclasses
import os
from types import SimpleNamespace

from dsv41.settings.kinds import ConfigError


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    rank: int
    name: str                  # "head", "worker1", ...
    target: str | None         # ssh target; None for the head (the machine running doit)
    model_dir: str | None      # explicit model dir on this node, None: derived from the head's
    ip: str | None = None      # fabric overrides; None: detected
    ifname: str | None = None
    hcas: tuple[str, ...] | None = None
    gid_index: int | None = None

    @property
    def label(self):
        return self.name if self.target is None else f"{self.name} ({self.target})"


@dataclasses.dataclass(frozen=True)
class Config:
    image: str
    allow_unpinned_image: bool
    hf_repo: str
    revision: str
    hf_token: str
    plan_name: str
    served_model_name: str
    model_dir: str             # on the head, expanded
    state_dir: str             # on the head, expanded
    state_dir_raw: str         # as configured ("~/..."), resolved per node against its home
    api_key_file: str
    port: int
    mport: int
    memguard_gib: float
    memguard_mode: str
    tp_size: int
    nnodes: int
    nccl_ib_gid_index: int | None
    ssh_opts: tuple[str, ...]
    ssh_timeout_s: int
    keep_parts: bool
    start_timeout_s: int
    metrics_dir: str
    watchdog: bool
    watchdog_interval_s: int
    watchdog_stall_s: int
    watchdog_probe_s: int
    watchdog_max_recoveries: int
    watchdog_window_s: int
    watchdog_backoff_s: int
    mem_return_gib: float
    mem_return_s: int
    incidents_keep: int
    releases_keep: int
    rollout_hold_s: int
    rollout_min_timeout_s: int
    rollback: bool
    free_gib_head: int
    free_gib_worker: int
    # ---- monitoring settings (doit monitoring, head/monitoring.py; alerts: head/alerts.py) ----------
    prometheus_port: int
    exporter_port: int
    scrape_interval_s: int
    metrics_with_key: bool
    alert_for_s: int
    alert_recent_min: float
    alert_ttft_p95_s: float
    alert_decode_toks_min: float
    alert_mem_margin_gib: float
    cluster_name: str
    alertmanager_port: int
    alert_webhook_url: str     # semi-secret: never in resolved(), only in the mode-0600 alertmanager.yml
    alert_email_to: tuple[str, ...]
    alert_email_from: str
    alert_smtp_smarthost: str
    alert_smtp_user: str
    alert_smtp_password_file: str
    alert_smtp_require_tls: bool
    alert_group_wait_s: int
    alert_group_interval_s: int
    alert_repeat_interval_min: int
    alert_silence_max_h: int
    # ---- end of the monitoring settings ----------------------------------------------------------
    skip_checks: tuple[str, ...]
    gpus: str
    memlock: str
    privileged: bool
    profile: str
    engine: tuple              # ((NAME, value), ...): the engine's own settings (its recipe declares them), derived
    engine_args: tuple         # (("--flag", value or None to drop it, source), ...): an engine profile's changes
    engine_env: tuple          # (("NAME", value or None to drop it, source), ...); "{rank}" is the rank number
    nodes: tuple[NodeSpec, ...]
    sources: dict = dataclasses.field(compare=False, repr=False)   # {setting key or r<N>.<key>: where from}
    values: dict = dataclasses.field(compare=False, repr=False)    # {setting NAME: parsed value}
    settings: tuple = dataclasses.field(compare=False, repr=False, default=())  # the Settings it was checked against

    @property
    def head(self):
        return self.nodes[0]

    @property
    def workers(self):
        return self.nodes[1:]

    def engine_value(self, name):
        """One of the engine's own settings, by its variable name (KV_BYTES)."""
        return dict(self.engine)[name]

    def engine_settings(self):
        """The engine's own settings as attributes by lower-case name: .kv_bytes, .caps, ..."""
        return SimpleNamespace(**{name.lower(): value for name, value in self.engine})

    def require_workers(self):
        if not self.workers:
            raise ConfigError("WORKER is empty: set WORKER=user@<worker fabric address> "
                              "(or WORKERS=user@a,user@b for more workers)")
        return self.workers

    def node_path(self, raw, home):
        """A configured path ("~/x" or absolute) on a node whose home is `home`."""
        return home + raw[1:] if raw == "~" or raw.startswith("~/") else raw

    def model_dir_on(self, spec, home):
        """The model dir on a node: its override, else the head's path with the head's home swapped."""
        if spec.rank == 0:
            return self.model_dir
        if spec.model_dir:
            return self.node_path(spec.model_dir, home)
        head_home = os.path.expanduser("~")
        if self.model_dir == head_home or self.model_dir.startswith(head_home + "/"):
            return home + self.model_dir[len(head_home):]
        return self.model_dir

    def state_dir_on(self, spec, home):
        return self.state_dir if spec.rank == 0 else self.node_path(self.state_dir_raw, home)

    @property
    def api_url(self):
        host = self.head.ip or "127.0.0.1"
        return f"http://{host}:{self.port}/v1"
