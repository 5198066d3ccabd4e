"""Parsing and validating CDI spec files."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crishim.cdi.spec import (
    CURRENT,
    ContainerEdits,
    DeviceNode,
    Hook,
    IntelRdt,
    Mount,
    NetDevice,
    SpecError,
    parse,
    parse_document,
    required_version,
)


def _doc(version: str = "0.3.0", **kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"cdiVersion": version, "kind": "vendor.com/dev",
                           "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}
    doc.update(kw)
    return doc


def _dev(name: str = "a", **edits: Any) -> dict[str, Any]:
    return {"name": name, "containerEdits": edits or {"env": ["A=1"]}}


YAML_SPEC = b"""---
cdiVersion: "0.7.0"
kind: vendor.com/fpga
annotations:
  vendor.com/firmware: "1.2"
containerEdits:
  env: [VENDOR_FPGA=1]
  hooks:
  - hookName: createContainer
    path: /usr/bin/vendor-hook
    args: [vendor-hook, --update]
    env: [DEBUG=1]
    timeout: 5
devices:
- name: fpga0
  annotations: {slot: "3"}
  containerEdits:
    deviceNodes:
    - path: /dev/fpga0
      hostPath: /dev/vendor/fpga0
      type: c
      major: 240
      minor: 0
      fileMode: 0660
      permissions: rw
      uid: 0
      gid: 44
    mounts:
    - hostPath: /usr/lib/vendor
      containerPath: /usr/lib/vendor
      type: bind
      options: [ro, nosuid, nodev, bind]
    additionalGids: [44]
    intelRdt: {closID: fpga}
