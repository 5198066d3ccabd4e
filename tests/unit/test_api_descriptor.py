"""Our api/runtime/v1/api.proto must be wire-identical to CRI v1 (cri-api v0.36.3), and
hold what cri-api's default branch adds after it (the "master" descriptor).

The references are FileDescriptorSets rendered as JSON in ../shared/spec. We compare them
fact by fact with (a) a fresh protoc compile of the .proto and (b) the committed generated
module, so a hand edit of either that drifts from the kubelet's view is caught.

Against each reference every fact it has must be ours, identical; what we have beyond it
must be exactly what the other reference has beyond it: against v0.36.3 the newer RPCs,
messages, fields and SIGNAL_ names, against master 1.36's Signal names (aliases in our
enum, same numbers, so both are wire-identical).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, json_format

REPO = Path(__file__).resolve().parents[2]
PROTO = REPO / "api" / "runtime" / "v1" / "api.proto"
SPEC = REPO.parent / "shared" / "spec"
REFERENCE = SPEC / "cri-api-v0.36.3.descriptor.json"
MASTER = SPEC / "cri-api-master-2026-07-23.descriptor.json"

FDP = descriptor_pb2.FieldDescriptorProto


def _field_facts(f: descriptor_pb2.FieldDescriptorProto,
                 oneofs: list[str]) -> dict[str, object]:
    return {
        "number": f.number,
        "type": FDP.Type.Name(f.type),
        "label": FDP.Label.Name(f.label),
        "type_name": f.type_name,
        "oneof": oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
        "proto3_optional": f.proto3_optional,
        "deprecated": f.options.deprecated,
        "debug_redact": f.options.debug_redact,
    }


def _compare_facts(where: str, ref: dict[str, object], got: dict[str, object]) -> list[str]:
    return [f"{where}: {key} is {got[key]!r}, reference has {ref[key]!r}"
            for key in ref if ref[key] != got[key]]


def _compare_each(where: str, what: str, ref: Iterable[Any], got: Iterable[Any],
                  compare_one: Callable[[str, Any, Any], list[str]]) -> list[str]:
    """Match named descriptors by name: report missing/extra ones, compare the pairs."""
    ref_d = {x.name: x for x in ref}
    got_d = {x.name: x for x in got}
    out = [f"{where}: missing {what} {n}" for n in sorted(ref_d.keys() - got_d.keys())]
    out += [f"{where}: extra {what} {n}" for n in sorted(got_d.keys() - ref_d.keys())]
    for name in sorted(ref_d.keys() & got_d.keys()):
        out += compare_one(f"{where}.{name}", ref_d[name], got_d[name])
    return out


def _compare_enum(where: str, ref: descriptor_pb2.EnumDescriptorProto,
                  got: descriptor_pb2.EnumDescriptorProto) -> list[str]:
    return _compare_each(where, "enum value", ref.value, got.value,
                         lambda w, r, g: _compare_facts(w, {"number": r.number},
                                                        {"number": g.number}))


def _compare_message(where: str, ref: descriptor_pb2.DescriptorProto,
                     got: descriptor_pb2.DescriptorProto) -> list[str]:
    out = _compare_facts(where, {"map_entry": ref.options.map_entry},
                         {"map_entry": got.options.map_entry})
    out += _compare_each(where, "oneof", ref.oneof_decl, got.oneof_decl, lambda w, r, g: [])
    ref_oneofs = [o.name for o in ref.oneof_decl]
    got_oneofs = [o.name for o in got.oneof_decl]
    out += _compare_each(where, "field", ref.field, got.field,
                         lambda w, r, g: _compare_facts(w, _field_facts(r, ref_oneofs),
                                                        _field_facts(g, got_oneofs)))
    out += _compare_each(where, "message", ref.nested_type, got.nested_type, _compare_message)
    out += _compare_each(where, "enum", ref.enum_type, got.enum_type, _compare_enum)
    return out


def _method_facts(m: descriptor_pb2.MethodDescriptorProto) -> dict[str, object]:
    return {"input_type": m.input_type, "output_type": m.output_type,
            "client_streaming": m.client_streaming, "server_streaming": m.server_streaming}


def _compare_service(where: str, ref: descriptor_pb2.ServiceDescriptorProto,
                     got: descriptor_pb2.ServiceDescriptorProto) -> list[str]:
    return _compare_each(where, "method", ref.method, got.method,
                         lambda w, r, g: _compare_facts(w, _method_facts(r), _method_facts(g)))


def compare(ref: descriptor_pb2.FileDescriptorProto,
            got: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """Every wire-relevant difference between two descriptors, as readable lines."""
    out = _compare_facts("file", {"package": ref.package, "syntax": ref.syntax},
                         {"package": got.package, "syntax": got.syntax})
    pkg = "." + ref.package
    out += _compare_each(pkg, "message", ref.message_type, got.message_type, _compare_message)
    out += _compare_each(pkg, "enum", ref.enum_type, got.enum_type, _compare_enum)
    out += _compare_each(pkg, "service", ref.service, got.service, _compare_service)
    return out


def _load(path: Path) -> descriptor_pb2.FileDescriptorProto:
    if not path.exists():
        pytest.skip(f"CRI reference descriptor not found at {path} "
                    "(the shared/ tree must sit beside the clone)")
    fds = json_format.Parse(path.read_text(), descriptor_pb2.FileDescriptorSet())
    assert len(fds.file) == 1
    return fds.file[0]


@pytest.fixture(scope="module")
def reference() -> descriptor_pb2.FileDescriptorProto:
    return _load(REFERENCE)


@pytest.fixture(scope="module")
def master() -> descriptor_pb2.FileDescriptorProto:
    return _load(MASTER)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> descriptor_pb2.FileDescriptorProto:
    protoc = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools is a dev dependency")
    include = Path(protoc.__file__).parent / "_proto"
    out = tmp_path_factory.mktemp("desc") / "api.binpb"
    # A subprocess: grpc_tools' protoc.main keeps global state between calls.
    res = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'api'}", f"-I{include}",
         f"--descriptor_set_out={out}", "runtime/v1/api.proto"],
        capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"protoc failed: {res.stderr}"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    assert [f.name for f in fds.file] == ["runtime/v1/api.proto"]
    return fds.file[0]


def _generated() -> descriptor_pb2.FileDescriptorProto:
    from crishim.api.runtime.v1 import api_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _report(diffs: list[str]) -> str:
    return f"{len(diffs)} differences from CRI v1:\n" + "\n".join(diffs[:50])


def _extra(diffs: list[str]) -> list[str]:
    return sorted(d for d in diffs if ": extra " in d)


def _beyond(ref: descriptor_pb2.FileDescriptorProto, got: descriptor_pb2.FileDescriptorProto,
            other: descriptor_pb2.FileDescriptorProto) -> list[str]:
    """What is wrong with `got` against `ref`: any missing or changed fact, and any extra
    one that the other reference does not have beyond `ref` as well."""
    diffs = compare(ref, got)
    allowed = _extra(compare(ref, other))
    return [d for d in diffs if ": extra " not in d] + (
        [] if _extra(diffs) == allowed else
        [f"beyond the reference: {_extra(diffs)}, expected {allowed}"])


def test_reference_is_what_we_think(reference: descriptor_pb2.FileDescriptorProto,
                                    master: descriptor_pb2.FileDescriptorProto) -> None:
    # Guards the comparer against an empty or wrong reference silently matching.
    assert reference.package == "runtime.v1"
    assert len(reference.message_type) == 170
    services = {s.name: len(s.method) for s in reference.service}
    assert services == {"RuntimeService": 35, "ImageService": 6}
    assert master.package == "runtime.v1"
    assert len(master.message_type) == 175
    assert {s.name: len(s.method) for s in master.service} == {"RuntimeService": 37,
                                                                 "ImageService": 6}


def test_master_adds_what_we_serve_beside_1_36(
        reference: descriptor_pb2.FileDescriptorProto,
        master: descriptor_pb2.FileDescriptorProto) -> None:
    # What the allowances below stand for: master adds these, and only renames Signal's
    # values (so 1.36's names are "missing" from it, the only facts it lacks).
    added = _extra(compare(reference, master))
    assert ".runtime.v1.RuntimeService: extra method CheckpointPod" in added
    assert ".runtime.v1.Mount: extra field mount_options" in added
    assert ".runtime.v1.RuntimeFeatures: extra field mount_options" in added
    assert ".runtime.v1.Signal: extra enum value SIGNAL_SIGTERM" in added
    lacking = [d for d in compare(reference, master) if ": extra " not in d]
    assert lacking and all(d.startswith(".runtime.v1.Signal: missing enum value ")
                           for d in lacking)


@pytest.mark.parametrize("which", ["v0.36.3", "master"])
def test_proto_source_matches_reference(which: str,
                                        reference: descriptor_pb2.FileDescriptorProto,
                                        master: descriptor_pb2.FileDescriptorProto,
                                        compiled: descriptor_pb2.FileDescriptorProto) -> None:
    ref, other = (reference, master) if which == "v0.36.3" else (master, reference)
    diffs = _beyond(ref, compiled, other)
    assert not diffs, _report(diffs)


@pytest.mark.parametrize("which", ["v0.36.3", "master"])
def test_generated_module_matches_reference(
        which: str, reference: descriptor_pb2.FileDescriptorProto,
        master: descriptor_pb2.FileDescriptorProto) -> None:
    ref, other = (reference, master) if which == "v0.36.3" else (master, reference)
    diffs = _beyond(ref, _generated(), other)
    assert not diffs, _report([*diffs, "(run hack/update-codegen.sh)"])


def test_signal_names_are_aliases(compiled: descriptor_pb2.FileDescriptorProto) -> None:
    # Both spellings of every value, 1.36's first (what Name() and JSON give).
    enum = next(e for e in compiled.enum_type if e.name == "Signal")
    assert enum.options.allow_alias
    numbers = [v.number for v in enum.value]
    assert len(numbers) == 2 * len(set(numbers))
    half = len(numbers) // 2
    for old, new in zip(enum.value[:half], enum.value[half:], strict=True):
        assert (new.name, new.number) == ("SIGNAL_" + old.name, old.number)


def test_generated_module_matches_proto_source(
        compiled: descriptor_pb2.FileDescriptorProto) -> None:
    # Catches a .proto edit committed without regenerating the Python code.
    gen = _generated()
    assert compare(compiled, gen) == []
    assert compiled.options.go_package == gen.options.go_package


def _find_field(fdp: descriptor_pb2.FileDescriptorProto, message: str,
                field: str) -> descriptor_pb2.FieldDescriptorProto:
    msg = next(m for m in fdp.message_type if m.name == message)
    return next(f for f in msg.field if f.name == field)


def test_comparer_reports_changed_field_number(
        reference: descriptor_pb2.FileDescriptorProto) -> None:
    mutated = descriptor_pb2.FileDescriptorProto()
    mutated.CopyFrom(reference)
    _find_field(mutated, "PodSandboxConfig", "hostname").number = 99
    diffs = compare(reference, mutated)
    assert diffs == [".runtime.v1.PodSandboxConfig.hostname: number is 99, reference has 2"]


def test_comparer_reports_other_kinds_of_drift(
        reference: descriptor_pb2.FileDescriptorProto) -> None:
    mutated = descriptor_pb2.FileDescriptorProto()
    mutated.CopyFrom(reference)
    _find_field(mutated, "AuthConfig", "password").options.debug_redact = False
    _find_field(mutated, "ContainerConfig", "envs").type_name = ".runtime.v1.Mount"
    runtime = next(s for s in mutated.service if s.name == "RuntimeService")
    next(m for m in runtime.method if m.name == "GetContainerEvents").server_streaming = False
    mutated.enum_type[0].value[0].number = 7
    # Map entries are nested messages: a changed key type must be reported too.
    labels = next(m for m in mutated.message_type if m.name == "PodSandboxConfig")
    entry = next(n for n in labels.nested_type if n.name == "LabelsEntry")
    entry.field[0].type = FDP.TYPE_BYTES
    text = "\n".join(compare(reference, mutated))
    assert "AuthConfig.password: debug_redact is False" in text
    assert "ContainerConfig.envs: type_name is '.runtime.v1.Mount'" in text
    assert "GetContainerEvents: server_streaming is False" in text
    assert f"{mutated.enum_type[0].name}.{mutated.enum_type[0].value[0].name}: number is 7" \
        in text
    assert "PodSandboxConfig.LabelsEntry.key: type is 'TYPE_BYTES'" in text


def test_comparer_reports_missing_and_extra_messages(
        reference: descriptor_pb2.FileDescriptorProto) -> None:
    mutated = descriptor_pb2.FileDescriptorProto()
    mutated.CopyFrom(reference)
    mutated.message_type[0].name = "Renamed"
    diffs = compare(reference, mutated)
    assert f".runtime.v1: missing message {reference.message_type[0].name}" in diffs
    assert ".runtime.v1: extra message Renamed" in diffs


def test_beyond_reports_an_addition_no_reference_has(
        reference: descriptor_pb2.FileDescriptorProto,
        master: descriptor_pb2.FileDescriptorProto) -> None:
    mutated = descriptor_pb2.FileDescriptorProto()
    mutated.CopyFrom(master)
    mutated.message_type.add(name="NotInAnyCRI")
    _find_field(mutated, "Mount", "mount_options").number = 12
    text = "\n".join(_beyond(reference, mutated, master))
    assert "extra message NotInAnyCRI" in text
    assert _beyond(master, mutated, reference) == [
        ".runtime.v1.Mount.mount_options: number is 12, reference has 11",
        f"beyond the reference: {_extra(compare(master, mutated))}, "
        f"expected {_extra(compare(master, reference))}"]


def _classes_of(fdp: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Message classes built from a descriptor in a pool of their own: a client compiled
    against that CRI version."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(
                pool.FindMessageTypeByName(f"runtime.v1.{m.name}"))
            for m in fdp.message_type}


def test_a_1_36_client_sees_the_same_bytes(
        reference: descriptor_pb2.FileDescriptorProto) -> None:
    from crishim.api.runtime.v1 import api_pb2 as pb

    old = _classes_of(reference)
    config = json_format.ParseDict({
        "metadata": {"name": "app"}, "image": {"image": "busybox"},
        "stopSignal": "SIGRTMINPLUS1",
        "mounts": [{"containerPath": "/data", "hostPath": "/srv", "readonly": True,
                    "propagation": "PROPAGATION_HOST_TO_CONTAINER",
                    "uidMappings": [{"hostId": 1000, "length": 10}]}],
        "linux": {"securityContext": {"namespaceOptions": {
            "network": "NODE", "usernsOptions": {"mode": "POD"}}}},
    }, old["ContainerConfig"]())
    status = json_format.ParseDict({
        "runtimeHandlers": [{"name": "runc", "features": {"userNamespaces": True}}],
        "features": {"supplementalGroupsPolicy": True, "userNamespacesHostNetwork": True},
    }, old["StatusResponse"]())
    for msg, ours in ((config, pb.ContainerConfig), (status, pb.StatusResponse)):
        wire = msg.SerializeToString(deterministic=True)
        parsed = ours.FromString(wire)
        assert parsed.SerializeToString(deterministic=True) == wire
        # And what we send back parses in the old client to the message it sent.
        assert type(msg).FromString(parsed.SerializeToString()) == msg
        # The JSON form (crictl -o json, logs) is the 1.36 one, Signal names included.
        assert json_format.MessageToDict(parsed) == json_format.MessageToDict(msg)
