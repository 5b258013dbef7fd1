"""vLLM's own settings: its flags as measured on two Sparks (serving-config.md), declared here once.
The settings package checks them like dsv41's own (settings/kinds.py) and keeps their values in
Config.engine; `doit config`, docs/settings.md's table and bash completion show them with the rest.
A profile sets them under their lower-case names (kv_bytes = ...) like any other setting."""
from dsv41.settings.setting import Setting as S

GRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
SECRET_ENV = ("VLLM_API_KEY",)        # the engine's variables that carry a secret: never in a unit file
# the flags dsv41's own settings give: a profile's [args] may not give them another value, or the API
# would not be where, nor serve the name, dsv41 and its clients look for
FLAG_SETTINGS = {"--port": "PORT", "--served-model-name": "SERVED_MODEL_NAME"}

SETTINGS = (
    S("KV_BYTES", "int", 2700000000, "KV cache bytes (fp8; 2,023,717 tokens)", lo=1, hi=128 * 2**30),
    S("MAX_LEN", "int", 262144, "max model length", lo=16, hi=16_777_216),
    S("MAX_SEQS", "int", 2, "max concurrent sequences", lo=1, hi=1024),
    S("NSPEC", "int", 7, "DSpark speculative draft tokens", lo=0, hi=32),
    S("BATCH", "int", 2048, "max batched tokens", lo=1, hi=1_048_576),
    S("GPU_UTIL", "float", 0.88, "GPU memory utilisation", lo=0, hi=1),
    S("GRAPH_MODE", "choice", "FULL_DECODE_ONLY", "CUDA graph mode", choices=GRAPH_MODES),
    S("CAPS", "caps", "", "CUDA graph capture sizes, comma list", lo=1, hi=8192, shown="derived (1..8,12,16)"),
    S("EXTRA", "words", "", "extra vLLM arguments for rank 0 (shell words; no secrets)", shown="(none)"),
    S("ENGINE_CMD", "command", "vllm serve", "the serving image's server command (the rank containers' "
      "entrypoint)", expect="the serving image's command, e.g. vllm serve"),
)


def capture_sizes(max_seqs, nspec):
    """1..min(NSPEC+1, CAP), then NSPEC+1 up to CAP in steps of 4, plus CAP (serving-config.md)."""
    cap = max_seqs * (nspec + 1)
    sizes = set(range(1, min(nspec + 1, cap) + 1))
    sizes.update(range(nspec + 1, cap + 1, 4))
    sizes.add(cap)
    return tuple(sorted(sizes))


def derive(values):
    """The effective values from the configured ones: CAPS, when empty, from MAX_SEQS and NSPEC."""
    return {**values, "CAPS": values["CAPS"] or capture_sizes(values["MAX_SEQS"], values["NSPEC"])}
