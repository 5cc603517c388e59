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
    CACHE_HIT_SERVICE: _ClassVar[CacheHit]
CACHE_HIT_NONE: CacheHit
CACHE_HIT_L1: CacheHit
CACHE_HIT_REDIS: CacheHit
CACHE_HIT_SERVICE: CacheHit

class CompileRequest(_message.Message):
    __slots__ = ("model", "kind", "source", "choices", "framing", "want_blob", "whitespace")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    FRAMING_FIELD_NUMBER: _ClassVar[int]
    WANT_BLOB_FIELD_NUMBER: _ClassVar[int]
    WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    model: str
    kind: str
    source: str
    choices: _containers.RepeatedScalarFieldContainer[str]
    framing: str
    want_blob: bool
    whitespace: str
    def __init__(self, model: _Optional[str] = ..., kind: _Optional[str] = ..., source: _Optional[str] = ..., choices: _Optional[_Iterable[str]] = ..., framing: _Optional[str] = ..., want_blob: _Optional[bool] = ..., whitespace: _Optional[str] = ...) -> None: ...

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

class BuildInfo(_message.Message):
    __slots__ = ("compile_ms", "memory_bytes", "stored", "serialized_bytes")
    COMPILE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    SERIALIZED_BYTES_FIELD_NUMBER: _ClassVar[int]
    compile_ms: float
    memory_bytes: int
    stored: bool
    serialized_bytes: int
    def __init__(self, compile_ms: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., stored: _Optional[bool] = ..., serialized_bytes: _Optional[int] = ...) -> None: ...

class CompileReply(_message.Message):
    __slots__ = ("key", "stats", "build", "blob", "blob_format")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    BLOB_FORMAT_FIELD_NUMBER: _ClassVar[int]
    key: str
    stats: CompileStats
    build: BuildInfo
    blob: bytes
    blob_format: str
    def __init__(self, key: _Optional[str] = ..., stats: _Optional[_Union[CompileStats, _Mapping]] = ..., build: _Optional[_Union[BuildInfo, _Mapping]] = ..., blob: _Optional[bytes] = ..., blob_format: _Optional[str] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthReply(_message.Message):
    __slots__ = ("status", "models", "redis_ok", "cold_compiles", "cold_waiting")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REDIS_OK_FIELD_NUMBER: _ClassVar[int]
    COLD_COMPILES_FIELD_NUMBER: _ClassVar[int]
    COLD_WAITING_FIELD_NUMBER: _ClassVar[int]
    status: str
    models: _containers.RepeatedScalarFieldContainer[str]
    redis_ok: bool
    cold_compiles: int
    cold_waiting: int
    def __init__(self, status: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., redis_ok: _Optional[bool] = ..., cold_compiles: _Optional[int] = ..., cold_waiting: _Optional[int] = ...) -> None: ...
