"""Silences for planned work: while a command stops the ranks on purpose (`doit stop`, a launch that
restarts them, a rollback), the cluster's alerts are silenced in the head's Alertmanager. One silence per
creator (createdBy `dsv41 doit stop`, `dsv41 doit launch`, ...) matching cluster=CLUSTER_NAME, ending at
most ALERT_SILENCE_MAX_H after it was set or extended. The rules are pure functions of the silences the
API lists and a clock; silence(), unsilence(), silences() and silence_line() never raise and never hold a
command up for long: with Alertmanager absent or down they return a line (or nothing) saying so.
Planned work that failed still pages once: page() posts the alert of a release that failed (rolled back
or down), after the silence ended; it resolves by itself after ALERT_RECENT_MIN."""
import os
import re
import time

from dsv41.head.core import alertmanager as am

PREFIX = "dsv41 "                       # createdBy of every silence of ours: "dsv41 " + who set it
RESOLVE_SLACK_S = 10                    # past two scrapes: Prometheus's evaluation, then Alertmanager's
EXTEND_SLACK_S = 60                     # a silence ending within this of the wanted end is kept as it is
ODD = (am.AmError, LookupError, TypeError, ValueError, AttributeError)   # no answer, or not the answer expected


def matchers(cluster):
    return [{"name": "cluster", "value": cluster, "isRegex": False, "isEqual": True}]


def ours(sil, cluster, by=None):
    """A silence of ours for this cluster, not expired (by: only those that creator set)."""
    return (sil.get("status", {}).get("state") != "expired" and sil.get("matchers") == matchers(cluster)
            and sil.get("createdBy", "").startswith(PREFIX) and (by is None or sil["createdBy"] == PREFIX + by))


def plan_silence(silences, cluster, by, now, hours, max_h):
    """The silence to POST for `by` (a new one, or its own extended to the wanted end), or None when
    its own already lasts that long. The end is now + hours, never more than max_h."""
    hours = max_h if hours is None else min(hours, max_h)
    ends = now + hours * 3600
    mine = sorted((s for s in silences if ours(s, cluster, by)), key=lambda s: am.ts(s["endsAt"]))
    if mine and am.ts(mine[-1]["endsAt"]) >= ends - EXTEND_SLACK_S:
        return None
    body = {"matchers": matchers(cluster), "startsAt": mine[-1]["startsAt"] if mine else am.iso(now),
            "endsAt": am.iso(ends), "createdBy": PREFIX + by,
            "comment": f"planned work: {by} silences cluster {cluster}'s alerts until it is done "
                       f"(at most {hours:g} h)"}
    if mine:
        body["id"] = mine[-1]["id"]
    return body


def to_expire(silences, cluster, by=None):
    """The ids of our silences to end (by: only those that creator set)."""
    return [s["id"] for s in silences if ours(s, cluster, by)]


def clock(t):
    return time.strftime("%H:%M", time.localtime(t))


def describe(silences, cluster):
    """'alerts silenced since 20:01 by doit stop (ends 02:01)' for the silence of ours that ends last, or None."""
    mine = sorted((s for s in silences if ours(s, cluster)), key=lambda s: am.ts(s["endsAt"]))
    if not mine:
        return None
    s = mine[-1]
    return (f"alerts silenced since {clock(am.ts(s['startsAt']))} by {s['createdBy'][len(PREFIX):]} "
            f"(ends {clock(am.ts(s['endsAt']))})")


def silence(cfg, by, hours=None, now=time.time):
    """Silence the cluster's alerts (matcher cluster=CLUSTER_NAME) for planned work by `by` ("doit stop",
    "doit launch", "doit rollback"); returns a line to print. Ends after `hours`, never later than
    ALERT_SILENCE_MAX_H (None: that long); a second call by the same creator extends its own silence.
    `doit stop` calls it before it stops anything; a launch that restarts the ranks and a rollback call
    silence(cfg, "doit launch") / silence(cfg, "doit rollback") before their restart and
    unsilence(cfg, the same by) once the API is ready again."""
    try:
        body = plan_silence(am.silences(am.url(cfg)), cfg.cluster_name, by, now(), hours, cfg.alert_silence_max_h)
        if body is None:
            return f"alerts of cluster {cfg.cluster_name} were already silenced by {by}"
        am.post_silence(am.url(cfg), body)
        return f"alerts of cluster {cfg.cluster_name} silenced by {by} until {clock(am.ts(body['endsAt']))}"
    except ODD as err:
        return "alerts not silenced: " + am.absent(cfg, err)


def unsilence(cfg, by=None):
    """End our silences of the cluster's alerts: all of them, or those `by` set; returns a line.
    `doit launch` calls unsilence(cfg) once the API is ready (the stop's silence and its own end)."""
    try:
        ids = to_expire(am.silences(am.url(cfg)), cfg.cluster_name, by)
        for i in ids:
            am.expire(am.url(cfg), i)
    except ODD as err:
        return "silence not ended: " + am.absent(cfg, err)
    who = f" set by {by}" if by else ""
    return f"alerts of cluster {cfg.cluster_name} are no longer silenced{who}" if ids else \
        f"no silence{who} of cluster {cfg.cluster_name}'s alerts to end"


