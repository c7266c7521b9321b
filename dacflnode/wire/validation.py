"""What a receiver accepts (:class:`Expectation`) and the checks of a message's fields against
it, run before anything is allocated, and of its values once they are in.

The checks are shared by the :class:`~dacflnode.wire.decoder.Decoder` (fields read from a
header) and the in-memory transport's no-copy path (fields read from the tensors themselves),
so both refuse the same messages in the same terms.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dacflnode.wire.errors import Reason, Refusal, WireError
from dacflnode.wire.message import (
    DTYPES,
    FLOAT_DTYPES,
    MAX_ANCHORS,
    MAX_USED_LOG,
    ROUND_KINDS,
    Kind,
    UsedLog,
    dtype_name_of,
)

#: A compressed state's tensor set: part name -> (dtype, shape).
CompressedSpec = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]


@dataclass
class Expectation:
    """What a receiver accepts: known senders, acceptable rounds, the exact tensor set.

    A message's tensors must be exactly the float32 set ``tensors`` or, when given, exactly the
    ``compressed`` set (names, dtypes and shapes), never a mix. ``copy_next``, when given, is
    the copy id a message must carry (a copy pull's answer).
    """

    senders: Collection[str]
    tensors: Mapping[str, tuple[int, ...]]  # name -> shape, all float32
    accept_round: Callable[[int], Refusal | None] = lambda r: None  # a refusal, or None
    max_degree: int = 1 << 16
    compressed: CompressedSpec | None = None
    copy_next: int | None = None
    #: the kinds of state accepted (a round's push and pull: :data:`ROUND_KINDS`)
    kinds: Collection[Kind] = ROUND_KINDS

    def specs(self, names: Collection[str]) -> Mapping[str, tuple[torch.dtype, tuple[int, ...]]]:
        """The expected ``name -> (dtype, shape)`` set that ``names`` must match: the float32
        one, or the compressed one when ``names`` are its names; raises :class:`WireError`
        when ``names`` match neither."""
        wanted = set(names)
        if wanted == set(self.tensors):
            return {n: (torch.float32, tuple(s)) for n, s in self.tensors.items()}
        if self.compressed is not None and wanted == set(self.compressed):
            return self.compressed
        sets = f"the expected {sorted(self.tensors)}"
        if self.compressed is not None:
            sets += f" or the compressed {sorted(self.compressed)}"
        raise WireError("INVALID_ARGUMENT", f"tensors {sorted(names)} do not match {sets}",
                        Reason.BAD_PAYLOAD)


#: One tensor of a checked message: name, dtype, shape, number of elements.
TensorField = tuple[str, torch.dtype, tuple[int, ...], int]


def check_fields(
    expect: Expectation,
    round_: int,
    degree: int,
    tensors: Sequence[tuple[str, str, tuple[int, ...]]],
) -> list[TensorField]:
    """Check a message's round, degree and ``(name, dtype name, shape)`` list against
    ``expect`` (the sender is checked by the caller) and return ``(name, dtype, shape,
    numel)`` per tensor, in order; raises :class:`WireError` with the code and
    :class:`Reason` a receiver answers with. The tensors must be exactly the float32 set or
    exactly the compressed set of ``expect`` (see :class:`Expectation`).

    Shared by :class:`~dacflnode.wire.decoder.Decoder` (fields read from a header) and the
    in-memory transport's no-copy path (fields read from the tensors themselves), so both
    refuse the same messages in the same terms.
    """
    refused = expect.accept_round(round_)
    if refused is not None:
        raise WireError(refused.code, f"round {round_} refused: {refused.detail}",
                        refused.reason)
    if not 1 <= degree <= expect.max_degree:
        raise WireError("INVALID_ARGUMENT", f"degree {degree} out of range", Reason.BAD_HEADER)
    names = [name for name, _, _ in tensors]
    if len(set(names)) != len(names):
        raise WireError("INVALID_ARGUMENT", f"tensors {names}: a name twice",
                        Reason.BAD_PAYLOAD)
    specs = expect.specs(names)
    shapes: list[TensorField] = []
    for name, dtype, shape in tensors:
        want_dtype, want_shape = specs[name]
        if DTYPES.get(dtype) is not want_dtype:
            raise WireError("INVALID_ARGUMENT",
                            f"tensor {name}: dtype {dtype!r}, expected {dtype_name_of(want_dtype)}",
                            Reason.BAD_PAYLOAD)
        if shape != tuple(want_shape):
            raise WireError(
                "INVALID_ARGUMENT",
                f"tensor {name}: shape {list(shape)}, expected {list(want_shape)}",
                Reason.BAD_PAYLOAD,
            )
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        shapes.append((name, want_dtype, shape, numel))
    return shapes


def check_copy(expect: Expectation, copy_next: int) -> None:
    """Refuse a message whose ``copy_next`` is not the copy id ``expect`` asks for (a copy
    pull answered with another copy)."""
    if expect.copy_next is not None and copy_next != expect.copy_next:
        raise WireError("INVALID_ARGUMENT", f"copy {copy_next} but copy {expect.copy_next} "
                        "was asked for", Reason.BAD_HEADER)


def check_log(
    expect: Expectation, round_: int, state_kind: int, used_log: UsedLog,
    anchors: Sequence[int],
) -> None:
    """Check a message's bookkeeping fields (before anything is allocated): a known
    :class:`~dacflnode.wire.message.Kind` of state, at most :data:`MAX_USED_LOG` earlier rounds
    with at most ``max_degree`` names each, at most :data:`MAX_ANCHORS` anchor rounds, none of
    them in the past."""
    if state_kind not in Kind.__members__.values():
        raise WireError("INVALID_ARGUMENT", f"unknown state kind {state_kind}",
                        Reason.BAD_HEADER)
    if state_kind not in expect.kinds:
        raise WireError("INVALID_ARGUMENT", f"a state of kind {Kind(state_kind).name} does not "
                        "belong in this call", Reason.BAD_HEADER)
    if len(used_log) > MAX_USED_LOG or len(anchors) > MAX_ANCHORS:
        raise WireError("INVALID_ARGUMENT", f"used_log of {len(used_log)} rounds or "
                        f"{len(anchors)} anchors: too many", Reason.BAD_HEADER)
    for r, peers in used_log:
        if r >= round_ or len(peers) > expect.max_degree:
            raise WireError("INVALID_ARGUMENT", f"used_log entry for round {r} with "
                            f"{len(peers)} names (message round {round_})", Reason.BAD_HEADER)
    if any(a <= 0 for a in anchors):
        raise WireError("INVALID_ARGUMENT", "anchor round 0", Reason.BAD_HEADER)


def check_finite(tensors: Mapping[str, torch.Tensor]) -> None:
    """Refuse a state that holds NaN or an infinity (``INVALID_ARGUMENT``,
    :attr:`~Reason.NON_FINITE`): one such value poisons every model it is mixed into, and the
    poison spreads to the whole network within a few rounds. A pass over the payload at
    memory speed: run it off the event loop for large models.

    The sum of a tensor is finite whenever all its values are (unless it overflows), and NaN or
    infinite when one of them is; so one reduction, with no mask allocated, clears an honest
    state, and only a suspicious sum pays for the exact element-wise test. float16 and
    bfloat16 tensors are summed in float32 (an honest float16 sum cannot overflow it); integer
    tensors are always finite."""
    for name, tensor in tensors.items():
        if tensor.dtype not in FLOAT_DTYPES:
            continue
        if bool(torch.isfinite(tensor.sum(dtype=torch.float32))):
            continue
        if not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise WireError("INVALID_ARGUMENT",
                            f"tensor {name} holds {bad} NaN or infinite values",
                            Reason.NON_FINITE)

