"""doit config: every effective setting with where it came from (the settings themselves are the
dsv41.settings package)."""
import json as _json
import shlex

from dsv41.settings import kinds
from dsv41.settings.kinds import ConfigError


def describe(cfg):
    """(setting, value, source) rows for `doit config`, in the schema's order; secrets are shown as
    set/unset only."""
    rows = []
    for s in cfg.settings:
        v = cfg.values[s.name]
        src = cfg.sources.get(s.key, "environment" if s.env_only and v else "default")
        if s.kind in kinds.HIDDEN_KINDS:
            v = "(set)" if v else "(unset)"
        elif v == s.default and s.shown[:1].isalpha():  # unset: what that means, in the settings page's words
            v = f"({s.shown})"
        elif isinstance(v, bool):
            v = int(v)
        elif isinstance(v, tuple):
            v = ",".join(map(str, v)) if s.kind in ("caps", "list", "targets") else shlex.join(v)
        rows.append((s.name, str(v), src))
    for k, v, src in cfg.engine_args + cfg.engine_env:
        rows.append((f"engine {k}", "(dropped)" if v is None else v, src))
    for s in cfg.nodes:
        facts = {"target": s.target or "(local)", "model_dir": s.model_dir, "ip": s.ip,
                 "ifname": s.ifname, "hcas": ",".join(s.hcas) if s.hcas else None, "gid_index": s.gid_index}
        for k, v in facts.items():
            src = cfg.sources.get(f"r{s.rank}.{k}", "detected at launch" if v is None else "derived")
            if k == "model_dir" and not cfg.sources.get(f"r{s.rank}.{k}"):
                v, src = ("(head's path, home swapped)" if s.rank else cfg.model_dir), "derived"
            if k == "target":
                src = (cfg.sources.get("workers") or "default") if s.target else "the machine running doit"
            rows.append((f"r{s.rank}.{k}", "" if v is None else str(v), src))
    return rows


def show(cfg, json=False, setting=()):
    """doit config: every effective setting with where it came from (or only the named ones)."""
    rows = describe(cfg)
    if setting:
        wanted = {w.upper() for w in setting}
        unknown = sorted(wanted - {k.upper() for k, _, _ in rows})
        if unknown:
            raise ConfigError(f"no setting {unknown[0]}{kinds.nearest(unknown[0], [k for k, _, _ in rows])}: "
                              "`doit config` lists them all")
        rows = [r for r in rows if r[0].upper() in wanted]
    if json:
        print(_json.dumps({k: {"value": v, "source": s} for k, v, s in rows}, indent=2))
        return
    width = max(len(k) for k, _, _ in rows)
    vwidth = min(60, max(len(v) for _, v, _ in rows))
    for k, v, s in rows:
        print(f"{k:<{width}}  {v:<{vwidth}}  ({s})")
