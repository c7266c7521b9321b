from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NeighbourStatus(_message.Message):
    __slots__ = ("node_id", "address", "connected", "last_round_received", "bytes_received", "bytes_sent", "latency_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    connected: bool
    last_round_received: int
    bytes_received: int
    bytes_sent: int
    latency_ms: float
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., connected: _Optional[bool] = ..., last_round_received: _Optional[int] = ..., bytes_received: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("node_id", "algorithm", "round", "rounds_total", "phase", "neighbours", "last_accuracy", "last_loss", "consensus_residual", "device", "uptime_s", "listen_address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LAST_LOSS_FIELD_NUMBER: _ClassVar[int]
    CONSENSUS_RESIDUAL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    LISTEN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    algorithm: str
    round: int
    rounds_total: int
    phase: str
    neighbours: _containers.RepeatedCompositeFieldContainer[NeighbourStatus]
    last_accuracy: float
    last_loss: float
    consensus_residual: float
    device: str
    uptime_s: float
    listen_address: str
    def __init__(self, node_id: _Optional[str] = ..., algorithm: _Optional[str] = ..., round: _Optional[int] = ..., rounds_total: _Optional[int] = ..., phase: _Optional[str] = ..., neighbours: _Optional[_Iterable[_Union[NeighbourStatus, _Mapping]]] = ..., last_accuracy: _Optional[float] = ..., last_loss: _Optional[float] = ..., consensus_residual: _Optional[float] = ..., device: _Optional[str] = ..., uptime_s: _Optional[float] = ..., listen_address: _Optional[str] = ...) -> None: ...

class MetricsRequest(_message.Message):
    __slots__ = ("format",)
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    format: str
    def __init__(self, format: _Optional[str] = ...) -> None: ...

class MetricsReply(_message.Message):
    __slots__ = ("content_type", "body")
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    content_type: str
    body: str
    def __init__(self, content_type: _Optional[str] = ..., body: _Optional[str] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopReply(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...
