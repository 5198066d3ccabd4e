#!/usr/bin/env bash
# Regenerate the Python modules under crishim/api/ from the protos under api/:
#   api/runtime/v1/api.proto   CRI v1 (cri-api v0.36.3, plus what cri-api adds after it):
#                              messages and gRPC stubs
#   api/nri/v1alpha1/api.proto NRI (containerd/nri v0.12.0): messages only; its services
#                              are served over ttRPC by crishim/nri, not gRPC
# The generated modules are committed so that a fresh clone works without grpcio-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
out=crishim/api/runtime/v1
mkdir -p "$out" crishim/api/nri/v1alpha1
python3 -m grpc_tools.protoc -I api \
  --python_out=crishim/api --pyi_out=crishim/api --grpc_python_out=crishim/api \
  runtime/v1/api.proto
# protoc writes "from runtime.v1 import api_pb2"; make it a package-absolute import.
sed -i 's/^from runtime\.v1 import api_pb2/from crishim.api.runtime.v1 import api_pb2/' "$out/api_pb2_grpc.py"
python3 -m grpc_tools.protoc -I api --python_out=crishim/api --pyi_out=crishim/api \
  nri/v1alpha1/api.proto
python3 -m grpc_tools.protoc -I api --python_out=crishim/api --pyi_out=crishim/api \
  ttrpc/ttrpc.proto
# NRI's enum OwningPlugins.Field has a value named None, which a stub cannot declare (a
# syntax error for mypy); it stays reachable as Field.Value("None").
sed -i -e 's/^    None: _ClassVar\[/    # None: _ClassVar[/' -e 's/^None: Field$/# None: Field/' \
  crishim/api/nri/v1alpha1/api_pb2.pyi
touch crishim/api/__init__.py crishim/api/runtime/__init__.py "$out/__init__.py" \
  crishim/api/nri/__init__.py crishim/api/nri/v1alpha1/__init__.py \
  crishim/api/ttrpc/__init__.py
echo "generated $out crishim/api/nri/v1alpha1 crishim/api/ttrpc"
