"""The serving image: pulled by digest on every node when missing, never re-pulled when present;
every node must hold the same image ID (a node that pulled another build is caught here). Its server is
asked once per image which of the recipe's optional flags it takes (vLLM's --shutdown-timeout: 0.18 and
later); the units pass only those."""
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
    asked = statefiles.asked_images(cfg.state_dir)
    image_id = next(iter(ids.values()))
    if asked.get(cfg.image, {}).get("id") != image_id:          # not asked yet, or the tag moved to another build
        asked = {**asked, cfg.image: {"id": image_id, "flags": ask_server(cl)}}
    statefiles.stamp_image(cfg.state_dir, cfg.image, ids, asked)
    return ids


def ask_server(cl):
    """Which of the recipe's optional flags the image's server lists, asked on the head in a container of
    the image with no network (a server that cannot say takes none)."""
    found = []
    for flag, gives in cl.recipe.optional_flags.items():
        print(f"[{cl.head.name}] asking the image's server whether it takes {flag} (once per image)", flush=True)
        entrypoint, args = cl.recipe.flag_probe(flag)
        r = cl.head.run(cl.priv(cl.head, commands.docker_ask(cl.cfg.image, entrypoint, args)), check=False)
        if r.code == 0 and flag in r.stdout:
            found.append(flag)
            print(f"  {flag}: taken: {gives}", flush=True)
        else:
            print(f"  {flag}: not listed, not passed", flush=True)
    return found
