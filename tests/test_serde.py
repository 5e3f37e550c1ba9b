"""Reading LangChain messages back without pydantic validation gives exactly what
LangGraph's own (validating) deserializer gives, and falls back to it whenever
validation would change something."""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Send
from pydantic import BaseModel, SecretStr

from agentcheck import serde as serde_module
from agentcheck._errors import CorruptDataError
from agentcheck.serde import MESSAGE_LIST, Codec, SafeSerializer, UnsafeTypeError

from savers_support import recorded_revivals

MESSAGES: list[BaseMessage] = [
    HumanMessage("hello", id="h1"),
    HumanMessage(
        [{"type": "text", "text": "look"}, "plain", {"type": "image", "url": "u"}],
        name="ann",
        additional_kwargs={"k": [1, 2]},
    ),
    SystemMessage("be brief"),
    AIMessage("plain answer", id="a1", response_metadata={"model": "m", "n": 1}),
    AIMessage(
        "",
        tool_calls=[
            {"name": "charge", "args": {"amount": 5, "to": ["x"]}, "id": "c1"},
            {"name": "refund", "args": {}, "id": None},
        ],
        usage_metadata={
            "input_tokens": 10,
            "output_tokens": 5,
            "total_tokens": 15,
            "input_token_details": {"cache_read": 3},
        },
    ),
    AIMessage(
        "",
        invalid_tool_calls=[{"name": "x", "args": "{bad", "id": "i1", "error": "json"}],
        additional_kwargs={"tool_calls": [{"id": "i1", "function": {"name": "x"}}]},
    ),
    ToolMessage("done", tool_call_id="c1", artifact={"receipt": 7}, status="error"),
    ToolMessage([{"type": "text", "text": "t"}], tool_call_id="c2", name="charge"),
    ChatMessage("hi", role="critic"),
    FunctionMessage("42", name="answer"),
    RemoveMessage(id="h1"),
]


def _state(message: Any) -> tuple[Any, ...]:
    return (
        type(message),
        message.__dict__,
        message.model_fields_set,
        message.__pydantic_extra__,
        message.__pydantic_private__,
    )


def _both(type_: str, data: bytes) -> tuple[Any, Any]:
    fast = SafeSerializer().loads_typed((type_, data))
    slow = JsonPlusSerializer(pickle_fallback=False).loads_typed((type_, data))
    return fast, slow


@pytest.fixture
def revived() -> Iterator[list[Any]]:
    """Messages the fast path built (None for each time it declined)."""
    with recorded_revivals() as seen:
        yield seen


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_messages_read_back_as_validation_gives_them(
    message: BaseMessage, revived: list[Any]
) -> None:
    type_, data = SafeSerializer().dumps_typed([message, {"nested": message}])
    fast, slow = _both(type_, data)
    assert fast == slow == [message, {"nested": message}]
    assert _state(fast[0]) == _state(slow[0])
    assert _state(fast[1]["nested"]) == _state(slow[1]["nested"])
    assert len(revived) == 2 and all(m is not None for m in revived)  # the fast path ran
    assert fast[0] is not fast[1]["nested"]  # every read builds its own objects


def _stored(module: str, name: str, kwargs: dict[str, Any]) -> bytes:
    payload = ormsgpack.packb((module, name, kwargs, "model_validate_json"))
    return ormsgpack.packb(ormsgpack.Ext(jsonplus.EXT_PYDANTIC_V2, payload))


AI = ("langchain_core.messages.ai", "AIMessage")
FULL_AI: dict[str, Any] = AIMessage("x", id="a").model_dump()


