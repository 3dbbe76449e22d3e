"""Sampler tests against plain per-row references written here, not against the sampler's code."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine.request import Request
from engine.sampler import Sampler, apply_sampling_filters
from engine.sampling_params import SamplingParams
from kernels.sampling import sample_inverse_cdf

VOCAB_SIZE = 50
EOS = 7


def make_request(
    params: SamplingParams | None = None,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    index: int = 0,
) -> Request:
    return Request(
        request_id=f"r{id(params)}",
        prompt_token_ids=list(prompt if prompt is not None else [1, 2, 3]),
        sampling_params=params or SamplingParams(),
        max_tokens=100,
        eos_token_id=EOS,
        index=index,
        output_token_ids=list(output or []),
    )


def random_logits(num_rows: int, seed: int, vocab_size: int = VOCAB_SIZE, scale: float = 2.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, vocab_size, generator=generator) * scale


def allowed_tokens_reference(row: list[float], params: SamplingParams) -> set[int]:
    """Per-row reference: temperature, then min-p, top-k and top-p, each renormalizing."""
    scaled = [x / params.temperature for x in row]
    alive = set(range(len(row)))

    def probs_of(tokens: set[int]) -> dict[int, float]:
        top = max(scaled[t] for t in tokens)
        weights = {t: math.exp(scaled[t] - top) for t in tokens}
        total = sum(weights.values())
        return {t: w / total for t, w in weights.items()}

    if params.min_p > 0:
        probs = probs_of(alive)
        best = max(probs.values())
        alive = {t for t in alive if probs[t] >= params.min_p * best}
    if params.top_k > 0:
        ranked = sorted(alive, key=lambda t: -scaled[t])
        alive = set(ranked[: params.top_k])
    if params.top_p < 1:
        probs = probs_of(alive)
        kept, mass = set(), 0.0
        for t in sorted(alive, key=lambda t: -probs[t]):
            kept.add(t)
            mass += probs[t]
            if mass >= params.top_p:
                break
        alive = kept
    return alive


def penalized_reference(row: list[float], request: Request) -> list[float]:
    """Per-row loop: repetition over prompt + output, then frequency and presence."""
    params = request.sampling_params
    out = list(row)
    for t in set(request.prompt_token_ids) | set(request.output_token_ids):
        if out[t] > 0:
            out[t] /= params.repetition_penalty
        else:
            out[t] *= params.repetition_penalty
    counts = Counter(request.output_token_ids)
    for t, count in counts.items():
        out[t] -= params.frequency_penalty * count + params.presence_penalty
    return out


def test_greedy_is_argmax_of_raw_logits_any_dtype():
    sampler = Sampler("cpu", seed=0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        logits = random_logits(16, seed=1).to(dtype)
        requests = [make_request(SamplingParams(temperature=0)) for _ in range(16)]
        out = sampler(logits, requests)
        assert out.sampled_token_ids == logits.float().argmax(dim=-1).tolist()
        assert out.logprobs == [None] * 16


def test_logits_are_not_modified():
    logits = random_logits(3, seed=2)
    before = logits.clone()
    requests = [
        make_request(SamplingParams(repetition_penalty=1.5, min_tokens=5, top_k=3)),
        make_request(SamplingParams(temperature=0, frequency_penalty=1.0), output=[4, 4]),
        make_request(SamplingParams(top_p=0.5, min_p=0.2)),
    ]
    Sampler("cpu", seed=0)(logits, requests)
    assert torch.equal(logits, before)


def test_seeded_row_is_batch_invariant_and_seeds_differ():
    def run(seed: int, position: int, num_others: int, steps: int = 12) -> list[int]:
        sampler = Sampler("cpu")  # fresh, randomly seeded shared generator
        target = make_request(SamplingParams(seed=seed, temperature=1.0, top_k=30))
        tokens = []
        for step in range(steps):
            others = [
                make_request(SamplingParams(temperature=0.5 + 0.1 * k, seed=(k if k % 2 else None)))
                for k in range(num_others)
            ]
            requests = others[:position] + [target] + others[position:]
            logits = random_logits(len(requests), seed=1000 + step + 7 * num_others)
            logits[position] = random_logits(1, seed=step)[0]  # the target's row, fixed
            tokens.append(sampler(logits, requests).sampled_token_ids[position])
            target.output_token_ids.append(tokens[-1])  # what the engine does
        return tokens

    alone = run(seed=1234, position=0, num_others=0)
    assert run(seed=1234, position=3, num_others=9) == alone
    assert run(seed=1234, position=5, num_others=5) == alone
    assert run(seed=4321, position=0, num_others=0) != alone


def test_seeded_generator_created_once_and_n_sequences_differ():
    sampler = Sampler("cpu")
    params = SamplingParams(seed=7)
    first, second = make_request(params, index=0), make_request(params, index=1)
    logits = torch.zeros(2, 1000)  # uniform: the noise alone decides
    tokens = [sampler(logits, [first, second]).sampled_token_ids for _ in range(4)]
    generator = first.generator
    assert isinstance(generator, torch.Generator)
    sampler(logits, [first, second])
    assert first.generator is generator
    assert [t[0] for t in tokens] != [t[1] for t in tokens]


def assert_masks_match_reference(logits, top_k, top_p, min_p, temperature=None):
    temperature = temperature or [1.0] * logits.shape[0]
    masked = apply_sampling_filters(logits, top_k, top_p, min_p, temperature).cpu()
    logits = logits.cpu()
    for i in range(logits.shape[0]):
        params = SamplingParams(
            top_k=top_k[i], top_p=top_p[i], min_p=min_p[i], temperature=temperature[i]
        )
        expected = allowed_tokens_reference(logits[i].tolist(), params)
        kept = set(torch.isfinite(masked[i]).nonzero().flatten().tolist())
        assert kept == expected, f"row {i} ({params})"
        assert torch.equal(masked[i][sorted(kept)], logits[i][sorted(kept)])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_top_k_top_p_min_p_masks_match_reference(device):
    """On the GPU the thresholds come from ``kernels.sampling_filters``."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    logits = random_logits(48, seed=3, scale=3.0).to(device)
    top_k = [0, 1, 5, 17, 49, 50, 3, 0] * 6
    top_p = [0.3, 1.0, 0.9, 0.5, 0.99, 1.0, 1.0, 0.75] * 6
    min_p = [0.0] * 16 + [0.05, 0.3, 0.0, 0.01, 0.2, 0.5, 1.0, 0.1] * 4
    assert_masks_match_reference(logits, top_k, top_p, min_p)
    temperature = [0.3, 0.7, 1.0, 1.5, 2.0, 0.9] * 8
    assert_masks_match_reference(logits, top_k, top_p, min_p, temperature)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_top_p_over_a_large_vocab_uses_every_candidate_stage(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # Peaked rows are settled by the top 64, flatter ones need the top 1024 or a full sort.
    vocab_size = 3000
    scales = [8.0, 3.0, 1.0, 0.3, 0.05, 2.0]
    logits = torch.cat(
        [
            random_logits(1, seed=20 + i, vocab_size=vocab_size, scale=s)
            for i, s in enumerate(scales)
        ]
    ).to(device)
    top_p = [0.95, 0.9, 0.8, 0.9, 0.5, 0.99]
    kept_counts = []
    for top_k in ([0] * 6, [0, 0, 0, 2000, 0, 100]):
        assert_masks_match_reference(logits, top_k, top_p, [0.0] * 6)
        masked = apply_sampling_filters(logits, top_k, top_p)
        kept_counts.append(torch.isfinite(masked).sum(dim=-1).tolist())
    counts = kept_counts[0]
    assert min(counts) < 64 and any(64 < c <= 1024 for c in counts) and max(counts) > 1024


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=6),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=1.0, min_p=0.15),
        SamplingParams(temperature=0.7, min_p=0.05, top_k=10, top_p=0.8),
        SamplingParams(temperature=1.0, top_k=4, seed=11),
    ],
    ids=["top_k", "top_p", "min_p", "all", "seeded"],
)
def test_samples_stay_inside_reference_set(params):
    sampler = Sampler("cpu", seed=5)
    row = random_logits(1, seed=4, scale=1.5)[0]
    allowed = allowed_tokens_reference(row.tolist(), params)
    # 2000 draws: unseeded rows share one call; a seeded row is redrawn over many calls.
    if params.seed is None:
        requests = [make_request(params) for _ in range(2000)]
        seen = Counter(sampler(row.expand(2000, -1), requests).sampled_token_ids)
    else:
        request = make_request(params)
        seen = Counter(sampler(row[None], [request]).sampled_token_ids[0] for _ in range(2000))
    assert set(seen) <= allowed
    # Every allowed token with >= 1% renormalized probability shows up.
    ordered = sorted(allowed)
    probs = torch.softmax(row[ordered] / params.temperature, dim=0).tolist()
    likely = {t for t, p in zip(ordered, probs, strict=True) if p >= 0.01}
    assert likely <= set(seen), (likely, seen)