"""


def test_yaml_spec_with_every_edit_kind() -> None:
    spec = parse(YAML_SPEC, yaml_syntax=True)
    assert (spec.version, spec.kind, spec.vendor, spec.cls) == ("0.7.0", "vendor.com/fpga",
                                                                "vendor.com", "fpga")
    assert spec.annotations == {"vendor.com/firmware": "1.2"}
    assert spec.edits.env == ("VENDOR_FPGA=1",)
    assert spec.edits.hooks == (Hook("createContainer", "/usr/bin/vendor-hook",
                                     ("vendor-hook", "--update"), ("DEBUG=1",), 5),)
    dev = spec.device("fpga0")
    assert dev is not None and dev.annotations == {"slot": "3"}
    assert dev.edits == ContainerEdits(
        device_nodes=(DeviceNode("/dev/fpga0", "/dev/vendor/fpga0", "c", 240, 0, 0o660, "rw",
                                 0, 44),),
        mounts=(Mount("/usr/lib/vendor", "/usr/lib/vendor", ("ro", "nosuid", "nodev", "bind"),
                      "bind"),),
        additional_gids=(44,), intel_rdt=IntelRdt(clos_id="fpga"))
    assert spec.device("nope") is None


def test_json_spec_and_field_names_match_regardless_of_case() -> None:
    # The specification's text writes additionalGIDs; the reference library's field is
    # additionalGids and its decoding ignores case, so both load.
    doc = _doc("0.7.0", devices=[_dev(additionalGIDs=[5], ENV=["X=1"])])
    spec = parse(json.dumps(doc).encode(), yaml_syntax=False)
    assert spec.devices[0].edits == ContainerEdits(env=("X=1",), additional_gids=(5,))


def test_json_file_holding_yaml_is_an_error() -> None:
    with pytest.raises(SpecError, match="not valid JSON"):
        parse(YAML_SPEC, yaml_syntax=False)


@pytest.mark.parametrize("data, message", [
    (b"", "the file is empty"),
    (b"cdiVersion: [", "not valid YAML"),
    (b"- a\n- b\n", "spec must be an object, got a list"),
    (b"---\ncdiVersion: 0.3.0\n---\nkind: x\n", "not valid YAML"),
])
def test_undecodable_files(data: bytes, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse(data, yaml_syntax=True)


@pytest.mark.parametrize("version", ["0.3.0", "v0.3.0", "0.5.0", "0.8.0", "1.0.0", "1.1.0"])
def test_released_versions_are_accepted(version: str) -> None:
    assert parse_document(_doc(version)).version == version.removeprefix("v")


@pytest.mark.parametrize("version", ["1.2.0", "2.0.0", "0.3", "latest", "0.9.0"])
def test_unknown_or_newer_versions_are_refused(version: str) -> None:
    with pytest.raises(SpecError, match=rf"cdiVersion '{version}' is not a released CDI "
                                        rf"spec version \(0.3.0 … {CURRENT}"):
        parse_document(_doc(version))


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_versions_before_0_3_are_too_old(version: str) -> None:
    with pytest.raises(SpecError, match=r"needs at least 0\.3\.0"):
        parse_document(_doc(version))


def test_version_must_be_a_string() -> None:
    with pytest.raises(SpecError, match="cdiVersion must be a string, got a number"):
        parse(b"cdiVersion: 1.0\nkind: a.b/c\ndevices: []\n", yaml_syntax=True)


FEATURES: list[tuple[str, dict[str, Any]]] = [
    ("0.4.0", _doc(devices=[_dev(mounts=[{"hostPath": "/a", "containerPath": "/b",
                                          "type": "bind"}])])),
    ("0.5.0", _doc(devices=[_dev(deviceNodes=[{"path": "/dev/x", "hostPath": "/dev/y"}])])),
    ("0.5.0", _doc(devices=[_dev("0gpu")])),
    ("0.6.0", _doc(annotations={"a": "b"})),
    ("0.6.0", _doc(devices=[{**_dev(), "annotations": {"a": "b"}}])),
    ("0.6.0", _doc(kind="vendor.com/dev.v2")),
    ("0.7.0", _doc(containerEdits={"additionalGids": [5]})),
    ("0.7.0", _doc(devices=[_dev(intelRdt={"closID": "x"})])),
    ("1.1.0", _doc(devices=[_dev(intelRdt={"closID": "x", "enableMonitoring": True})])),
    ("1.1.0", _doc(devices=[_dev(netDevices=[{"hostInterfaceName": "eth1",
                                              "name": "net1"}])])),
]


@pytest.mark.parametrize("needed, doc", FEATURES)
def test_features_need_the_version_that_added_them(needed: str, doc: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=rf"needs at least {needed} \(.* was added in"):
        parse_document(doc)
    doc["cdiVersion"] = needed
    spec = parse_document(doc)
    assert required_version(spec)[0] == needed


@pytest.mark.parametrize("doc, message", [
    ({**_doc(), "extra": 1}, "spec: unknown field 'extra'"),
    ({"kind": "a.b/c", "devices": [_dev()]}, "spec: cdiVersion is required"),
    (_doc(kind="vendor.com"), "invalid kind: kind 'vendor.com' must be vendor/class"),
    (_doc(kind="vendor.com/a/b"), "invalid kind"),
    (_doc(devices=[]), "defines no devices"),
    (_doc(devices=[_dev(), _dev()]), "device 'a' is defined twice"),
    (_doc(devices=[{"name": "a"}]), "device 'a' has no containerEdits"),
    (_doc(devices=[{"name": "a", "containerEdits": {}}]), "has no containerEdits"),
    (_doc(devices=[_dev("bad name")]), r"devices\[0\]: device name 'bad name'"),
    (_doc(devices=[{**_dev(), "typo": 1}]), r"devices\[0\]: unknown field 'typo'"),
    (_doc(devices=[_dev(env=["=x"])]), "invalid environment variable '=x'"),
    (_doc(devices=[_dev(env=["NOEQUALS"])]), "invalid environment variable 'NOEQUALS'"),
    (_doc(devices=[_dev(env="A=1")]), "env must be a list of strings"),
    (_doc(devices=[_dev(deviceNodes=[{"hostPath": "/dev/x"}])]), "path is required"),
    (_doc(devices=[_dev(deviceNodes=[{"path": "/dev/x", "type": "x"}])]),
     r"\(/dev/x\): invalid type 'x'"),
    (_doc(devices=[_dev(deviceNodes=[{"path": "/dev/x", "permissions": "rwx"}])]),
     "invalid permissions 'rwx'"),
    (_doc(devices=[_dev(deviceNodes=[{"path": "/dev/x", "major": "1"}])]),
     "major must be an integer, got a string"),
    (_doc(devices=[_dev(deviceNodes=[{"path": "/dev/x", "uid": -1}])]), "out of range"),
    (_doc(devices=[_dev(mounts=[{"hostPath": "/a"}])]), "containerPath is required"),
    (_doc(devices=[_dev(mounts=[{"hostPath": "", "containerPath": "/a"}])]),
     "hostPath must not be empty"),
    (_doc(devices=[_dev(hooks=[{"hookName": "prerun", "path": "/bin/x"}])]),
     "invalid hookName 'prerun'"),
    (_doc(devices=[_dev(hooks=[{"hookName": "poststop", "path": "x"}])]),
     "hook path 'x' must be absolute"),
    (_doc(devices=[_dev(hooks=[{"hookName": "poststop", "path": "/x", "timeout": 0}])]),
     "hook timeout must be greater than zero"),
    (_doc(devices=[_dev(hooks=[{"hookName": "poststop", "path": "/x", "env": ["x"]}])]),
     "invalid environment variable 'x'"),
    (_doc("0.7.0", devices=[_dev(intelRdt={"closID": "a/b"})]), "invalid closID 'a/b'"),
    (_doc("0.7.0", devices=[_dev(additionalGids=[-1])]), "-1 is not a group id"),
    (_doc("1.1.0", devices=[_dev(netDevices=[{"hostInterfaceName": "e", "name": "a"},
                                             {"hostInterfaceName": "e", "name": "b"}])]),
     "duplicate hostInterfaceName 'e'"),
    (_doc("0.6.0", annotations={"a": 1}), "annotations must map strings to strings"),
])
def test_invalid_specs_say_what_is_wrong(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_document(doc)


def test_null_fields_are_absent_and_spec_edits_may_be_empty() -> None:
    spec = parse_document(_doc(containerEdits=None, annotations=None))
    assert spec.edits.empty()
    assert spec.annotations == {}


def test_net_devices_parse() -> None:
    spec = parse_document(_doc("1.1.0", devices=[_dev(netDevices=[
        {"hostInterfaceName": "eth1", "name": "net1"}])]))
    assert spec.devices[0].edits.net_devices == (NetDevice("eth1", "net1"),)
