"""Which serving recipe a configuration runs: the one place that chooses (core.recipe says what a
recipe is)."""
from dsv41.vllm.recipe import Vllm


def for_config(cfg):
    """The recipe for cfg: vLLM, the one dsv41 ships."""
    return Vllm(cfg)
