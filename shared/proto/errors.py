"""Typed Infernix errors as structured gRPC status details (grpclib), never as text to parse.

The server raises `grpc_error(exc)`; the `grpc-status-details-bin` trailer then holds an
`RpcStatus` (wire-compatible with google.rpc.Status) whose details pack one `ErrorDetail`. Both ends
pass `ErrorStatusCodec()` as grpclib's `status_details_codec`; the client turns the error back into
the same Python exception with `typed_error(grpc_error)`.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from google.protobuf import any_pb2
from grpclib.const import Status
from grpclib.encoding.base import StatusDetailsCodecBase
from grpclib.exceptions import GRPCError

from shared.errors import InfernixError, InternalError, error_from_dict
from shared.proto.status_pb2 import ErrorDetail, RpcStatus


class ErrorStatusCodec(StatusDetailsCodecBase):
    """Packs protobuf messages into RpcStatus.details; unpacks the ErrorDetail ones."""

    def encode(self, status: Status, message: str | None, details: Sequence[Any]) -> bytes:
        out = RpcStatus(code=status.value, message=message or "")
        for detail in details or ():
            packed = any_pb2.Any()
            packed.Pack(detail)
            out.details.append(packed)
        return out.SerializeToString()

    def decode(self, status: Status, message: str | None, data: bytes) -> list[ErrorDetail]:
        found = []
        for packed in RpcStatus.FromString(data).details:
            detail = ErrorDetail()
            if packed.Unpack(detail):
                found.append(detail)
        return found


_STATUS_OF_FAULT = {"request": Status.INVALID_ARGUMENT, "overloaded": Status.RESOURCE_EXHAUSTED,
                    "unavailable": Status.UNAVAILABLE}


def grpc_status(exc: InfernixError) -> Status:
    """INVALID_ARGUMENT for a request's fault, RESOURCE_EXHAUSTED for an overload, UNAVAILABLE for
    a missing dependency, INTERNAL otherwise."""
    return _STATUS_OF_FAULT.get(exc.fault, Status.INTERNAL)


def grpc_error(exc: InfernixError) -> GRPCError:
    """The GRPCError that carries `exc` with all its fields."""
    detail = ErrorDetail(type=exc.type_name, error_json=json.dumps(exc.to_dict()))
    return GRPCError(grpc_status(exc), exc.message, details=[detail])


def typed_error(exc: GRPCError) -> InfernixError:
    """The Infernix error a GRPCError carries, or an InternalError naming its status."""
    for detail in exc.details or ():
        if isinstance(detail, ErrorDetail):
            return error_from_dict(json.loads(detail.error_json))
    return InternalError(f"gRPC call failed with {exc.status.name}: {exc.message or 'no message'}")