def test_penalties_match_per_row_loop():
    sampler = Sampler("cpu")
    logits = random_logits(5, seed=6)
    requests = [
        make_request(SamplingParams(repetition_penalty=1.7), prompt=[1, 5, 5, 9], output=[9, 20]),
        make_request(SamplingParams(frequency_penalty=0.8), output=[3, 3, 3, 4]),
        make_request(SamplingParams(presence_penalty=-1.2), output=[3, 3, 11]),
        make_request(
            SamplingParams(repetition_penalty=0.6, frequency_penalty=-0.5, presence_penalty=1.1),
            prompt=list(range(0, 50, 3)),
            output=[2, 2, 8, 49, 2],
        ),
        make_request(SamplingParams(), prompt=[1, 2], output=[4]),  # no penalty at all
    ]
    processed = sampler.process_logits(logits, requests)
    for i, request in enumerate(requests):
        expected = torch.tensor(penalized_reference(logits[i].tolist(), request))
        torch.testing.assert_close(processed[i], expected, rtol=1e-6, atol=1e-6)
    greedy = [
        make_request(
            SamplingParams(
                temperature=0,
                repetition_penalty=r.sampling_params.repetition_penalty,
                frequency_penalty=r.sampling_params.frequency_penalty,
                presence_penalty=r.sampling_params.presence_penalty,
            ),
            prompt=r.prompt_token_ids,
            output=r.output_token_ids,
        )
        for r in requests
    ]
    expected_ids = [
        max(range(VOCAB_SIZE), key=penalized_reference(logits[i].tolist(), r).__getitem__)
        for i, r in enumerate(requests)
    ]
    assert sampler(logits, greedy).sampled_token_ids == expected_ids


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    sampler = Sampler("cpu", seed=0)
    logits = torch.zeros(4, VOCAB_SIZE)
    logits[:, EOS] = 50.0
    logits[:, 30] = 40.0  # a stop token id, second most likely
    logits[:, 12] = 10.0
    params = SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[30])
    sampled = SamplingParams(temperature=1.0, min_tokens=3, stop_token_ids=[30])
    requests = [
        make_request(params, output=[1]),
        make_request(sampled, output=[1, 2]),
        make_request(params, output=[1, 2, 3]),  # min_tokens reached: EOS allowed again
        make_request(SamplingParams(temperature=0, min_tokens=3, ignore_eos=True), output=[]),
    ]
    out = sampler(logits, requests)
    assert out.sampled_token_ids == [12, 12, EOS, 30]


