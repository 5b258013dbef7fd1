"""What a node reports about its deployment (dsv41.node.probe's JSON), parsed once, here, into frozen
dataclasses: its units, containers, image, trip marker, memory and state files. "State" is this; the
word "facts" is preflight's (dsv41.node.facts). Pure: no I/O."""
import dataclasses
import json
from collections.abc import Mapping

from dsv41.errors import UserError, one_line


class ProbeError(UserError):
    """The probe's answer is not what this version reads."""


@dataclasses.dataclass(frozen=True)
class UnitState:
    """One systemd unit as the probe saw it; every systemd property as systemd printed it."""
    installed: bool = False
    text: str | None = None                 # the installed unit file, None when not installed
    active: str = ""                        # ActiveState ("" when systemd did not say)
    sub: str = ""                           # SubState
    result: str = ""                        # Result
    restarts: str = ""                      # NRestarts
    enabled: str = ""                       # UnitFileState
    load: str = ""                          # LoadState ("not-found": no such unit on the node)
    active_enter: str = ""                  # ActiveEnterTimestamp, "@<unix seconds>" on the node's clock
    inactive_enter: str = ""                # InactiveEnterTimestamp

    @property
    def state(self):
        """"ActiveState/SubState", or "not installed"."""
        return f"{self.active or '?'}/{self.sub or '?'}" if self.installed else "not installed"

    @property
    def since(self):
        """When it became active (unix seconds on its node's clock), 0 when unknown."""
        return float(self.active_enter[1:]) if self.active_enter.startswith("@") else 0.0

    @property
    def inactive_since(self):
        """When it last became inactive (unix seconds on its node's clock), 0 when unknown."""
        return float(self.inactive_enter[1:]) if self.inactive_enter.startswith("@") else 0.0


ABSENT = UnitState()


@dataclasses.dataclass(frozen=True)
class ContainerState:
    status: str                             # docker's State.Status ("running", "exited", ...)
    image: str                              # the image ID it runs
    stopped: tuple = ()                     # (pid, name) of its processes stopped (SIGSTOP or a tracer)


@dataclasses.dataclass(frozen=True)
class NodeState:
    """One node's deployment state; error is set (and nothing else) for a node that did not answer."""
    error: str = ""
    uid: int | None = None
    time: float = 0.0                       # the node's clock when it answered
    units: Mapping = dataclasses.field(default_factory=dict)          # name -> UnitState
    containers: Mapping | None = None       # name -> ContainerState or None; None: docker missing
    image_id: str | None = None
    tripped: dict | None = None             # the memory guard's trip marker
    model_dir: str | None = None
    model_changed_at: float | None = None
    mem_available_kib: int = 0
    gpu_memory: str | None = None           # nvidia-smi's "used, total" (MiB), None without a GPU
    files: Mapping = dataclasses.field(default_factory=dict)          # path under the state dir -> sha256
    memory: Mapping = dataclasses.field(default_factory=dict)         # /proc/meminfo figures (bytes)
    guard_settings: dict | None = None      # memguard.json as launch wrote it
    mem_baseline_bytes: int | None = None   # MemAvailable before its first rank started (names.MEM_BASELINE)
    mem_baseline_boot: str | None = None    # the boot that baseline was recorded in (None: not recorded)
    boot_id: str | None = None              # this boot's id (/proc/sys/kernel/random/boot_id)
    system: str | None = None               # systemd's is-system-running: "stopping" while it shuts down
    versions: dict | None = None            # {"kernel", "driver", "docker"}: asked by launch only
    caches: dict | None = None              # the engine's caches of the image (node.facts.cache_report):
                                            # asked by status and before the ranks start only

    def unit(self, name):
        return self.units.get(name, ABSENT)

    def container(self, name):
        return (self.containers or {}).get(name) if name else None

    def shown_unit(self, units):
        """Which of the node's engine units stands for it in one line: the first that is not
        active, else the first."""
        return next((u for u in units if self.unit(u).active != "active"), units[0])

    def age(self, unit):
        """Seconds the unit has been active by the node's own clock, None when it is not active."""
        u = self.unit(unit)
        if u.active != "active" or not u.since or not self.time:
            return None
        return self.time - u.since


def unreachable(error):
    """The state of a node that did not answer: the error, in one line."""
    return NodeState(error=one_line(error, 160))


def _unit(d):
    return UnitState(installed=bool(d.get("installed")), text=d.get("text"), active=d.get("ActiveState", ""),
                     sub=d.get("SubState", ""), result=d.get("Result", ""), restarts=d.get("NRestarts", ""),
                     enabled=d.get("UnitFileState", ""), load=d.get("LoadState", ""), active_enter=d.get("ActiveEnterTimestamp", ""),
                     inactive_enter=d.get("InactiveEnterTimestamp", ""))


def parse(report, node="node"):
    """The probe's answer (its JSON text, or decoded) as a NodeState; UserError naming the node when
    it is not the probe's shape (another version of the node code, a broken node)."""
    if isinstance(report, str):
        try:
            report = json.loads(report)
        except ValueError:
            raise ProbeError(f"{node}: the probe printed no JSON: {one_line(report[-200:]) or 'nothing'}") from None
    try:
        containers = report.get("containers")
        containers = None if not isinstance(containers, dict) or "error" in containers else {
            name: ContainerState(c["state"]["Status"], c["image"], tuple(tuple(p) for p in c.get("stopped") or ()))
            if c else None for name, c in containers.items()}
        return NodeState(
            uid=report.get("uid"), time=float(report.get("time") or 0.0),
            units={name: _unit(u) for name, u in (report.get("units") or {}).items()},
            containers=containers, image_id=report.get("image_id"), tripped=report.get("tripped"),
            model_dir=report.get("model_dir"), model_changed_at=report.get("model_changed_at"),
            mem_available_kib=int(report.get("mem_available_kib") or 0), gpu_memory=report.get("gpu_memory"),
            files=dict(report.get("files") or {}), memory=dict(report.get("memory") or {}),
            guard_settings=report.get("guard_settings"),
            mem_baseline_bytes=report.get("mem_baseline_bytes"), mem_baseline_boot=report.get("mem_baseline_boot"),
            boot_id=report.get("boot_id"), system=report.get("system"), versions=report.get("versions"),
            caches=report.get("caches"))
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ProbeError(f"{node}: the probe's answer is not what this version expects ({type(err).__name__}: "
                        f"{err}); run `doit launch` to ship the node code again") from None
