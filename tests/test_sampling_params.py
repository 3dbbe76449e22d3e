import pytest

from engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"n": 0}, "n must"),
        ({"presence_penalty": 3}, "presence_penalty"),
    ],
)
def test_out_of_range_values_name_the_field(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        SamplingParams(**kwargs)


def test_single_stop_string_becomes_list_and_top_k_minus_one_disables():
    p = SamplingParams(stop="###", top_k=-1)
    assert p.stop == ["###"]
    assert p.top_k == 0