def test_min_tokens_masks_every_eos_id_given_to_the_sampler():
    sampler = Sampler("cpu", seed=0, eos_token_ids=[EOS, 40])
    logits = torch.zeros(2, VOCAB_SIZE)
    logits[:, 40] = 50.0  # a second EOS id (e.g. from generation_config)
    logits[:, 12] = 10.0
    params = SamplingParams(temperature=0, min_tokens=2)
    out = sampler(logits, [make_request(params, output=[1]), make_request(params, output=[1, 2])])
    assert out.sampled_token_ids == [12, 40]


def test_logprobs_are_raw_log_softmax_with_ranks():
    sampler = Sampler("cpu", seed=0)
    logits = random_logits(4, seed=8)
    requests = [
        make_request(SamplingParams(temperature=0.5, top_k=3, repetition_penalty=2.0, logprobs=5)),
        make_request(SamplingParams(logprobs=0)),
        make_request(SamplingParams(temperature=0, logprobs=2)),
        make_request(SamplingParams()),
    ]
    out = sampler(logits, requests)
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert out.logprobs[3] is None
    for i, num_top in [(0, 5), (1, 0), (2, 2)]:
        row = out.logprobs[i]
        sampled = out.sampled_token_ids[i]
        order = reference[i].argsort(descending=True).tolist()
        expected_ids = set(order[:num_top]) | {sampled}
        assert set(row) == expected_ids
        for token_id, logprob in row.items():
            assert logprob.logprob == pytest.approx(reference[i, token_id].item(), abs=1e-5)
            assert logprob.rank == order.index(token_id) + 1
            assert logprob.decoded_token is None
    assert out.logprobs[2][out.sampled_token_ids[2]].rank == 1


