import torch
from torch import nn

from dacflnode.learning.layout import StateLayout


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))


def test_flat_vector_holds_params_and_float_buffers_but_not_integer_buffers():
    model = small_model()
    layout = StateLayout.from_module(model)
    names = [s.name for s in layout.shared]
    assert "1.running_mean" in names and "1.running_var" in names
    assert [s.name for s in layout.local] == ["1.num_batches_tracked"]
    assert layout.numel == sum(p.numel() for p in model.parameters()) + 4


def test_flatten_then_load_round_trips_exactly():
    model = small_model()
    layout = StateLayout.from_module(model)
    flat = layout.flatten_module(model)
    other = small_model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    layout.load_into(other, flat)
    assert torch.equal(layout.flatten_module(other), flat)


def test_state_dict_restores_local_buffers_and_original_dtypes():
    model = small_model()
    model.state_dict()["1.num_batches_tracked"].fill_(7)
    layout = StateLayout.from_module(model)
    sd = layout.state_dict(layout.flatten_module(model), layout.local_state(model))
    assert sd["1.num_batches_tracked"].item() == 7
    assert sd["1.num_batches_tracked"].dtype == torch.long
    assert sd.keys() == model.state_dict().keys()


def test_fingerprint_changes_with_architecture():
    a = StateLayout.from_module(small_model()).fingerprint()
    b = StateLayout.from_module(nn.Sequential(nn.Linear(8, 3))).fingerprint()
    assert a != b
    assert a == StateLayout.from_module(small_model()).fingerprint()


def test_views_refuse_a_vector_of_the_wrong_size():
    layout = StateLayout.from_module(small_model())
    try:
        layout.views(torch.zeros(layout.numel + 1))
    except ValueError as exc:
        assert "expected" in str(exc)
    else:
        raise AssertionError("no error")
