"""Safe serialization, compression and encryption of everything agentcheck stores.

Two layers:

* :class:`SafeSerializer` turns Python values into ``(type, bytes)`` with LangGraph's
  msgpack format in strict mode: no pickle, and a value whose type is not on the
  allowlist is refused *when it is written* (LangGraph's own strict mode only notices on
  read, and then silently hands back raw data).
* :class:`Codec` turns ``(type, bytes)`` into what is stored: large payloads compressed
  with zlib, everything encrypted with AES-256-GCM when a key is given. The steps applied
  are recorded as suffixes of the type tag (``msgpack+z+aes``), so a row says how to read it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
import re
import sys
import zlib
from collections.abc import Iterable
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import jsonplus as _jp
from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_TYPES
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from agentcheck._errors import CorruptDataError, UnsafeTypeError
from agentcheck._extras import require

__all__ = ["Codec", "SafeSerializer", "generate_key"]

_ENV_KEY = "AGENTCHECK_ENCRYPTION_KEY"
_COMPRESSED = "+z"
_ENCRYPTED = "+aes"
_NONCE_BYTES = 12


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

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj is None or isinstance(obj, (bytes, bytearray)):
            return super().dumps_typed(obj)
        refused: list[UnsafeTypeError] = []
        try:
            return "msgpack", self._pack(obj, refused)
        except ormsgpack.MsgpackEncodeError as exc:
            # ormsgpack drops the exception raised by `default`; keep ours by hand.
            if refused:
                raise refused[0] from None
            raise TypeError(f"agentcheck cannot serialize this value: {exc}") from exc

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_ = data[0]
        if type_ not in ("null", "bytes", "bytearray", "json", "msgpack"):
            # "pickle" lands here too: stored pickles are never executed.
            raise CorruptDataError(f"unknown serialization type tag {type_!r}")
        return super().loads_typed(data)

    def _pack(self, obj: Any, refused: list[UnsafeTypeError]) -> bytes:
        def default(value: Any) -> Any:
            return self._default(value, refused)

        return ormsgpack.packb(obj, default=default, option=_jp._option)

    def _default(self, obj: Any, refused: list[UnsafeTypeError]) -> Any:
        try:
            self._check_allowed(obj)
        except UnsafeTypeError as exc:
            refused.append(exc)
            raise
        if isinstance(obj, _DeltaSnapshot):  # a NamedTuple, but has its own ext code
            return ormsgpack.Ext(_jp.EXT_DELTA_SNAPSHOT, self._pack(obj.value, refused))
        # Containers whose fields langgraph encodes with its own (unchecked) hook are
        # encoded here so that every nested value is checked too.
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return ormsgpack.Ext(
                _jp.EXT_CONSTRUCTOR_KW_ARGS,
                self._pack((type(obj).__module__, type(obj).__name__, fields), refused),
            )
        if isinstance(obj, tuple) and callable(getattr(obj, "_asdict", None)):
            return ormsgpack.Ext(
                _jp.EXT_CONSTRUCTOR_KW_ARGS,
                self._pack((type(obj).__module__, type(obj).__name__, obj._asdict()), refused),  # type: ignore[attr-defined]
            )
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


class Codec:
    """Compression and optional encryption of stored payloads.

    Args:
        encryption_key: 32 raw bytes or URL-safe base64 of them. When omitted, the
            ``AGENTCHECK_ENCRYPTION_KEY`` environment variable is used if set.
        compress_threshold: payloads of at least this many bytes are zlib-compressed.
    """

    def __init__(
        self,
        *,
        encryption_key: bytes | str | None = None,
        compress_threshold: int = 65536,
    ) -> None:
        if encryption_key is None:
            encryption_key = os.environ.get(_ENV_KEY) or None
        self.compress_threshold = compress_threshold
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

    def encode(self, type_: str, data: bytes) -> tuple[str, bytes]:
        """Compress and encrypt a serialized payload; the tag records what was done."""
        if len(data) >= self.compress_threshold:
            packed = zlib.compress(data, 1)
            if len(packed) < len(data):
                type_, data = type_ + _COMPRESSED, packed
        if self._aead is not None:
            nonce = os.urandom(_NONCE_BYTES)
            type_, data = type_ + _ENCRYPTED, nonce + self._aead.encrypt(nonce, data, None)
        return type_, data

    def decode(self, type_: str, data: bytes) -> tuple[str, bytes]:
        """Undo :meth:`encode`; raises :class:`CorruptDataError` naming what failed."""
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
        return type_, data

    def term(self, text: str) -> str:
        """An index term for ``text``: itself, or a keyed hash of it when encrypting.

        Lets metadata filters and run ids be matched by equality without storing them
        in plaintext.
        """
        if self._term_key is None:
            return text
        return "h:" + hmac.new(self._term_key, text.encode(), hashlib.sha256).hexdigest()
