"""The shared record helpers (crishim/store/records.py): the JSON round trip keeps the
CRI config and drops keys an older version wrote, a list item is a well-formed repeated
field that is rebuilt when the state changes, and id prefixes never guess."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from crishim.api.runtime.v1 import api_pb2 as pb
from crishim.errors import NotFound
from crishim.store import records


@dataclass
class Rec(records.StateCounted):
    id: str
    state: int = 0
    config: pb.ContainerConfig = field(default_factory=pb.ContainerConfig)


def make(state: int = 0) -> Rec:
    return Rec(id="a" * 64, state=state, config=pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="web", attempt=2), labels={"app": "x"}))


def test_the_json_form_round_trips_and_drops_unknown_keys() -> None:
    rec = make(1)
    data = json.loads(json.dumps(records.to_dict(rec)))
    data["gone_in_this_version"] = 5
    back = records.from_dict(Rec, data, pb.ContainerConfig())
    assert back == rec


def test_a_list_item_is_one_field_of_a_list_reply_and_follows_the_state() -> None:
    rec = make(1)
    built: list[int] = []

    def message() -> pb.Container:
        built.append(rec.state)
        return pb.Container(id=rec.id, state=rec.state, metadata=rec.config.metadata)

    one = records.list_item(rec, message)
    assert records.list_item(rec, message) is one and built == [1]  # cached
    reply = pb.ListContainersResponse.FromString(one + one)
    assert [c.state for c in reply.containers] == [1, 1]
    assert reply.containers[0].metadata.name == "web"
    rec.state = 2
    two = records.list_item(rec, message)
    assert built == [1, 2]
    assert pb.ListContainersResponse.FromString(two).containers[0].state == 2


def test_a_big_item_has_a_multi_byte_length() -> None:
    rec = make()
    big = pb.Container(id="x" * 300)
    item = records.list_item(rec, lambda: big)
    assert pb.ListContainersResponse.FromString(item).containers[0].id == "x" * 300


def test_state_changes_are_counted() -> None:
    rec = make()
    before = Rec.state_changes
    rec.state = 3
    rec.id = "b" * 64
    assert Rec.state_changes == before + 1


def test_ids_and_prefixes() -> None:
    recs = {"abc1": 1, "abc2": 2, "def": 3}
    assert records.by_id_or_prefix(recs, "abc1", "container") == 1
    assert records.by_id_or_prefix(recs, "d", "container") == 3
    assert records.by_id_or_prefix(recs, "zzz", "container") is None
    assert records.by_id_or_prefix(recs, "", "container") is None
    with pytest.raises(NotFound, match="ambiguous"):
        records.by_id_or_prefix(recs, "abc", "pod sandbox")