# Stored messages that pydantic validation would change: the fast path declines them.
CHANGED_BY_VALIDATION: list[dict[str, Any]] = [
    # stored by an older langchain-core: a field missing (validation fills the default)
    {k: v for k, v in FULL_AI.items() if k != "usage_metadata"},
    # a field this version does not know (validation keeps it as an extra)
    {**FULL_AI, "future_field": 1},
    # raw provider tool calls only: validation parses them
    {
        **FULL_AI,
        "additional_kwargs": {
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]
        },
    },
    # a tool call without its "type": validation adds it
    {**FULL_AI, "tool_calls": [{"name": "f", "args": {}, "id": "c"}]},
    # content of another type: validation refuses or converts it
    {**FULL_AI, "content": 7},
    {**FULL_AI, "type": "human"},
    # token details that validation turns into whole numbers
    {
        **FULL_AI,
        "usage_metadata": {
            "input_tokens": 1,
            "output_tokens": 1,
            "total_tokens": 2,
            "input_token_details": {"cache_read": 2.0},
        },
    },
]
CHANGED_BY_VALIDATION_IDS = [
    "missing-field",
    "extra-field",
    "raw-tool-calls",
    "untyped-call",
    "int-content",
    "type",
    "float-details",
]


@pytest.mark.parametrize("kwargs", CHANGED_BY_VALIDATION, ids=CHANGED_BY_VALIDATION_IDS)
def test_anything_validation_would_change_takes_langgraph_path(
    kwargs: dict[str, Any], revived: list[Any]
) -> None:
    fast, slow = _both("msgpack", _stored(*AI, kwargs))
    assert revived == [None]
    assert type(fast) is type(slow)
    if isinstance(slow, BaseMessage):
        assert _state(fast) == _state(slow)
    else:
        assert fast == slow


def test_fields_stored_in_another_order_take_langgraph_path(revived: list[Any]) -> None:
    """The fast path keeps the stored dict as the message's ``__dict__``, so it only
    takes fields in the order model_dump writes them (its repr and iteration follow
    that order); validation rebuilds any other order."""
    usage = {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7}
    stored = AIMessage("x", id="a", usage_metadata=usage).model_dump()
    fast, _ = _both("msgpack", _stored(*AI, stored))
    assert revived[-1] is not None
    fast, slow = _both("msgpack", _stored(*AI, dict(reversed(stored.items()))))
    assert revived[-1] is None
    assert _state(fast) == _state(slow)
    assert list(fast.__dict__) == list(slow.__dict__) == list(stored)


def test_a_message_that_will_not_decode_takes_langgraph_path(revived: list[Any]) -> None:
    good = ormsgpack.packb((*AI, FULL_AI, "model_validate_json"))
    broken = ormsgpack.packb(ormsgpack.Ext(jsonplus.EXT_PYDANTIC_V2, good[:40]))
    fast, slow = _both("msgpack", broken)
    assert revived == [None]
    assert fast == slow  # whatever LangGraph makes of it (it gives up quietly)


class Point(BaseModel):
    x: int


def test_other_pydantic_objects_go_straight_to_langgraph(revived: list[Any]) -> None:
    serializer = SafeSerializer(allowed_types=[Point])
    type_, data = serializer.dumps_typed([Point(x=1), Send("node", {"a": 1})])
    assert serializer.loads_typed((type_, data)) == [Point(x=1), Send("node", {"a": 1})]
    assert revived == []  # only messages are looked at


def test_values_are_stored_as_langgraph_stores_them_and_a_class_is_checked_per_allowlist() -> None:
    messages = [HumanMessage("q", id="q"), AIMessage("a", id="a")]
    value = {"messages": messages, "point": Point(x=1), "send": Send("n", {"a": 1})}
    allowing = SafeSerializer(allowed_types=[Point])
    # Twice: the second time the classes are known to be allowed (checked once each).
    for _ in range(2):
        assert allowing.dumps_typed(value) == JsonPlusSerializer().dumps_typed(value)
    # A copy allowing more (LangGraph's with_msgpack_allowlist) shares no such knowledge
    # with the serializer it was copied from, either way round.
    strict = SafeSerializer()
    strict.dumps_typed({"messages": messages})  # it knows the message classes are allowed
    wider = strict.with_msgpack_allowlist([Point])
    assert wider.dumps_typed(value) == allowing.dumps_typed(value)
    with pytest.raises(UnsafeTypeError, match="test_serde.Point"):
        strict.dumps_typed(value)
    assert wider.dumps_typed(value) == allowing.dumps_typed(value)


