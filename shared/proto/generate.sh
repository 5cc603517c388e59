#!/usr/bin/env bash
# Regenerate shared/proto/*_pb2.py and *_grpc.py (grpclib stubs) from the .proto files:
# status.proto (typed errors), grammar.proto (grammar service), worker.proto (worker service).
# Needs grpcio-tools (protoc) and grpclib (the protoc-gen-grpclib_python plugin). grpcio-tools is
# a development tool, not a dependency: grpcio-tools 1.85.1 writes stubs for the protobuf 7.35
# runtime line that constraints.txt pins (7.36.x), e.g. installed aside:
#   pip install --target /tmp/protoc-tools grpcio-tools==1.85.1
#   PYTHONPATH=/tmp/protoc-tools shared/proto/generate.sh
# Run from anywhere; the generated modules import as shared.proto.<name>_pb2 / _grpc.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
wkt="$(python -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
python -m grpc_tools.protoc -I . -I "$wkt" \
  --python_out=. --pyi_out=. --grpclib_python_out=. \
  shared/proto/*.proto
