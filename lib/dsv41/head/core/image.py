"""The serving image: pulled by digest on every node when missing, never re-pulled when present;
every node must hold the same image ID (a node that pulled another build is caught here)."""
import dataclasses

from dsv41.errors import UserError
from dsv41.head.core import commands, statefiles
from dsv41.head.core.cluster import Cluster


def pull(cfg):
    """doit image."""
    cl = Cluster(cfg)
    ensure(cl, cl.probe_all())


def ensure(cl, states):
    cfg = cl.cfg
    ids = {}
    for node in cl.nodes:
        image_id = states[node.name].image_id
        if not image_id:
            print(f"[{node.name}] pulling {cfg.image}", flush=True)
            r = node.run(cl.priv(node, commands.docker_pull(cfg.image)), fg=True, check=False)
            if r.code:
                raise UserError(f"{node.label}: docker pull {cfg.image} failed (exit {r.code}); check "
                                "the node's registry access (docker login) and free disk")
            image_id = node.run(commands.docker_image_id(cfg.image)).stdout.strip()
            states[node.name] = dataclasses.replace(states[node.name], image_id=image_id)
        ids[node.name] = image_id
    if len(set(ids.values())) > 1:
        detail = ", ".join(f"{k} {v[:19]}" for k, v in ids.items())
        raise UserError(f"nodes hold different images for {cfg.image} ({detail}): remove the odd one "
                        "(docker rmi) and run `doit image` again")
    statefiles.stamp_image(cfg.state_dir, cfg.image, ids)
    return ids