class FamilyMeta(type):
    """Classes of one family compare equal (a proxy or ORM metaclass may do so)."""

    def __eq__(cls, other: object) -> bool:
        return isinstance(other, FamilyMeta)

    def __hash__(cls) -> int:
        return 1


class FamilyAllowed(metaclass=FamilyMeta):
    def model_dump(self) -> dict[str, Any]:  # LangGraph encodes it as a pydantic model
        return {"x": 1}


class FamilyRefused(metaclass=FamilyMeta):
    def model_dump(self) -> dict[str, Any]:
        return {"secret": 1}


class UnhashableMeta(type):
    def __eq__(cls, other: object) -> bool:
        return cls is other

    __hash__ = None  # type: ignore[assignment]


class Unhashable(metaclass=UnhashableMeta):
    def model_dump(self) -> dict[str, Any]:
        return {"y": 2}


def test_a_class_checked_once_is_the_class_itself() -> None:
    """The classes a serializer remembers as allowed are matched by identity: a class
    equal to an allowed one is still checked (and refused), an unhashable one still
    serializes, and classes made at run time are not all kept."""
    serializer = SafeSerializer(allowed_types=[FamilyAllowed, Unhashable])
    serializer.dumps_typed({"a": FamilyAllowed()})
    with pytest.raises(UnsafeTypeError, match="FamilyRefused"):
        serializer.dumps_typed({"b": FamilyRefused()})
    assert serializer.dumps_typed({"o": Unhashable()}) == JsonPlusSerializer().dumps_typed(
        {"o": Unhashable()}
    )
    made = [type(f"Made{i}", (Point,), {}) for i in range(400)]
    anything = SafeSerializer(allowed_types=made)
    for cls in made:
        anything.dumps_typed({"p": cls(x=1)})
    assert anything._plain is not None and len(anything._plain[1]) <= 256


def test_tool_message_with_uncoerced_id_takes_langgraph_path(revived: list[Any]) -> None:
    kwargs = {**ToolMessage("x", tool_call_id="c").model_dump(), "tool_call_id": 12}
    fast, slow = _both("msgpack", _stored("langchain_core.messages.tool", "ToolMessage", kwargs))
    assert revived == [None]
    assert fast.tool_call_id == slow.tool_call_id == "12"


