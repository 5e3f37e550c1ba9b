"""Safe serialization, compression and encryption of everything agentcheck stores.

Two layers:

* :class:`SafeSerializer` turns Python values into ``(type, bytes)`` with LangGraph's
  msgpack format in strict mode: no pickle, and a value whose type is not on the
  allowlist is refused *when it is written* (LangGraph's own strict mode only notices on
  read, and then silently hands back raw data). A list of LangChain messages is stored
  in one piece (:data:`MESSAGE_LIST`) rather than message by message.
* :class:`Codec` turns ``(type, bytes)`` into what is stored: large payloads compressed
  (zlib, or zstd on PostgreSQL), everything encrypted with AES-256-GCM when a key is
  given. The steps applied are recorded as suffixes of the type tag
  (``msgpack#z#aesgcm``, ``msgpack#zs``), so a row says how to read it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import re
import sys
import threading
import zlib
from collections.abc import Callable, Iterable
from functools import cache, partial
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import jsonplus as _jp
from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_TYPES
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from pydantic import BaseModel

from agentcheck._errors import CorruptDataError, UnsafeTypeError
from agentcheck._extras import require

__all__ = [
    "Codec",
    "MESSAGE_LIST",
    "SafeSerializer",
    "generate_key",
    "loads_message_list",
    "message_rows",
    "revive_rows",
]

_ENV_KEY = "AGENTCHECK_ENCRYPTION_KEY"
# LangGraph's msgpack options, but refusing lone surrogates instead of writing "?".
_EXACT_TEXT_OPTION = _jp._option & ~ormsgpack.OPT_REPLACE_SURROGATES
# The codec's steps are marked with "#", which no serializer's tag may contain:
# LangGraph's EncryptedSerializer, say, ends its tags with "+" and a cipher's name.
_MARK = "#"
_COMPRESSED = _MARK + "z"  # zlib
_ZSTD = _MARK + "zs"
_ENCRYPTED = _MARK + "aesgcm"
_NONCE_BYTES = 12
# Type tag of a list of LangChain messages stored as msgpack ``[[module, name, fields],
# ...]`` (fields as ``model_dump`` gives them): what LangGraph's format stores for each
# message, minus its per-message envelope, so the whole list is packed and unpacked in
# one call. A chat's ``messages`` channel is such a list; it reads ~20% and writes ~2.5x
# faster this way (docs/savers.md, "Storage").
MESSAGE_LIST = "msgpack-messages"
# Type tag of a msgpack payload holding tuples, kept as msgpack extension _EXT_TUPLE (the
# items as an array): the journal's recorded results, which a replay must give back as
# they were. LangGraph's own extension codes are small numbers from 0.
TUPLES = "msgpack-tuples"
_EXT_TUPLE = 64
_PLAIN_MAX = 256  # classes a serializer remembers as checked (see SafeSerializer._plain)


class SafeSerializer(JsonPlusSerializer):
    """LangGraph's msgpack serializer, strict, with no pickle, checked on write.

    Args:
        allowed_types: extra types that may be stored and revived, as classes or
            ``(module, name)`` pairs. LangChain messages, LangGraph's own types and
            common standard-library types are always allowed.
    """

    def __init__(self, *, allowed_types: Iterable[tuple[str, ...] | type] | None = None) -> None:
        allowed = list(allowed_types or ())
        super().__init__(pickle_fallback=False, allowed_msgpack_modules=allowed or None)

    def dumps_typed(
        self, obj: Any, *, exact_text: bool = False, keep_tuples: bool = False
    ) -> tuple[str, bytes]:
        """Serialize ``obj``; raises :class:`UnsafeTypeError` for a type not on the
        allowlist. Text that is not valid Unicode (lone surrogates) is stored with ``?``
        in their place, as LangGraph does, unless ``exact_text`` is set: then it raises
        ``TypeError`` (the caller can store such data another way). Tuples come back as
        lists, as in LangGraph's format, unless ``keep_tuples`` is set (the journal's
        recorded results: a replay must return what the call returned)."""
        if obj is None or isinstance(obj, (bytes, bytearray)):
            return super().dumps_typed(obj)
        refused: list[UnsafeTypeError] = []
        option = _EXACT_TEXT_OPTION if exact_text else _jp._option
        if keep_tuples:
            option |= ormsgpack.OPT_PASSTHROUGH_TUPLE
            tuples: list[bool] = []
            data = self._pack(obj, refused, option, tuples)
            # Tagged apart only when a tuple was kept: a reader that does not know the
            # tag refuses the row, where LangGraph's reader would read the tuple as None.
            return (TUPLES if tuples else "msgpack"), data
        try:
            if type(obj) is list and obj and _all_messages(obj):
                # The fields are packed as LangGraph packs a message's (its own default,
                # which stores what validation of the message restores, an enum say).
                rows = [[type(m).__module__, type(m).__name__, m.model_dump()] for m in obj]
                return MESSAGE_LIST, ormsgpack.packb(
                    rows, default=_jp._msgpack_default, option=option
                )
            return "msgpack", self._pack(obj, refused, option)
        except ormsgpack.MsgpackEncodeError as exc:
            # ormsgpack drops the exception raised by `default`; keep ours by hand.
            if refused:
                raise refused[0] from None
            raise TypeError(f"agentcheck cannot serialize this value: {exc}") from exc

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_ = data[0]
        if type_ == "msgpack" or type_ == TUPLES:
            return ormsgpack.unpackb(
                data[1], ext_hook=self._ext_hook(), option=ormsgpack.OPT_NON_STR_KEYS
            )
        if type_ == MESSAGE_LIST:
            return loads_message_list(data[1], self._ext_hook())
        if type_ == "json":
            # Plain JSON: LangGraph's reader revives LangChain's {"lc": ...} envelopes
            # in it (building objects, reading secrets), which stored data must not do.
            return json.loads(data[1])
        if type_ not in ("null", "bytes", "bytearray"):
            # "pickle" lands here too: stored pickles are never executed.
            raise CorruptDataError(f"unknown serialization type tag {type_!r}")
        return super().loads_typed(data)

    _fast_hook: tuple[Any, Any] | None = None

    def _ext_hook(self) -> Any:
        """LangGraph's ext hook (it may be replaced, see ``with_msgpack_allowlist``),
        with LangChain messages rebuilt by :func:`_revive_message` where it can, and the
        tuples of a :data:`TUPLES` payload."""
        slow = self._unpack_ext_hook
        if self._fast_hook is not None and self._fast_hook[0] is slow:
            return self._fast_hook[1]

        pydantic = _jp.EXT_PYDANTIC_V2

        def hook(code: int, payload: bytes) -> Any:
            if code == _EXT_TUPLE:
                items = ormsgpack.unpackb(payload, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
                if type(items) is not list:
                    raise CorruptDataError("a stored tuple is not an array")
                return tuple(items)
            # Only what names a message class is decoded here; anything else (and a
            # message that will not decode) goes to LangGraph's hook untouched.
            if code == pydantic and _names_a_message(payload):
                try:
                    tup = ormsgpack.unpackb(
                        payload, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS
                    )
                except Exception:
                    tup = None
                message = _revive_message(tup)
                if message is not None:
                    return message
            return slow(code, payload)

        self._fast_hook = (slow, hook)
        return hook

    # Classes whose values _default hands to LangGraph's encoder once checked (a message
    # inside a dict, say): checked once per class, not at every value. By id, each
    # entry holding its class (so the id is not reused while it is there), since a
    # metaclass may make classes equal or unhashable; at most _PLAIN_MAX of them
    # (classes made at run time are not all kept alive). Kept with the allowlist it
    # was checked against: with_msgpack_allowlist's copies share this attribute but
    # not their allowlist.
    _plain: tuple[Any, dict[int, type]] | None = None

    def _plain_classes(self) -> dict[int, type]:
        allowed = self._allowed_msgpack_modules
        plain = self._plain
        if plain is None or plain[0] is not allowed:
            plain = self._plain = (allowed, {})
        return plain[1]

    def _pack(
        self,
        obj: Any,
        refused: list[UnsafeTypeError],
        option: int,
        tuples: list[bool] | None = None,
    ) -> bytes:
        plain = self._plain_classes()
        encode = _jp._msgpack_default

        def default(value: Any) -> Any:
            cls = type(value)
            if plain.get(id(cls)) is cls:
                return encode(value)
            return self._default(value, refused, option, tuples, plain)

        return ormsgpack.packb(obj, default=default, option=option)

    def _default(
        self,
        obj: Any,
        refused: list[UnsafeTypeError],
        option: int,
        tuples: list[bool] | None,
        plain: dict[int, type],
    ) -> Any:
        if type(obj) is tuple and tuples is not None:  # keep_tuples: see dumps_typed
            tuples.append(True)
            return ormsgpack.Ext(_EXT_TUPLE, self._pack(list(obj), refused, option, tuples))
        # What follows is read back by LangGraph's own hook, which knows no tuples.
        option &= ~ormsgpack.OPT_PASSTHROUGH_TUPLE
        try:
            self._check_allowed(obj)
        except UnsafeTypeError as exc:
            refused.append(exc)
            raise
        if isinstance(obj, _DeltaSnapshot):  # a NamedTuple, but has its own ext code
            return ormsgpack.Ext(_jp.EXT_DELTA_SNAPSHOT, self._pack(obj.value, refused, option))
        # Containers whose fields langgraph encodes with its own (unchecked) hook are
        # encoded here so that every nested value is checked too.
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return ormsgpack.Ext(
                _jp.EXT_CONSTRUCTOR_KW_ARGS,
                self._pack((type(obj).__module__, type(obj).__name__, fields), refused, option),
            )
        if isinstance(obj, tuple) and callable(getattr(obj, "_asdict", None)):
            return ormsgpack.Ext(
                _jp.EXT_CONSTRUCTOR_KW_ARGS,
                self._pack(
                    (type(obj).__module__, type(obj).__name__, obj._asdict()),  # type: ignore[attr-defined]
                    refused,
                    option,
                ),
            )
        if not isinstance(obj, tuple) and len(plain) < _PLAIN_MAX:
            plain[id(type(obj))] = type(obj)  # allowed, none of the above: so next time
        return _jp._msgpack_default(obj)

    def _check_allowed(self, obj: Any) -> None:
        allowed = self._allowed_msgpack_modules
        if allowed is True:
            return
        if isinstance(obj, (_DeltaSnapshot, re.Pattern, BaseException)):
            return  # encoded without importing a class by name on read
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.ndarray):
            return
        cls = type(obj)
        key = (cls.__module__, cls.__name__)
        if key in SAFE_MSGPACK_TYPES or (allowed and key in allowed):
            return
        raise UnsafeTypeError(
            f"refusing to store a value of type {key[0]}.{key[1]}: it is not on the "
            f"deserialization allowlist, so it could not be read back safely. Allow it "
            f"with `allowed_types=[{key!r}]` on the saver (or pass the class itself), or "
            f"set LANGGRAPH_STRICT_MSGPACK=true so LangGraph allows the types of your "
            f"graph's state schema."
        )


@dataclasses.dataclass(frozen=True)
class _MessageSpec:
    cls: type[BaseModel]
    module: str
    type: str
    order: tuple[str, ...]  # the fields in declaration order, as model_dump writes them
    fields: frozenset[str]  # the same, copied into each message's fields-set


# By class name (the classes' names differ; a spec knows its module).
_MESSAGE_SPECS: dict[str, _MessageSpec] = {}
_TOOL_CALL_KEYS = frozenset({"name", "args", "id", "type"})
_INVALID_TOOL_CALL_KEYS = frozenset({"name", "args", "id", "error", "type"})
_USAGE_COUNTS = ("input_tokens", "output_tokens", "total_tokens")
_USAGE_DETAILS = ("input_token_details", "output_token_details")


def _message_specs() -> dict[str, _MessageSpec]:
    if not _MESSAGE_SPECS:
        from langchain_core import messages as lc

        built = {}
        for cls in (
            lc.AIMessage,
            lc.HumanMessage,
            lc.SystemMessage,
            lc.ToolMessage,
            lc.ChatMessage,
            lc.FunctionMessage,
            lc.RemoveMessage,
        ):
            fields = cls.model_fields
            # The field names as ormsgpack hands them out: it reuses one object per short
            # key, so comparing a stored row's keys with these is mostly identity checks.
            names = tuple(ormsgpack.unpackb(ormsgpack.packb(dict.fromkeys(fields))))
            spec = _MessageSpec(
                cls, cls.__module__, str(fields["type"].default), names, frozenset(fields)
            )
            built[cls.__name__] = spec
        # Filled in one step (atomic under the GIL): another thread that finds the table
        # not empty finds it whole.
        _MESSAGE_SPECS.update(built)
    return _MESSAGE_SPECS


# How a stored LangChain message begins: msgpack's array (module, name, fields, method)
# whose module, a short string, is in langchain_core.messages.
_MESSAGE_HEAD = b"langchain_core.messages."


def loads_message_list(data: bytes, ext_hook: Any) -> list[Any]:
    """The messages of a :data:`MESSAGE_LIST` payload; ``ext_hook`` decodes the values
    inside them that msgpack stores as extensions (a serializer's, with its allowlist)."""
    return revive_rows(message_rows(data, ext_hook))


def message_rows(data: bytes, ext_hook: Any) -> list[Any]:
    """The rows of a :data:`MESSAGE_LIST` payload, unpacked but not yet made messages
    (:func:`revive_rows` does that): a reader that keeps only some of them, the part of
    a sliding window a later version still holds, builds only those."""
    rows = ormsgpack.unpackb(data, ext_hook=ext_hook, option=ormsgpack.OPT_NON_STR_KEYS)
    if type(rows) is not list:
        raise CorruptDataError("a stored message list is not a list")
    return rows


def revive_rows(rows: list[Any]) -> list[Any]:
    """The messages of rows from :func:`message_rows`."""
    return [_revive_message(row) or _validated_message(row) for row in rows]


def _all_messages(items: list[Any]) -> bool:
    """Whether every item is a LangChain message of one of the exact classes
    :func:`_revive_message` knows (a subclass keeps LangGraph's own format)."""
    classes = _MESSAGE_CLASSES or _message_classes()
    for item in items:
        if type(item) not in classes:
            return False
    return True


_MESSAGE_CLASSES: set[type] = set()


def _message_classes() -> set[type]:
    _MESSAGE_CLASSES.update(frozenset(spec.cls for spec in _message_specs().values()))
    return _MESSAGE_CLASSES


def _validated_message(row: Any) -> Any:
    """A message of a stored message list that :func:`_revive_message` declined, built
    as LangGraph's reader builds it: validated, or constructed if validation fails."""
    if type(row) is not list or len(row) < 3 or type(row[2]) is not dict:
        raise CorruptDataError(f"a stored message list holds {type(row).__name__}, not a message")
    spec = _message_specs().get(row[1]) if type(row[1]) is str else None
    if spec is None or row[0] != spec.module:
        raise CorruptDataError(
            f"a stored message list names {row[0]!r}.{row[1]!r}, not a LangChain message class"
        )
    try:
        return spec.cls(**row[2])
    except Exception:
        return spec.cls.model_construct(**row[2])


def _names_a_message(payload: bytes) -> bool:
    """Whether a stored pydantic object is of a ``langchain_core.messages`` class, read
    from its first bytes without decoding it (the module name is a fixstr, or a str8
    from 32 characters on)."""
    return (
        len(payload) > 3
        and payload[0] in (0x93, 0x94)
        and (payload.startswith(_MESSAGE_HEAD, 2) or payload.startswith(_MESSAGE_HEAD, 3))
    )


def _str_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _plain_content(content: Any) -> bool:
    if type(content) is str:
        return True
    return type(content) is list and all(type(x) is str or type(x) is dict for x in content)


_new = object.__new__
# pydantic's slots, set through their descriptors (faster than object.__setattr__).
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _revive_message(tup: Any) -> Any:
    """A LangChain message rebuilt from what ``model_dump`` stored, without running
    pydantic validation (about 4x faster: it is most of the cost of reading a chat), or
    None when that would not give exactly what validation gives.

    It is only done where validation is the identity: the stored fields are exactly
    the class's fields, in the order model_dump writes them (a message stored by another
    langchain-core version takes the slow path), each has the exact type validation
    would leave unchanged (no subclasses), and nothing is left for a validator to do (an
    AI message's tool calls are already parsed into the shape ``create_tool_call``
    makes; a tool message's content and id are already coerced). tests/test_serde.py
    compares both paths field by field.
    """
    if type(tup) is not list or len(tup) < 3:
        return None
    module, name, kw = tup[0], tup[1], tup[2]
    if type(name) is not str or type(kw) is not dict:
        return None
    spec = (_MESSAGE_SPECS or _message_specs()).get(name)
    if spec is None or module != spec.module:
        return None
    if tuple(kw) != spec.order:  # model_dump's order: anything else is validated
        return None
    # The checks are written out, not called: this runs for each message of a chat read.
    content, name_, id_ = kw["content"], kw["name"], kw["id"]
    if (
        kw["type"] != spec.type
        or (type(content) is not str and not _plain_content(content))
        or type(kw["additional_kwargs"]) is not dict
        or type(kw["response_metadata"]) is not dict
        or (name_ is not None and type(name_) is not str)
        or (id_ is not None and type(id_) is not str)
    ):
        return None
    kind = spec.type
    if kind == "ai":
        calls, invalid = kw["tool_calls"], kw["invalid_tool_calls"]
        if (
            calls
            or invalid
            or kw["usage_metadata"] is not None
            or type(calls) is not list
            or type(invalid) is not list
        ):
            if not _plain_tool_calls(kw):
                return None
        elif kw["additional_kwargs"].get("tool_calls"):
            return None  # validation would parse the provider's raw tool calls
    elif kind == "tool":
        if type(kw["tool_call_id"]) is not str or kw["status"] not in ("success", "error"):
            return None
    elif (kind == "chat" and type(kw["role"]) is not str) or (
        kind == "function" and type(kw["name"]) is not str
    ):
        return None
    message: Any = _new(spec.cls)
    # What pydantic's model_construct sets, with the values as validation would leave them.
    _set_dict(message, kw)
    _set_fields_set(message, set(spec.fields))  # == set(kw): same keys, no rehashing
    _set_extra(message, {})
    _set_private(message, None)
    return message


def _plain_tool_calls(kw: dict[str, Any]) -> bool:
    calls, invalid, usage = kw["tool_calls"], kw["invalid_tool_calls"], kw["usage_metadata"]
    if type(calls) is not list or type(invalid) is not list:
        return False
    if not calls and not invalid and kw["additional_kwargs"].get("tool_calls"):
        return False  # validation would parse the provider's raw tool calls
    for call in calls:
        if not (
            type(call) is dict
            and call.keys() == _TOOL_CALL_KEYS
            and call["type"] == "tool_call"
            and type(call["name"]) is str
            and type(call["args"]) is dict
            and _str_or_none(call["id"])
        ):
            return False
    for call in invalid:
        if not (
            type(call) is dict
            and call.keys() == _INVALID_TOOL_CALL_KEYS
            and call["type"] == "invalid_tool_call"
            and all(_str_or_none(call[k]) for k in ("name", "args", "id", "error"))
        ):
            return False
    if usage is None:
        return True
    if type(usage) is not dict:
        return False
    for key in _USAGE_COUNTS:  # loops, not all(...): this runs for every AI message
        if type(usage.get(key)) is not int:
            return False
    for key in _USAGE_DETAILS:
        if not _int_details(usage.get(key)):
            return False
    return True


def _int_details(details: Any) -> bool:
    """Token details absent, or all whole numbers (validation turns 2.0 into 2)."""
    return details is None or (
        type(details) is dict and all(type(v) is int for v in details.values())
    )


def generate_key() -> str:
    """Return a new random 256-bit encryption key, URL-safe base64 encoded."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def _parse_key(key: bytes | str) -> bytes:
    if isinstance(key, str):
        try:
            raw = base64.urlsafe_b64decode(key.encode() + b"=" * (-len(key) % 4))
        except ValueError as exc:
            raise ValueError("encryption_key must be URL-safe base64 of 32 bytes") from exc
    else:
        raw = bytes(key)
    if len(raw) != 32:
        raise ValueError(
            f"encryption_key must be 32 bytes (got {len(raw)}); make one with "
            "agentcheck.generate_key()"
        )
    return raw


class _Zstd:
    """zstd (level 1) contexts, one per thread: a context may not be used by two threads
    at once, and making one per call costs a few microseconds."""

    def __init__(self) -> None:
        self._zstd = require("zstandard", "postgres")
        self._local = threading.local()

    def compress(self, data: bytes) -> bytes:
        ctx = getattr(self._local, "compressor", None)
        if ctx is None:
            ctx = self._local.compressor = self._zstd.ZstdCompressor(level=1)
        return ctx.compress(data)  # type: ignore[no-any-return]

    def decompress(self, data: bytes) -> bytes:
        ctx = getattr(self._local, "decompressor", None)
        if ctx is None:
            ctx = self._local.decompressor = self._zstd.ZstdDecompressor()
        return ctx.decompress(data)  # type: ignore[no-any-return]


@cache
def _zstd() -> _Zstd:
    return _Zstd()


class Codec:
    """Compression and optional encryption of stored payloads.

    Args:
        encryption_key: 32 raw bytes or URL-safe base64 of them. When omitted, the
            ``AGENTCHECK_ENCRYPTION_KEY`` environment variable is used if set.
        compress_threshold: payloads of at least this many bytes are compressed.
        compression: ``"zlib"`` (level 1), or ``"zstd"`` (level 1; needs the
            ``zstandard`` package, in ``agentcheck[postgres]``): as small, and it
            compresses about 2x and decompresses about 4x faster. Rows of either kind
            are read whichever is set.
    """

    def __init__(
        self,
        *,
        encryption_key: bytes | str | None = None,
        compress_threshold: int = 65536,
        compression: str = "zlib",
    ) -> None:
        if encryption_key is None:
            encryption_key = os.environ.get(_ENV_KEY) or None
        if compression not in ("zlib", "zstd"):
            raise ValueError(f"compression must be 'zlib' or 'zstd', not {compression!r}")
        self.compress_threshold = compress_threshold
        self.compression = compression
        self._compress: Callable[[bytes], bytes]
        if compression == "zstd":
            self._compress, self._compressed = _zstd().compress, _ZSTD
        else:
            self._compress, self._compressed = partial(zlib.compress, level=1), _COMPRESSED
        self._aead: Any = None
        self._term_key: bytes | None = None
        if encryption_key is not None:
            aead = require("cryptography.hazmat.primitives.ciphers.aead", "encryption")
            raw = _parse_key(encryption_key)
            self._aead = aead.AESGCM(raw)
            self._term_key = hmac.new(raw, b"agentcheck/index-terms", hashlib.sha256).digest()

    @property
    def encrypted(self) -> bool:
        """Whether payloads are encrypted."""
        return self._aead is not None

    def encode(self, type_: str, data: bytes, *, compress: bool = False) -> tuple[str, bytes]:
        """Compress and encrypt a serialized payload; the tag records what was done.

        Payloads from ``compress_threshold`` bytes up are compressed, smaller ones only
        when ``compress`` is set (and only if that makes them smaller).
        """
        if _MARK in type_:
            raise ValueError(
                f"the serializer's type tag {type_!r} contains {_MARK!r}, which agentcheck "
                "uses to mark compression and encryption: the row could not be read back"
            )
        if compress or len(data) >= self.compress_threshold:
            packed = self._compress(data)
            if len(packed) < len(data):
                type_, data = type_ + self._compressed, packed
        if self._aead is not None:
            nonce = os.urandom(_NONCE_BYTES)
            type_, data = type_ + _ENCRYPTED, nonce + self._aead.encrypt(nonce, data, None)
        return type_, data

    def decode(self, type_: str, data: bytes) -> tuple[str, bytes]:
        """Undo :meth:`encode`; raises :class:`CorruptDataError` naming what failed."""
        if _MARK not in type_:  # neither compressed nor encrypted: most rows
            return type_, data if type(data) is bytes else bytes(data)
        data = bytes(data)
        if type_.endswith(_ENCRYPTED):
            if self._aead is None:
                raise CorruptDataError(
                    "the row is encrypted but no encryption_key was given to the saver"
                )
            try:
                data = self._aead.decrypt(data[:_NONCE_BYTES], data[_NONCE_BYTES:], None)
            except Exception as exc:  # cryptography raises InvalidTag
                raise CorruptDataError(
                    "could not decrypt the row: wrong encryption_key or corrupt data"
                ) from exc
            type_ = type_[: -len(_ENCRYPTED)]
        if type_.endswith(_COMPRESSED):
            try:
                data = zlib.decompress(data)
            except zlib.error as exc:
                raise CorruptDataError(f"corrupt compressed data: {exc}") from exc
            type_ = type_[: -len(_COMPRESSED)]
        elif type_.endswith(_ZSTD):
            zstd = _zstd()  # without the package: MissingExtraError, naming the extra
            try:
                data = zstd.decompress(data)
            except Exception as exc:  # zstandard.ZstdError
                raise CorruptDataError(f"corrupt compressed data (zstd): {exc}") from exc
            type_ = type_[: -len(_ZSTD)]
        return type_, data

    def term(self, text: str) -> str:
        """An index term for ``text``: itself, or a keyed hash of it when encrypting.

        Lets metadata filters and run ids be matched by equality without storing them
        in plaintext.
        """
        if self._term_key is None:
            return text
        return "h:" + hmac.new(self._term_key, text.encode(), hashlib.sha256).hexdigest()
