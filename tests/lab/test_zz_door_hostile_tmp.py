import pytest
from test_vllm import vllm  # noqa: F401
from door_hostile import run_hostile_corpus

pytestmark = [pytest.mark.lab, pytest.mark.vllm]


def test_the_door_gives_no_model_answer_to_a_hostile_client_on_the_fabric(lab, vllm):  # noqa: F811
    run_hostile_corpus(lab, vllm.key, vllm.env)
