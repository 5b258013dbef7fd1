"""The one place the cluster's observation is built (core.health.Observation): every node's probe, the
API's /health and /metrics, the token probe, and what the record holds (core.record, through
core.statefiles). `doit status`, `doit top`, `doit launch`, the watchdog and the rollout's hold each
build it here and judge it with core.health.assess, so all five judge the same value the same way.
observation() makes it from what a caller gathered (status, which prints a node's row as it comes,
and top, whose core.top_watch never waits on a node); look() gathers it in one synchronous pass and
judged() judges that look (the watchdog, launch and the hold). The cluster is passed in (a
core.cluster.Cluster), never imported: the rollout's hold imports this module, and the
import chain through it stays short."""
import time

from dsv41.errors import UserError, one_line
from dsv41.head.core import record
from dsv41.head.core.health import NO_TOKEN, TOKEN, Memory, Observation, assess, wants_probe


# ---- the observation ------------------------------------------------------------------------------

def observation(cfg, states, health, metrics=None, probe=None, api_error=None, problems=None, now=None):
    """The Observation of what a caller gathered (states: {node name: NodeState}, health: /health's
    status or None, metrics: a /metrics snapshot, probe: the token probe's answer, api_error: a request
    that should have worked and failed), with the record's readiness mark and view read here. problems:
    None, a state file that cannot be read raises; a list, it is said there and read as absent."""
    return Observation(time.time() if now is None else now, states, health, metrics, probe,
                       ready_at=record.ready_at(cfg.records, problems), api_error=api_error,
                       record=record.view(cfg.records, problems=problems))


def look(cl, states=None, scrape=True, probe=None, mem=None, api_error=None, problems=None):
    """One synchronous look: every node probed afresh (unless states are given), /health, and /metrics
    when /health answered (scrape). probe: None, no token is asked; "idle", the watchdog's one-token
    probe, when no request runs or waits or when work made no progress for WATCHDOG_STALL_S
    (health.wants_probe, with the caller's Memory mem): a probe that got no token asks /health once
    more, so a server that stopped between the two is down (DEAD), not a wedged engine, and after a stall
    reads /metrics again, so a long step that ended while the probe waited in the queue is progress; "ready", the
    recipe's readiness, once every engine unit is active and a readiness wait saw this start of rank 0
    generate (launch and the hold: a start-up is left to the readiness wait). Never raises for a node
    or the API being down."""
    cfg = cl.cfg
    states = cl.observe() if states is None else states
    client = cl.engine_client(read_timeout=cfg.watchdog_probe_s, problems=problems)
    health, snap, token = client.health(), None, None
    if scrape and health is not None:          # a server that did not answer /health would not answer this
        snap = scraped(cl, client)
    if health == 200 and probe == "idle" and wants_probe(cfg, mem, snap, cl.recipe):
        token = token_probe(client, cfg.served_model_name)
        if token == NO_TOKEN:
            again = client.health()
            if again != 200:
                health, token = again, None
            elif snap is not None and any(cl.recipe.work(snap)):
                snap = scraped(cl, client) or snap     # a stall's probe: a signal that moved meanwhile is progress
    elif health == 200 and probe == "ready" and generated_since_start(cl, states, problems):
        token = TOKEN if cl.recipe.ready(client) else NO_TOKEN
    return observation(cfg, states, health, snap, token, api_error, problems)


def scraped(cl, client):
    """The engine's /metrics snapshot, None when it could not be read."""
    try:
        return cl.recipe.scrape(timeout=client.health_timeout, key=client.key)
    except UserError:
        return None


def judged(cl, mem=None, **how):
    """(look(cl, mem=mem, **how), its Health by core.health.assess), with the caller's Memory (a fresh
    one when None: launch, a hold's look)."""
    mem = Memory() if mem is None else mem
    obs = look(cl, mem=mem, **how)
    return obs, assess(cl.cfg, obs, mem, cl.recipe)


def generated_since_start(cl, states, problems=None):
    """Every engine unit active, and a readiness wait saw a token since rank 0 last started."""
    ready = record.ready_at(cl.cfg.records, problems)
    started = max((states[cl.head.name].unit(u).since for u in cl.engine_units(cl.head)), default=0.0)
    every = [states[n.name].unit(u) for n in cl.nodes for u in cl.engine_units(n)]
    return ready is not None and ready >= started and all(u.active == "active" for u in every)


def token_probe(client, model):
    """One streamed token within the client's read timeout: TOKEN, NO_TOKEN or "error ..."."""
    try:
        s = client.stream("/completions", {"model": model, "prompt": "Hello", "max_tokens": 1},
                          stop_after_first=True)
        return TOKEN if s.t_first is not None else NO_TOKEN
    except UserError as err:
        status = getattr(err, "status", None)
        if status is None and "timed out" in str(err):
            return NO_TOKEN
        return f"error {status or one_line(err, 120)}"
