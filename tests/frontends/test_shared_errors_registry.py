"""Every registered error type survives its dictionary and gRPC round trips, with every service
imported first (a service that redefined an error name used to overwrite the registry, turning a
typed error rebuilt from its dictionary into an internal one)."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

import services
import shared
from shared.errors import InfernixError, InvalidRequest, error_from_dict

# Values for the optional fields, by annotation; every field gets a non-default value so that a
# field lost in a round trip shows.
_SAMPLES = {"str": "x/y", "int": 3, "float": 1.5}


def _import_everything() -> None:
    for package in (shared, services):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if ".proto." in info.name and info.name.endswith("_grpc"):
                continue  # generated stubs: imported through their clients
            importlib.import_module(info.name)


def _instance(cls: type[InfernixError]) -> InfernixError:
    kwargs = {"message": f"a {cls.__name__} for the round trip"}
    for f in dataclasses.fields(cls):
        if f.name == "message":
            continue
        annotation = str(f.type)
        if f.name == "source":
            kwargs[f.name] = "tool_arguments"
            continue
        for key, value in _SAMPLES.items():
            if annotation.startswith(key):
                kwargs[f.name] = value
                break
    return cls(**kwargs)


def _registered() -> list[type[InfernixError]]:
    """Every error class: those of shared.errors and whatever else registered itself, after
    importing every module of shared/ and services/."""
    import shared.errors as errors

    _import_everything()
    defined = {v for v in vars(errors).values()
               if isinstance(v, type) and issubclass(v, InfernixError)}
    return sorted(defined | set(InfernixError.registry.values()), key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", _registered(), ids=lambda c: c.__name__)
def test_every_error_round_trips_through_dict_and_grpc(cls):
    from grpclib.exceptions import GRPCError

    from shared.proto.errors import ErrorStatusCodec, grpc_error, typed_error

    error = _instance(cls)
    again = error_from_dict(error.to_dict())
    assert type(again) is cls and again.to_dict() == error.to_dict()

    wire = grpc_error(error)
    codec = ErrorStatusCodec()
    data = codec.encode(wire.status, wire.message, wire.details)
    received = GRPCError(wire.status, wire.message, codec.decode(wire.status, wire.message, data))
    back = typed_error(received)
    assert type(back) is cls and back.to_dict() == error.to_dict()


def test_a_second_class_of_a_registered_name_is_refused():
    """One class per error, registered once."""
    with pytest.raises(TypeError, match="already defined"):
        type("InvalidRequest", (InfernixError,), {"__module__": "somewhere.else"})
    assert InfernixError.registry["InvalidRequest"] is InvalidRequest
    assert error_from_dict({"type": "InvalidRequest", "message": "m", "field": "f"}) == \
        InvalidRequest("m", field="f")
