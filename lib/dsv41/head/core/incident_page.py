"""What the watchdog pages by itself, posted to Alertmanager (core.silences.post), never waiting on a
scrape: its incident while a recovery runs (DSV41WatchdogRecovering), and a release it cannot carry on
because its record or the history cannot be read (DSV41NeedsAPerson); and the end of our silences
once their release is final."""
import time

from dsv41.head.core import silences


def end_final_silences(cfg, history):
    """Our silences set for a release that is final end two scrapes from now (core.silences.end_owned):
    none outlives the work that made it. A line when one did, else None."""
    final = {r.number for r in history if not r.unfinished}
    return silences.end_owned(cfg, final, 2 * cfg.scrape_interval_s + silences.RESOLVE_SLACK_S)


INCIDENT_ALERT = "DSV41WatchdogRecovering"
NEEDS_PERSON_ALERT = "DSV41NeedsAPerson"
RESEND_S = 10                   # while its cause lasts, an alert of the watchdog's is posted again this often


def alert_ends(cfg, started, now, ended=False):
    """When an alert of the watchdog's begun at `started` should end, posted at `now`: while its cause
    lasts, two resends ahead (a watchdog that died lets it resolve by itself); once it ended, now, but never
    before a group wait and a scrape past its start: Alertmanager sends nothing for a group resolved before
    its first notification. Alertmanager never moves a firing alert's end earlier, so the end is only ever
    pushed."""
    least = started + cfg.alert_group_wait_s + cfg.scrape_interval_s + silences.RESOLVE_SLACK_S
    return max(least, now if ended else now + 2 * RESEND_S)


def page_incident(cfg, inc, ends):
    """The watchdog's incident as one alert of its own, posted to Alertmanager from the recovery's start
    (a page never depends on a scrape landing inside it), labelled with the incident (verdict, node,
    fault_at, incident; with GROUPS > 1 its group); the rank, API, decode and TTFT alerts are inhibited under
    it. A line."""
    fault_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(inc["fault_at"])) if inc.get("fault_at") else ""
    labels = {"verdict": inc.get("verdict") or "", "node": inc.get("node") or "", "fault_at": fault_at,
              "incident": inc["id"]}
    where, ranks = labels["node"] or "the cluster", "the ranks"
    if cfg.scope is not None:
        labels["group"] = f"g{cfg.scope}"
        where = f"group {cfg.scope} ({labels['node'] or ', '.join(s.name for s in cfg.nodes)})"
        ranks = f"group {cfg.scope}'s ranks while the other groups serve"
    return silences.post(cfg, INCIDENT_ALERT,
                         f"{labels['verdict']} on {where}: the watchdog restarts {ranks} (fault at {fault_at or '?'})",
                         f"It restarts {ranks}; the rank, API, decode and TTFT alerts stay quiet meanwhile, and this "
                         f"resolves when the recovery ended: `doit incidents show {inc['id']}`, `doit status`.",
                         labels, inc["started"], ends)


def page_carry_on(cfg, number, left, by, started, ends):
    """A release a dead process left unfinished, while the watchdog carries it on: one alert of the same
    name as a recovery's (the restart's rank and API alerts are inhibited under it), named by the release.
    A line."""
    return silences.post(cfg, INCIDENT_ALERT, f"release {number} was left {left} by {by}, which ended: the watchdog "
                                              "carries it on",
                         f"It finishes the release from its record (or goes back as recorded); this resolves when it "
                         f"is done: `doit releases show {number}`, `doit status`.",
                         {"verdict": "UNFINISHED", "node": "", "fault_at": "", "incident": f"release-{number}"},
                         started, ends)


def page_needs_person(cfg, what, why, started, ends):
    """One alert while the watchdog cannot carry a release on (what: "release 3", or "the release
    history"; why: the one line naming the file); the same labels each time, so Alertmanager keeps one
    alert and pages once. A line."""
    return silences.post(cfg, NEEDS_PERSON_ALERT, f"the watchdog cannot carry {what} on: it needs a person",
                         f"{why}. Nothing on the nodes was changed for it; `doit status` and `doit releases` say "
                         "what is recorded, and `doit launch` records a release of today's settings.",
                         {"release": what}, started, ends)
