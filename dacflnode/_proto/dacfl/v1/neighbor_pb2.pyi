from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("node_id", "protocol_version", "model_fingerprint", "run_fingerprint")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    RUN_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    protocol_version: int
    model_fingerprint: str
    run_fingerprint: str
    def __init__(self, node_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., run_fingerprint: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("node_id", "protocol_version", "model_fingerprint", "run_fingerprint", "round")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    RUN_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    protocol_version: int
    model_fingerprint: str
    run_fingerprint: str
    round: int
    def __init__(self, node_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., run_fingerprint: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class StateHeader(_message.Message):
    __slots__ = ("sender", "round", "degree", "tensors", "payload_bytes", "checksum", "used")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    DEGREE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    sender: str
    round: int
    degree: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    payload_bytes: int
    checksum: bytes
    used: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sender: _Optional[str] = ..., round: _Optional[int] = ..., degree: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., payload_bytes: _Optional[int] = ..., checksum: _Optional[bytes] = ..., used: _Optional[_Iterable[str]] = ...) -> None: ...

class StateChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: StateHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[StateHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("round", "received_bytes")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    round: int
    received_bytes: int
    def __init__(self, round: _Optional[int] = ..., received_bytes: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("requester", "round")
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    requester: str
    round: int
    def __init__(self, requester: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...