text = st.text(max_size=20)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), text)
json_dict = st.dictionaries(text, st.one_of(json_leaf, st.lists(json_leaf, max_size=3)), max_size=3)
tool_calls = st.lists(
    st.fixed_dictionaries({"name": text, "args": json_dict, "id": st.one_of(st.none(), text)}),
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(
    content=st.one_of(text, st.lists(st.one_of(text, json_dict), max_size=3)),
    name=st.one_of(st.none(), text),
    msg_id=st.one_of(st.none(), text),
    extra=json_dict,
    calls=tool_calls,
    kind=st.sampled_from(["human", "ai", "tool", "system"]),
)
def test_random_messages_read_back_as_validation_gives_them(
    content: Any, name: Any, msg_id: Any, extra: Any, calls: Any, kind: str
) -> None:
    if kind == "ai":
        message: BaseMessage = AIMessage(
            content, name=name, id=msg_id, additional_kwargs=extra, tool_calls=calls
        )
    elif kind == "tool":
        message = ToolMessage(content, tool_call_id=msg_id or "c", name=name, artifact=extra)
    elif kind == "human":
        message = HumanMessage(content, name=name, id=msg_id, response_metadata=extra)
    else:
        message = SystemMessage(content, name=name, id=msg_id, additional_kwargs=extra)
    type_, data = SafeSerializer().dumps_typed(message)
    with recorded_revivals() as built:  # (hypothesis takes no fixtures)
        fast, slow = _both(type_, data)
    assert _state(fast) == _state(slow)
    assert fast == message
    # ... and it was the fast path that built it (validation would change nothing here).
    assert len(built) == 1 and built[0] is fast


# -- lists of messages, stored in one piece ----------------------------------------------


def _langgraph_reads(value: Any) -> Any:
    """What LangGraph's own serializer gives back for ``value`` in its own format."""
    serializer = JsonPlusSerializer(pickle_fallback=False)
    return serializer.loads_typed(serializer.dumps_typed(value))


def test_a_list_of_messages_is_stored_in_one_piece_and_reads_back_as_langgraph_gives_it(
    revived: list[Any],
) -> None:
    type_, data = SafeSerializer().dumps_typed(MESSAGES)
    assert type_ == MESSAGE_LIST
    back = SafeSerializer().loads_typed((type_, data))
    expected = _langgraph_reads(MESSAGES)
    assert back == expected == MESSAGES
    assert [_state(m) for m in back] == [_state(m) for m in expected]
    assert len(revived) == len(MESSAGES) and all(m is not None for m in revived)
    again = SafeSerializer().loads_typed((type_, data))
    assert all(a is not b for a, b in zip(back, again, strict=True))  # fresh objects each read


class MyAI(AIMessage):
    pass


def test_other_lists_keep_langgraph_format() -> None:
    serializer = SafeSerializer(allowed_types=[MyAI])
    for value in ([], [HumanMessage("a"), "text"], [MyAI("sub")], [{"m": HumanMessage("a")}]):
        type_, data = serializer.dumps_typed(value)
        assert type_ == "msgpack"
        assert serializer.loads_typed((type_, data)) == value


def _message_list(*rows: Any) -> bytes:
    return ormsgpack.packb(list(rows))


@pytest.mark.parametrize("kwargs", CHANGED_BY_VALIDATION, ids=CHANGED_BY_VALIDATION_IDS)
def test_a_listed_message_validation_would_change_is_validated(
    kwargs: dict[str, Any], revived: list[Any]
) -> None:
    fast = SafeSerializer().loads_typed((MESSAGE_LIST, _message_list([*AI, kwargs])))
    assert revived == [None]
    slow = JsonPlusSerializer(pickle_fallback=False).loads_typed(("msgpack", _stored(*AI, kwargs)))
    assert len(fast) == 1 and type(fast[0]) is type(slow)
    assert _state(fast[0]) == _state(slow)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (ormsgpack.packb({"not": "a list"}), "is not a list"),
        (_message_list("text"), "holds str"),
        (_message_list(["os", "system", {"command": "x"}]), "'os'.'system'"),
        (_message_list([*AI, FULL_AI], ["builtins", "dict", {}]), "'builtins'.'dict'"),
    ],
    ids=["not-a-list", "not-a-row", "other-class", "second-row"],
)
def test_a_corrupt_message_list_is_refused_with_what_is_wrong(data: bytes, named: str) -> None:
    with pytest.raises(CorruptDataError, match=named):
        SafeSerializer().loads_typed((MESSAGE_LIST, data))


class Opaque:
    pass


@pytest.mark.parametrize("container", ["list", "dict"])
def test_a_message_holding_what_msgpack_cannot_store_is_refused_as_langgraph_refuses_it(
    container: str,
) -> None:
    message = AIMessage("x", additional_kwargs={"o": Opaque()})
    value = [message] if container == "list" else {"m": message}
    with pytest.raises(TypeError, match="not msgpack serializable"):
        JsonPlusSerializer().dumps_typed(value)
    with pytest.raises(TypeError, match="cannot serialize this value"):
        SafeSerializer().dumps_typed(value)


class Color(enum.Enum):
    RED = "red"


class Palette(BaseModel):
    color: Color = Color.RED
    secret: SecretStr = SecretStr("pw")


def test_fields_that_validation_restores_are_stored_as_langgraph_stores_them() -> None:
    """Inside a pydantic object or a message, a field's value is packed by LangGraph's
    own rules: an enum member or a SecretStr is stored, and validating the object on
    read restores it (a message's free-form kwargs keep its plain value, as before)."""
    serializer = SafeSerializer(allowed_types=[Palette])
    assert serializer.loads_typed(serializer.dumps_typed({"p": Palette()})) == {"p": Palette()}
    messages = [AIMessage("a", additional_kwargs={"c": Color.RED}, response_metadata={"n": 1})]
    type_, data = serializer.dumps_typed(messages)
    assert type_ == MESSAGE_LIST
    before = serializer.loads_typed(JsonPlusSerializer().dumps_typed(messages))  # old layout
    assert serializer.loads_typed((type_, data)) == before
    assert before[0].additional_kwargs == {"c": "red"}


