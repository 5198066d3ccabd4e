#!/usr/bin/env bash
# Regenerate crishim/api/runtime/v1/*.py from api/runtime/v1/api.proto.
# The generated modules are committed so that a fresh clone works without grpcio-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
out=crishim/api/runtime/v1
mkdir -p "$out"
python3 -m grpc_tools.protoc -I api \
  --python_out=crishim/api --pyi_out=crishim/api --grpc_python_out=crishim/api \
  runtime/v1/api.proto
# protoc writes "from runtime.v1 import api_pb2"; make it a package-absolute import.
sed -i 's/^from runtime\.v1 import api_pb2/from crishim.api.runtime.v1 import api_pb2/' "$out/api_pb2_grpc.py"
touch crishim/api/__init__.py crishim/api/runtime/__init__.py "$out/__init__.py"
echo "generated $out"
