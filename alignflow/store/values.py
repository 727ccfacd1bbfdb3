"""Checks on values before they reach the database: ids, digests, JSON documents, log tails.

Both backends must accept exactly the same values, and a bad value must fail with a message that names it,
not with a driver error after half a transaction: PostgreSQL rejects NUL characters in text and NaN/Infinity
in JSONB, SQLite accepts both, so the store refuses (JSON) or replaces (log tails) them everywhere.
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Mapping

from pydantic import JsonValue

from alignflow.errors import RecordNotFound, StoreError

ID_LENGTH = 12
MIN_PREFIX = 4
TAIL_MAX_CHARS = 64 * 1024
_HEX = re.compile(r"[0-9a-f]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def new_id() -> str:
    """A fresh public id: 12 hex characters (48 random bits; a collision is retried by the caller)."""
    return secrets.token_hex(ID_LENGTH // 2)


def check_id_prefix(value: object, what: str) -> str:
    """A syntactically valid id or id prefix (4 to 12 lowercase hex characters), else RecordNotFound."""
    if not isinstance(value, str) or not _HEX.fullmatch(value) or not MIN_PREFIX <= len(value) <= ID_LENGTH:
        raise RecordNotFound(
            f"{what} {value!r}: not an id; ids are {ID_LENGTH} hex characters (a unique prefix of at least "
            f"{MIN_PREFIX} will do) - see `alignflow history`"
        )
    return value


def check_sha256(value: object, what: str) -> str:
    if not isinstance(value, str) or not _SHA256.fullmatch(value):
        raise StoreError(f"{what}: {value!r} is not a sha256 digest (64 lowercase hex characters)")
    return value


def check_name(value: object, what: str, *, max_length: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > max_length or "\x00" in value:
        raise StoreError(f"{what}: {value!r} must be a non-empty string of at most {max_length} characters")
    return value


def log_tail(value: str | None) -> str | None:
    """The last TAIL_MAX_CHARS characters, NUL replaced by U+FFFD (PostgreSQL text cannot hold NUL)."""
    if value is None:
        return None
    return value[-TAIL_MAX_CHARS:].replace("\x00", "\ufffd")


def json_document(value: object, where: str) -> JsonValue:
    """`value` as plain JSON (dict/list/str/int/float/bool/None); numpy scalars become Python numbers.

    Raises StoreError naming the offending key path for anything else, for NaN/Infinity (JSONB rejects them;
    record them as null or a string) and for NUL characters.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        if "\x00" in value:
            raise StoreError(f"{where}: contains a NUL character, which the database cannot store")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StoreError(f"{where}: {value} cannot be stored in JSON; record it as null or as a string")
        return value
    if isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise StoreError(f"{where}: key {key!r} is not a string; JSON objects take string keys only")
            json_document(key, f"{where} key")
            out[key] = json_document(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        return [json_document(item, f"{where}[{i}]") for i, item in enumerate(value)]
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item):
        return json_document(item(), where)
    raise StoreError(f"{where}: a {type(value).__name__} is not JSON (use dict, list, str, int, float, bool, None)")
