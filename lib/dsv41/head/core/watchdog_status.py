"""What the watchdog last saw, for status and top: its unit's state and watchdog.status.json on the
head, and the one line that says it."""
import json
import time

from dsv41 import names


def watchdog_entry(cfg, head):
    """The watchdog's unit state (head: the head's state.NodeState, None when unknown) and what it
    last saw (watchdog.status.json on the head)."""
    unit = head.unit(names.WATCHDOG_UNIT) if head is not None else None
    entry = {"enabled": cfg.watchdog, "unit": (unit.active or "not installed") if unit and unit.installed else "not installed"}
    try:
        with open(names.state_path(cfg.state_dir, names.WATCHDOG_STATUS)) as f:
            entry.update(json.load(f))
    except (OSError, ValueError):
        pass
    return entry


def watchdog_line(w):
    """What the watchdog is doing, from its unit and its status file (the setting only adds a note)."""
    running = w["unit"] == "active"
    if not running and not w["enabled"]:
        return "watchdog: off (WATCHDOG=0)"
    seen = (f", saw {w['verdict']} {time.time() - w['time']:.0f} s ago: {w['evidence']}"
            if running and "verdict" in w else "")
    line = f"watchdog: {w['unit']}{seen}" + ("" if w["enabled"] else " (WATCHDOG=0: the next launch stops it)")
    if w.get("gave_up"):
        line += f"; GAVE UP ({w['gave_up'].get('reason', '?')}): hands off until `doit launch`"
    last = w.get("last_incident")
    if last:
        line += (f"; last incident {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(last['started']))}: "
                 f"{last['verdict']}, {last['action']}, {last['result']} ({last['took_s']:.0f} s)")
    return line