def end_soon(cfg, seconds, now=time.time):
    """Our silences of the cluster's alerts end `seconds` from now (those ending later): once the API serves
    again the rank and API alerts of the restart resolve within about two scrapes, and an alert still
    firing when its silence ends would page. Returns a line."""
    try:
        ends = now() + seconds
        mine = move_ends(cfg, ends, lambda s: True, later_than=ends)
    except ODD as err:
        return "silence not ended: " + am.absent(cfg, err)
    return (f"alerts of cluster {cfg.cluster_name} stay silenced until {clock(ends)}, while the restart's alerts "
            "resolve" if mine else f"no silence of cluster {cfg.cluster_name}'s alerts to end")


def move_ends(cfg, ends, which, later_than):
    """Our silences that which(silence) picks and that end after `later_than` end at `ends` instead (an
    active silence's end may move; it keeps its id) -> those moved. Raises what the API calls raise."""
    mine = [s for s in am.silences(am.url(cfg)) if ours(s, cfg.cluster_name) and which(s)
            and am.ts(s["endsAt"]) > later_than]
    for s in mine:
        am.post_silence(am.url(cfg), {**{k: s[k] for k in ("id", "matchers", "startsAt", "createdBy", "comment")},
                                      "endsAt": am.iso(ends)})
    return mine


def owner(sil):
    """What a silence of ours was set for: ("release", 7) for "dsv41 doit launch, release 7", ("pid", 42) for
    "dsv41 doit launch, pid 42" (a repair, no release), None for the others (`doit stop`'s)."""
    m = re.search(r", (release|pid) (\d+)$", sil.get("createdBy", ""))
    return (m.group(1), int(m.group(2))) if m else None


def pid_alive(pid):
    return os.path.exists(f"/proc/{pid}")


def end_owned(cfg, final, seconds, now=time.time, alive=pid_alive):
    """Our silences whose work is over end `seconds` from now (those ending later): set for a release now
    final (`final`: their numbers), or by a process on this head that is gone. None outlives the work that
    made it (a launch that died before it ended its own); `doit stop`'s stays. Returns a line when it moved
    one, else None (nothing to do, or no Alertmanager)."""
    def over(sil):
        o = owner(sil)
        return o is not None and (o[1] in final if o[0] == "release" else not alive(o[1]))
    try:
        ends = now() + seconds
        mine = move_ends(cfg, ends, over, later_than=ends + EXTEND_SLACK_S)
    except ODD:
        return None
    return (f"ended the silence of {', '.join(sorted({s['createdBy'][len(PREFIX):] for s in mine}))}: its work is "
            f"over (it ends at {clock(ends)}, once the restart's alerts resolved)") if mine else None


def silences(cfg):
    """Our silences of the cluster's alerts that are not expired, as the API gives them ([] when
    Alertmanager does not answer)."""
    try:
        return [s for s in am.silences(am.url(cfg)) if ours(s, cfg.cluster_name)]
    except ODD:
        return []


def silence_line(cfg):
    """'alerts silenced since 20:01 by doit stop (ends 02:01)', or None (none, or no Alertmanager):
    for `doit status`."""
    return describe(silences(cfg), cfg.cluster_name)


def page(cfg, name, summary, description, labels=None, silenced_s=0, now=time.time):
    """One alert of ours straight to Alertmanager (severity critical, labelled with the cluster): a fault a
    command found, not Prometheus (a release that failed). It ends ALERT_RECENT_MIN later, and never before
    the silence still on it (silenced_s: the restart's, ending soon) is over and a group's wait and interval
    more have passed: an alert that ends silenced, or before its first notification, pages no one.
    Returns a line."""
    t = now()
    lasts = max(60 * cfg.alert_recent_min, silenced_s + cfg.alert_group_wait_s + cfg.alert_group_interval_s)
    return post(cfg, name, summary, description, labels, t, t + lasts)


def post(cfg, name, summary, description, labels, starts, ends):
    """One critical alert of ours, labelled with the cluster, firing from `starts` until `ends` (unix
    times); posting it again with the same labels moves its end (Alertmanager keeps one alert). A line."""
    alert = {"labels": {"alertname": name, "cluster": cfg.cluster_name, "severity": "critical", **(labels or {})},
             "annotations": {"summary": summary, "description": description},
             "startsAt": am.iso(starts), "endsAt": am.iso(ends)}
    try:
        am.post_alerts(am.url(cfg), [alert])
    except ODD as err:
        return f"not paged ({name}): " + am.absent(cfg, err)
    return f"paged {name}: {summary}"
