"""A small checkpoint in the published layout (a stand-in for the 462 GB DeepSeek-V4.1-Flash-Spark repo):
six random native shards, shards 5 and 6 split into .partNN files, a real sha256 manifest, config.json,
model.safetensors.index.json, reassemble.sh and EXL3 banks qn/q31/q31s with a plan whose `qdir` names them.

    python tests/fixture_checkpoint.py DIR [--mb N] [--parts K]
"""
import argparse
import hashlib
import json
import os
import sys

PLAN = "J268-ho-v31-K5n.json"
BANKS = ("qn", "q31", "q31s")
SPLIT = (5, 6)
BLOCK = 8 << 20


def shard_name(i):
    return f"model-{i:05d}-of-00006.safetensors"


def _random_stream(nbytes, seed):
    """Fast incompressible bytes: one random block, each chunk salted with its index and the seed."""
    base = os.urandom(min(BLOCK, max(nbytes, 64)))
    done, k = 0, 0
    while done < nbytes:
        n = min(BLOCK, nbytes - done)
        salt = hashlib.sha256(f"{seed}:{k}".encode()).digest()
        yield (salt + base[len(salt):n]) if n > len(salt) else salt[:n]
        done, k = done + n, k + 1


def _write(path, chunks):
    h = hashlib.sha256()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        for c in chunks:
            h.update(c)
            f.write(c)
    return h.hexdigest()


def make_checkpoint(dir, shard_bytes=1 << 20, parts=3, split=SPLIT, bank_files=3, bank_bytes=4096,
                    plan=PLAN):
    """Write the checkpoint into `dir` (created). Returns facts the tests compare against:
    {"shards": {name: sha256}, "parts": {name: [part names]}, "exl3_files": n, "plan": plan}."""
    os.makedirs(dir, exist_ok=True)
    shas, part_names = {}, {}
    for i in range(1, 7):
        name = shard_name(i)
        if i not in split:
            shas[name] = _write(os.path.join(dir, name), _random_stream(shard_bytes, name))
            continue
        h = hashlib.sha256()
        per = -(-shard_bytes // parts)
        names = []
        stream = _random_stream(shard_bytes, name)
        buf = b""
        for k in range(parts):
            want = min(per, shard_bytes - k * per)
            pname = f"{name}.part{k:02d}"
            path = os.path.join(dir, pname)
            with open(path, "wb") as f:
                while want > 0:
                    if not buf:
                        buf = next(stream)
                    take, buf = buf[:want], buf[want:]
                    f.write(take)
                    h.update(take)
                    want -= len(take)
            names.append(pname)
        shas[name], part_names[name] = h.hexdigest(), names
    with open(os.path.join(dir, "sha256-manifest.txt"), "w") as f:
        for name in sorted(shas):
            f.write(f"{shas[name]}  {name}\n")
    with open(os.path.join(dir, "config.json"), "w") as f:
        json.dump({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v41"}, f)
    with open(os.path.join(dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 6 * shard_bytes},
                   "weight_map": {f"layers.{i}.weight": shard_name(i) for i in range(1, 7)}}, f)
    with open(os.path.join(dir, "reassemble.sh"), "w") as f:
        f.write("#!/bin/sh\nfor s in 5 6; do cat model-0000$s-of-00006.safetensors.part* "
                "> model-0000$s-of-00006.safetensors; done\n")
    for bank in BANKS:
        for k in range(bank_files):
            _write(os.path.join(dir, "exl3", bank, f"L{k:02d}.part.safetensors"),
                   _random_stream(bank_bytes, f"{bank}{k}"))
    os.makedirs(os.path.join(dir, "exl3", "plan"), exist_ok=True)
    with open(os.path.join(dir, "exl3", "plan", plan), "w") as f:
        json.dump({"qdir": ":".join(BANKS), "layers": 61, "bits": {"L00": 3.1}}, f)
    return {"shards": shas, "parts": part_names, "exl3_files": bank_files * len(BANKS), "plan": plan}


def main():
    ap = argparse.ArgumentParser(description="Write a small checkpoint in the published layout.")
    ap.add_argument("dir")
    ap.add_argument("--mb", type=float, default=1, help="bytes per native shard, in MB (default 1)")
    ap.add_argument("--parts", type=int, default=3, help="parts for shards 5 and 6 (default 3)")
    a = ap.parse_args()
    facts = make_checkpoint(a.dir, shard_bytes=int(a.mb * 1e6), parts=a.parts)
    json.dump(facts, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
