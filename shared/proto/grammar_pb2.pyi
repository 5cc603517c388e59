from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheHit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_HIT_NONE: _ClassVar[CacheHit]
    CACHE_HIT_L1: _ClassVar[CacheHit]
    CACHE_HIT_REDIS: _ClassVar[CacheHit]
CACHE_HIT_NONE: CacheHit
CACHE_HIT_L1: CacheHit
CACHE_HIT_REDIS: CacheHit

class CompileRequest(_message.Message):
    __slots__ = ("model", "kind", "source", "choices", "framing")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    FRAMING_FIELD_NUMBER: _ClassVar[int]
    model: str
    kind: str
    source: str
    choices: _containers.RepeatedScalarFieldContainer[str]
    framing: str
    def __init__(self, model: _Optional[str] = ..., kind: _Optional[str] = ..., source: _Optional[str] = ..., choices: _Optional[_Iterable[str]] = ..., framing: _Optional[str] = ...) -> None: ...

class CompileStats(_message.Message):
    __slots__ = ("hit", "built", "waited", "compile_ms", "queue_ms", "load_ms", "total_ms", "redis_fallback")
    HIT_FIELD_NUMBER: _ClassVar[int]
    BUILT_FIELD_NUMBER: _ClassVar[int]
    WAITED_FIELD_NUMBER: _ClassVar[int]
    COMPILE_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    REDIS_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    hit: CacheHit
    built: bool
    waited: bool
    compile_ms: float
    queue_ms: float
    load_ms: float
    total_ms: float
    redis_fallback: bool
    def __init__(self, hit: _Optional[_Union[CacheHit, str]] = ..., built: _Optional[bool] = ..., waited: _Optional[bool] = ..., compile_ms: _Optional[float] = ..., queue_ms: _Optional[float] = ..., load_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., redis_fallback: _Optional[bool] = ...) -> None: ...

class CompileReply(_message.Message):
    __slots__ = ("key", "stats")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    key: str
    stats: CompileStats
    def __init__(self, key: _Optional[str] = ..., stats: _Optional[_Union[CompileStats, _Mapping]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthReply(_message.Message):
    __slots__ = ("status", "models", "redis_ok")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REDIS_OK_FIELD_NUMBER: _ClassVar[int]
    status: str
    models: _containers.RepeatedScalarFieldContainer[str]
    redis_ok: bool
    def __init__(self, status: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., redis_ok: _Optional[bool] = ...) -> None: ...
