# The C extension's signatures (_speedups.c), for the type checker: mypy cannot read a .so.
from collections.abc import Sequence
from typing import Any, TypeVar

_R = TypeVar("_R")

def bind(message_type: type, unreadable: type[BaseException], /) -> None: ...
def pack_frame(head: tuple[object, ...], messages: Sequence[Any], start: int, stop: int, /) -> bytes: ...
def build_records(record_type: type[_R], topic: str, partition: int, first: int,
                  offsets: list[int] | None, keys: list[bytes | None], values: list[bytes | None],
                  headers: list[list[tuple[str, bytes | None]] | None] | None,
                  ts_types: int | list[int], timestamps: list[int], /) -> list[_R]: ...
