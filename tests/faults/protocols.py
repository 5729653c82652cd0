"""The rebalance rows of the matrices under each group protocol the broker has: a row named in
a matrix's ``REBALANCE_ROWS`` runs under the session's protocol (RINGMASTER_TEST_GROUP_PROTOCOL)
as itself, and again under each other one as ``<id>-<protocol>`` (on Apache Kafka: classic
and KIP-848's ``consumer``; on Tansu there is no other). The variants are rows of the session
only: the docs tables list each row once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, TypeVar

from helpers import GROUP_PROTOCOLS, TEST_GROUP_PROTOCOL

Row = TypeVar("Row", bound=Any)  # a frozen dataclass with ``id`` and ``protocol`` (either matrix's row)


def with_variants(rows: Iterable[Row], rebalance: Iterable[str]) -> list[Row]:
    """The rows, each rebalance row followed by its variants under the other protocols."""
    names = set(rebalance)
    out = []
    for row in rows:
        out.append(row)
        if row.id in names:
            out += [replace(row, id=f"{row.id}-{p}", protocol=p) for p in GROUP_PROTOCOLS
                    if p != TEST_GROUP_PROTOCOL]
    missing = names - {r.id for r in out}
    assert not missing, f"rebalance rows that are not rows: {sorted(missing)}"
    return out
