
import numpy as np
import pytest
import torch

from dacflnode.algorithms.compression import (
    BF16_MAX,
    FP16_MAX,
    INT8_BLOCK,
    Compressor,
    make_compressor,
    parse_compression,
    random_indices,
    sparse_count,
    stable_seed,
    top_indices,
)

KINDS = ["fp16", "bf16", "int8", "topk:0.01", "topk:0.3", "randk:0.01", "randk:0.3", "randk:0.8"]


def compressor(spec: str) -> Compressor:
    made = make_compressor(spec)
    assert made is not None
    return made


def vector(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def over_the_wire(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The parts as a receiver rebuilds them from bytes: fresh tensors, no shared storage."""
    return {name: torch.frombuffer(bytearray(t.numpy().tobytes()) if t.dtype != torch.bfloat16
                                   else bytearray(t.view(torch.int16).numpy().tobytes()),
                                   dtype=t.dtype).clone()
            for name, t in parts.items()}


# --- the setting ------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["zip", "topk", "randk", "topk:0", "topk:1.5", "randk:-0.1",
                                  "topk:x", "int8:4", "fp16:0.5", "topk:nan"])
def test_make_compressor_refuses_malformed_settings_with_what_is_accepted(text):
    with pytest.raises(ValueError, match=r"\(0, 1\]|fraction|choose"):
        make_compressor(text)


def test_none_has_no_compressor_and_each_kind_makes_its_own():
    assert make_compressor("none") is None
    assert make_compressor(parse_compression("none")) is None
    made = {spec: type(compressor(spec)).__name__ for spec in ["fp16", "bf16", "int8",
                                                               "topk:0.1", "randk:0.1"]}
    assert made == {"fp16": "Float16Compressor", "bf16": "BFloat16Compressor",
                    "int8": "Int8Compressor", "topk:0.1": "TopKCompressor",
                    "randk:0.1": "RandKCompressor"}
    assert str(compressor("topk:0.01").spec) == "topk:0.01"


def test_sparse_count_is_the_ceiling_of_the_fraction_and_at_least_one():
    assert sparse_count(0.01, 1_000) == 10
    assert sparse_count(0.07, 100) == 7  # not 8 from 0.07 · 100 = 7.000000000000001
    assert sparse_count(0.01, 1_001) == 11
    assert sparse_count(0.001, 10) == 1
    assert sparse_count(1.0, 10) == 10
    assert sparse_count(0.5, 0) == 0


# --- shapes and bytes -------------------------------------------------------------------------

@pytest.mark.parametrize("spec", KINDS)
@pytest.mark.parametrize("n", [1, 511, 512, 513, 5_000])
def test_encode_makes_exactly_the_announced_parts_and_bytes(spec, n):
    c = compressor(spec)
    parts = c.encode(vector(n), seed=3)
    assert {name: (t.dtype, tuple(t.shape)) for name, t in parts.items()} == c.parts(n)
    assert sum(t.numel() * t.element_size() for t in parts.values()) == c.wire_bytes(n)
    decoded = c.decode(parts, n, seed=3)
    assert decoded.dtype == torch.float32 and decoded.shape == (n,)


@pytest.mark.parametrize(("spec", "ratio"), [("int8", 3.9), ("topk:0.01", 45.0),
                                             ("randk:0.01", 90.0), ("fp16", 2.0), ("bf16", 2.0)])
def test_compressed_vectors_are_smaller_than_float32_by_the_promised_ratio(spec, ratio):
    n = 1_660_000
    assert 4 * n / compressor(spec).wire_bytes(n) >= ratio


def test_int8_sends_a_float32_scale_per_block_of_512():
    c = compressor("int8")
    assert c.parts(1025) == {"q": (torch.int8, (1025,)), "scale": (torch.float32, (3,))}


# --- exact decoding ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec", KINDS)
def test_both_ends_of_an_edge_update_their_copies_to_the_same_bits(spec):
    c = compressor(spec)
    n = 3_000
    copy = vector(n, seed=1)
    delta = vector(n, seed=2) - copy
    seed = stable_seed(0, 4, 17, "x")
    sent = c.encode(delta, seed)
    assert all(torch.equal(a, b) for a, b in zip(sent.values(), c.encode(delta, seed).values(),
                                                 strict=True))  # the sender is reproducible
    sender_copy = copy.clone() + c.decode(sent, n, seed)
    receiver_copy = copy.clone() + c.decode(over_the_wire(sent), n, seed)
    assert torch.equal(sender_copy, receiver_copy)
    assert torch.equal(c.decode(sent, n, seed), c.decode(sent, n, seed))


def test_fp16_clamps_to_its_finite_range_and_decodes_the_exact_cast():
    c = compressor("fp16")
    delta = torch.tensor([1e6, -1e6, 65504.0, 1.5, -2.0**-20, 3.1415926], dtype=torch.float32)
    decoded = c.decode(c.encode(delta, 0), 6, 0)
    assert torch.isfinite(decoded).all()
    assert decoded[:3].tolist() == [FP16_MAX, -FP16_MAX, FP16_MAX]
    assert torch.equal(decoded[3:], delta[3:].half().float())


def test_bf16_clamps_to_its_finite_range_and_decodes_the_exact_cast():
    c = compressor("bf16")
    delta = torch.tensor([3.4e38, -3.4e38, 1.0, 0.1], dtype=torch.float32)
    decoded = c.decode(c.encode(delta, 0), 4, 0)
    assert decoded[:2].tolist() == [BF16_MAX, -BF16_MAX]
    assert torch.equal(decoded[2:], delta[2:].bfloat16().float())


def test_int8_rounding_is_unbiased_over_seeds_and_off_by_less_than_a_step():
    c = compressor("int8")
    n = 2 * INT8_BLOCK + 100  # a short last block
    delta = vector(n, seed=5) * torch.linspace(0.01, 10.0, n)
    scale = c.encode(delta, 0)["scale"]
    step = scale.repeat_interleave(INT8_BLOCK)[:n]
    total = torch.zeros(n, dtype=torch.float64)
    seeds = 400
    for seed in range(seeds):
        decoded = c.decode(c.encode(delta, seed), n, seed)
        assert bool(((decoded - delta).abs() <= step * (1 + 1e-6)).all())
        total += decoded.double()
    bias = (total / seeds - delta.double()).abs() / step.double()
    # the rounding error of one draw has standard deviation ≤ step / 2: 400 draws average it to
    # ≤ step / 40, so a quarter step is ten standard deviations
    assert float(bias.max()) < 0.25
    assert float(scale[0]) == pytest.approx(float(delta[:INT8_BLOCK].abs().max()) / 127)


def test_int8_sends_a_zero_block_as_zeros_with_scale_zero():
    c = compressor("int8")
    delta = torch.cat([torch.zeros(INT8_BLOCK), torch.ones(10)])
    parts = c.encode(delta, 1)
    assert parts["scale"].tolist() == [0.0, pytest.approx(1 / 127)]
    assert not parts["q"][:INT8_BLOCK].any()
    assert torch.equal(c.decode(parts, delta.numel(), 1), delta)


# --- topk and randk ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1_000, 300_000])
def test_topk_keeps_the_entries_of_largest_magnitude_in_ascending_order(n):
    delta = vector(n, seed=9)
    c = compressor("topk:0.01")
    parts = c.encode(delta, 0)
    k = sparse_count(0.01, n)
    expected = torch.sort(torch.topk(delta.abs(), k).indices).values
    assert torch.equal(parts["indices"].long(), expected)
    assert torch.equal(parts["values"], delta[expected])
    decoded = c.decode(parts, n, 0)
    assert torch.equal(decoded[expected], delta[expected])
    assert int(torch.count_nonzero(decoded)) == k


def test_topk_breaks_ties_at_the_kth_magnitude_towards_the_lowest_indices():
    delta = torch.tensor([1.0, -2.0, 2.0, -1.0, 2.0, 1.0, -1.0, 0.5])
    assert top_indices(delta, 2).tolist() == [1, 2]
    assert top_indices(delta, 4).tolist() == [0, 1, 2, 4]
    assert top_indices(torch.ones(10), 3).tolist() == [0, 1, 2]


def test_topk_is_exact_when_the_sampled_threshold_misjudges():
    n, k = 400_000, 4_000
    delta = torch.rand(n, generator=torch.Generator().manual_seed(1))
    delta[:: n // 32_768] += 100.0  # only the sampled entries are large: too few candidates
    expected = torch.sort(torch.topk(delta, k).indices).values
    assert torch.equal(top_indices(delta, k), expected)


@pytest.mark.parametrize(("n", "k"), [(100_000, 1_000), (100_000, 60_000), (50, 5), (7, 7)])
def test_randk_indices_are_distinct_sorted_and_a_function_of_the_seed(n, k):
    first = random_indices(stable_seed(1, 2, 3, "x"), n, k)
    again = random_indices(stable_seed(1, 2, 3, "x"), n, k)
    other = random_indices(stable_seed(1, 2, 4, "x"), n, k)
    assert torch.equal(first, again)
    assert first.numel() == k and bool((first[1:] > first[:-1]).all())
    assert int(first[0]) >= 0 and int(first[-1]) < n
    if k < n:
        assert not torch.equal(first, other)


def test_randk_indices_do_not_change_between_versions():
    # both ends of an edge must derive these: a change here splits a mixed-version cluster
    assert random_indices(12345, 50, 5).tolist() == [3, 34, 41, 47, 49]
    assert random_indices(12345, 50, 40).tolist()[:10] == [0, 1, 3, 4, 5, 6, 7, 9, 10, 11]


def test_randk_picks_every_index_about_equally_often():
    n, k, draws = 100, 10, 400
    counts = np.zeros(n)
    for seed in range(draws):
        counts[random_indices(seed, n, k).numpy()] += 1
    # expected 40 each; binomial standard deviation 6
    assert counts.min() >= 15 and counts.max() <= 65


def test_randk_sends_unscaled_values_at_the_seeded_indices():
    n = 10_000
    delta = vector(n, seed=3)
    c = compressor("randk:0.01")
    parts = c.encode(delta, 77)
    indices = random_indices(77, n, 100)
    assert torch.equal(parts["values"], delta[indices])
    decoded = c.decode(parts, n, 77)
    assert torch.equal(decoded[indices], delta[indices])
    assert int(torch.count_nonzero(decoded)) == 100
    assert not torch.equal(c.decode(parts, n, 78), decoded)


def test_stable_seed_is_fixed_63_bit_and_separates_its_parts():
    assert stable_seed(0, 3, 17, "x") == 6542993343963689294
    assert stable_seed("run", 1) == 3673724972401139366
    seeds = {stable_seed(0, 3, 17, "x"), stable_seed(0, 3, 17, "omega"),
             stable_seed("0", 3, 17, "x"), stable_seed(0, 17, 3, "x"), stable_seed("ab", "c"),
             stable_seed("a", "bc")}
    assert len(seeds) == 6
    assert all(0 <= s < 2**63 for s in seeds)
    with pytest.raises(TypeError):
        stable_seed(1.5)  # type: ignore[arg-type]


# --- hostile payloads -------------------------------------------------------------------------

def hostile_cases() -> list[tuple[str, int, dict[str, torch.Tensor], str]]:
    nan, inf = float("nan"), float("inf")
    n = 600
    q8 = torch.zeros(n, dtype=torch.int8)
    ok_scale = torch.ones(2)
    k = sparse_count(0.01, n)  # 6
    values = torch.ones(k)
    idx = torch.arange(k, dtype=torch.int32) * 10
    return [
        ("fp16", n, {"q": torch.full((n,), inf, dtype=torch.float16)}, "infinite"),
        ("fp16", n, {"q": torch.full((n,), nan, dtype=torch.float16)}, "NaN"),
        ("bf16", n, {"q": torch.full((n,), nan, dtype=torch.bfloat16)}, "NaN"),
        ("int8", n, {"q": q8, "scale": torch.tensor([1.0, nan])}, "scale"),
        ("int8", n, {"q": q8, "scale": torch.tensor([inf, 1.0])}, "scale"),
        ("int8", n, {"q": q8, "scale": torch.tensor([1.0, -1.0])}, "negative"),
        ("int8", n, {"q": torch.full((n,), -128, dtype=torch.int8), "scale": ok_scale}, "-128"),
        ("int8", n, {"q": torch.full((n,), 127, dtype=torch.int8),
                     "scale": torch.tensor([3e38, 1.0])}, "too large"),
        ("int8", n, {"q": q8, "scale": torch.ones(3)}, "shape"),
        ("int8", n, {"q": q8.float(), "scale": ok_scale}, "must be"),
        ("int8", n, {"q": q8}, "parts"),
        ("topk:0.01", n, {"values": values, "indices": torch.cat([idx[:-1], idx.new_tensor([n])])},
         "outside"),
        ("topk:0.01", n, {"values": values, "indices": torch.cat([idx.new_tensor([-1]), idx[1:]])},
         "outside"),
        ("topk:0.01", n, {"values": values, "indices": torch.cat([idx[:2], idx[1:-1]])},
         "increasing"),
        ("topk:0.01", n, {"values": values, "indices": idx.flip(0)}, "outside|increasing"),
        ("topk:0.01", n, {"values": values, "indices": torch.cat([idx[:3], idx[4:5], idx[3:4],
                                                                  idx[5:]])}, "increasing"),
        ("topk:0.01", n, {"values": torch.tensor([1.0, 2.0, nan, 1.0, 1.0, 1.0]), "indices": idx},
         "NaN"),
        ("topk:0.01", n, {"values": torch.tensor([1.0, 2.0, inf, 1.0, 1.0, 1.0]), "indices": idx},
         "infinite"),
        ("topk:0.01", n, {"values": values, "indices": idx.long()}, "must be"),
        ("randk:0.01", n, {"values": torch.tensor([1.0, 2.0, nan, 1.0, 1.0, 1.0])}, "NaN"),
        ("randk:0.01", n, {"values": torch.ones(k + 1)}, "shape"),
    ]


@pytest.mark.parametrize(("spec", "n", "parts", "message"), hostile_cases(),
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(hostile_cases())])
def test_decode_refuses_parts_no_honest_encoder_makes(spec, n, parts, message):
    with pytest.raises(ValueError, match=message):
        compressor(spec).decode(parts, n, seed=0)


def test_encode_refuses_what_is_not_a_flat_float32_vector():
    with pytest.raises(ValueError, match="flat float32"):
        compressor("int8").encode(torch.zeros(4, 4), 0)
    with pytest.raises(ValueError, match="flat float32"):
        compressor("topk:0.1").encode(torch.zeros(16, dtype=torch.float64), 0)


def test_default_steps_are_one_for_casts_and_shrink_with_the_fraction_sent():
    assert [compressor(s).default_gamma for s in ["fp16", "bf16", "int8"]] == [1.0, 1.0, 1.0]
    assert compressor("topk:0.01").default_gamma == pytest.approx(0.0232, abs=1e-4)
    assert compressor("topk:0.1").default_gamma == pytest.approx(0.1077, abs=1e-4)
    assert compressor("randk:0.01").default_gamma == pytest.approx(0.005)
    assert compressor("randk:0.1").default_gamma == pytest.approx(0.05)
    # nothing dropped: plain gossip
    assert compressor("topk:1").default_gamma == compressor("randk:1").default_gamma == 1.0