def test_the_message_tables_are_whole_to_any_thread_from_first_use() -> None:
    """The first use fills the message class tables; a thread reading a message list at
    that moment never sees them half filled (which would refuse a valid row)."""
    serializer = SafeSerializer()
    # Validated, not revived: an extra field sends it to the class table look-up.
    data = serializer.dumps_typed([FunctionMessage(name="f", content="x", extra_field=1)])
    assert data[0] == MESSAGE_LIST
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list[BaseException] = []
    try:
        for _ in range(1000):
            serde_module._MESSAGE_SPECS.clear()
            serde_module._MESSAGE_CLASSES.clear()

            def read() -> None:
                try:
                    serializer.loads_typed(data)
                    serializer.dumps_typed([HumanMessage("h")])
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=serde_module._message_specs)]
            threads += [threading.Thread(target=read), threading.Thread(target=read)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(serde_module._message_specs()) == len(serde_module._message_classes()) == 7


class _SizesSeen(dict[Any, Any]):
    """A dict that notes its size after each change."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.sizes.append(len(self))

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self.sizes.append(len(self))


class _SetSizesSeen(set[Any]):
    """A set that notes its size after each change."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def add(self, item: Any) -> None:
        super().add(item)
        self.sizes.append(len(self))

    def update(self, *items: Any) -> None:
        super().update(*items)
        self.sizes.append(len(self))


def test_the_message_tables_are_filled_in_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the threads above can only catch now and then: each table goes from empty to
    whole in one change, never through a partly filled state."""
    specs, classes = _SizesSeen(), _SetSizesSeen()
    monkeypatch.setattr(serde_module, "_MESSAGE_SPECS", specs)
    monkeypatch.setattr(serde_module, "_MESSAGE_CLASSES", classes)
    serde_module._message_specs()
    serde_module._message_classes()
    assert specs.sizes == [7]
    assert classes.sizes == [7]


def test_a_message_in_another_value_is_stored_as_langgraph_stores_it() -> None:
    value = {"m": AIMessage("x", id="1", tool_calls=[{"name": "f", "args": {}, "id": "c"}])}
    assert SafeSerializer().dumps_typed(value) == JsonPlusSerializer().dumps_typed(value)


@settings(max_examples=100, deadline=None)
@given(
    contents=st.lists(
        st.one_of(text, st.lists(st.one_of(text, json_dict), max_size=3)), min_size=1, max_size=4
    ),
    extra=json_dict,
    calls=tool_calls,
)
def test_random_message_lists_read_back_as_langgraph_gives_them(
    contents: list[Any], extra: Any, calls: Any
) -> None:
    messages: list[BaseMessage] = []
    for i, content in enumerate(contents):
        if i % 3 == 0:
            messages.append(HumanMessage(content, response_metadata=extra))
        elif i % 3 == 1:
            messages.append(AIMessage(content, additional_kwargs=extra, tool_calls=calls))
        else:
            messages.append(ToolMessage(content, tool_call_id="c", artifact=extra))
    type_, data = SafeSerializer().dumps_typed(messages)
    assert type_ == MESSAGE_LIST
    back = SafeSerializer().loads_typed((type_, data))
    expected = _langgraph_reads(messages)
    assert [_state(m) for m in back] == [_state(m) for m in expected]


def test_the_codec_refuses_a_serializer_tag_it_could_not_tell_from_its_own() -> None:
    """The codec marks compression and encryption with "#"; a serializer whose tag holds
    one is refused on write, with what was wrong, rather than misread later."""
    with pytest.raises(ValueError, match="'msgpack#z' contains '#'"):
        Codec().encode("msgpack#z", b"x")
    assert Codec().decode(*Codec().encode("msgpack+z", b"x" * 100, compress=True)) == (
        "msgpack+z",
        b"x" * 100,
    )


@pytest.mark.parametrize("compression", ["zlib", "zstd"])
def test_the_codec_compresses_with_either_and_reads_both(compression: str) -> None:
    """A row says how it was compressed: a codec reads rows of the other kind too (a
    database written by SQLite and PostgreSQL savers alike, or before a change)."""
    data = b"compressible text " * 1000
    key = serde_module.generate_key()
    for codec in (
        Codec(compression=compression, compress_threshold=1024),
        Codec(compression=compression, compress_threshold=1024, encryption_key=key),
    ):
        type_, stored = codec.encode("msgpack", data)
        assert type_.startswith("msgpack" + ("#zs" if compression == "zstd" else "#z"))
        assert len(stored) < len(data) // 10
        assert codec.decode(type_, stored) == ("msgpack", data)
        other = "zlib" if compression == "zstd" else "zstd"
        reader = Codec(compression=other, encryption_key=key if codec.encrypted else None)
        assert reader.decode(type_, stored) == ("msgpack", data)
    # Below the threshold, stored as it is; incompressible data too.
    assert Codec(compression=compression).encode("msgpack", b"short") == ("msgpack", b"short")
    noise = os.urandom(512)
    assert Codec(compression=compression).encode("bytes", noise, compress=True)[0] == "bytes"


def test_corrupt_compressed_rows_and_unknown_compressions_are_named() -> None:
    with pytest.raises(CorruptDataError, match=r"corrupt compressed data \(zstd\)"):
        Codec().decode("msgpack#zs", b"\x28\xb5\x2f\xfd garbage")
    with pytest.raises(CorruptDataError, match="corrupt compressed data"):
        Codec().decode("msgpack#z", b"garbage")
    with pytest.raises(ValueError, match="compression must be 'zlib' or 'zstd', not 'lz4'"):
        Codec(compression="lz4")


# --------------------------------------------------------------------------- kept tuples


@dataclasses.dataclass
class Receipt:
    id: str
    lines: tuple[int, ...]


class Pair(NamedTuple):
    a: int
    b: str


def test_kept_tuples_come_back_as_tuples_and_everything_else_as_before() -> None:
    """The journal's recorded results keep their tuples (keep_tuples); an allowlisted
    dataclass or NamedTuple inside is still LangGraph's (it replayed as None when its
    fields were packed with tuples kept: LangGraph's reader knows no tuple extension)."""
    serde = SafeSerializer(allowed_types=[Receipt, Pair])

    def again(value: Any) -> Any:
        return serde.loads_typed(serde.dumps_typed(value, keep_tuples=True))

    pair = ("found", {"hits": (1, (2, "3"))})
    assert again(pair) == pair and type(again(pair)) is tuple
    assert type(again(pair)[1]["hits"][1]) is tuple
    assert again([("a", 1)]) == [("a", 1)] and type(again([("a", 1)])[0]) is tuple
    assert again(Pair(1, "x")) == Pair(1, "x") and type(again(Pair(1, "x"))) is Pair
    # Inside LangGraph's own types a tuple is a list, as in every checkpoint value.
    receipt = again({"r": Receipt("r-1", (1, 2)), "t": (3,)})
    assert receipt == {"r": Receipt("r-1", [1, 2]), "t": (3,)}  # type: ignore[arg-type]


def test_a_value_with_kept_tuples_is_tagged_apart() -> None:
    serde = SafeSerializer()
    assert serde.dumps_typed({"k": [1]}, keep_tuples=True)[0] == "msgpack"
    tag, data = serde.dumps_typed({"k": (1,)}, keep_tuples=True)
    assert tag == "msgpack-tuples"
    # A reader that does not know the tag refuses it, rather than read the tuple as None.
    with pytest.raises(Exception, match="msgpack-tuples"):
        JsonPlusSerializer().loads_typed((tag, data))


def test_a_tuple_stored_under_the_plain_tag_still_reads_as_a_tuple() -> None:
    """Journals written by the build that kept tuples before the tag existed."""
    data = ormsgpack.packb(ormsgpack.Ext(64, ormsgpack.packb(["a", 1])))
    assert SafeSerializer().loads_typed(("msgpack", data)) == ("a", 1)