def chi_square(counts: Counter, probs: dict[int, float], num_draws: int) -> float:
    return sum((counts.get(t, 0) - num_draws * p) ** 2 / (num_draws * p) for t, p in probs.items())


@pytest.mark.parametrize("seeded", [False, True], ids=["shared", "per-request"])
def test_empirical_distribution_matches_softmax(seeded):
    # Eight likely tokens on both sides of the inverse CDF's 256-token chunk boundaries (and in
    # the short last chunk); the other 992 are so unlikely that they never show up.
    num_draws, vocab_size = 20_000, 1000
    likely = [0, 255, 256, 300, 511, 512, 768, 999]
    row = torch.full((vocab_size,), -30.0)
    row[likely] = torch.tensor([1.0, 0.5, 0.0, -0.3, -1.0, 0.8, -2.0, 0.2])
    probs = dict(zip(likely, torch.softmax(row[likely] / 0.7, dim=0).tolist(), strict=True))
    sampler = Sampler("cpu", seed=123)
    requests = [
        make_request(SamplingParams(temperature=0.7, seed=(k if seeded else None)))
        for k in range(num_draws)
    ]
    counts = Counter(sampler(row.expand(num_draws, -1), requests).sampled_token_ids)
    assert set(counts) <= set(likely)
    # 7 degrees of freedom: P(chi2 > 29.9) = 1e-4, so a correct sampler fails ~never;
    # a wrong temperature (e.g. 1.0) gives a statistic in the hundreds.
    assert chi_square(counts, probs, num_draws) < 29.9
    wrong = dict(zip(likely, torch.softmax(row[likely], dim=0).tolist(), strict=True))
    assert chi_square(counts, wrong, num_draws) > 100


def test_inverse_cdf_matches_a_plain_cumsum_search():
    generator = torch.Generator().manual_seed(30)
    vocab_size = 1000  # three full 256-token chunks and a short one
    weights = torch.rand(6, vocab_size, generator=generator)
    weights[weights < 0.9] = 0.0  # sparse, with whole empty stretches
    weights[5] = 0.0
    weights[5, [0, 256, 999]] = torch.tensor([1.0, 2.0, 3.0])
    for uniform in [torch.rand(6, generator=generator, dtype=torch.float64) for _ in range(200)]:
        got = sample_inverse_cdf(weights, uniform).tolist()
        for i in range(6):
            cdf = weights[i].double().cumsum(0)
            expected = int((cdf <= uniform[i] * cdf[-1]).sum())
            assert got[i] == expected, (i, uniform[i].item())
    edges = torch.tensor([0.0, 1.0 - 2**-53], dtype=torch.float64)
    assert sample_inverse_cdf(weights[5:].expand(2, -1), edges).tolist() == [0, 999]
    late = torch.zeros(2, vocab_size)
    late[:, [300, 998]] = 1.0  # empty first chunk, empty end of the last one
    assert sample_inverse_cdf(late, edges).tolist() == [300, 998]


def test_bad_logits_shape_is_a_value_error():
    sampler = Sampler("cpu")
    with pytest.raises(ValueError, match="one row per request"):
        sampler(torch.zeros(3, VOCAB_SIZE), [make_request()])
    assert sampler(torch.zeros(0, VOCAB_SIZE), []).sampled_token_ids == []


@pytest.mark.gpu
def test_cuda_seeded_batch_invariance_and_greedy():
    device = torch.device("cuda")
    sampler = Sampler(device, seed=0)
    logits = random_logits(8, seed=9, vocab_size=1000).to(device)

    def sample_target(num_others: int) -> list[int]:
        target = make_request(SamplingParams(seed=99, top_p=0.9))
        others = [make_request(SamplingParams()) for _ in range(num_others)]
        rows = torch.cat([logits[:1], logits[1 : 1 + num_others]])
        return [sampler(rows, [target, *others]).sampled_token_ids[0] for _ in range(5)]

    assert sample_target(0) == sample_target(7)
    greedy = [make_request(SamplingParams(temperature=0)) for _ in range(8)]
    assert sampler(logits, greedy).sampled_token_ids == logits.argmax(dim=-1).tolist()
