"""Near-duplicate detection for text records: word shingles → MinHash → LSH bands.

Input: a JSON object with ``text`` (and optionally ``id``), or plain UTF-8 text.
Output (one per record, key = the record's key): JSON with the MinHash signature, its LSH
band keys, and ``near_duplicate_of`` – the id of an earlier record seen by the same worker
process whose estimated Jaccard similarity is at least ``threshold`` (from a bounded LRU
index kept per worker: with N workers about 1 near-duplicate in N is flagged here, since a
partition's batches go to whichever worker is free; band keys let a downstream job find
duplicates across workers and partitions).

Settings (``[workers.settings]``): ``permutations`` (32), ``bands`` (8), ``shingle``
(3 words), ``threshold`` (0.8), ``index_size`` (50000 signatures per worker),
``emit_signature`` (false: the full MinHash signature is large; bands are enough to join).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from runtime.plugin import Context, Record

_PRIME = (1 << 31) - 1  # products of 31-bit values stay small: fast integer arithmetic
_WORD = re.compile(r"\w+", re.UNICODE)


class MinHasher:
    def __init__(self, permutations: int = 32, bands: int = 8, shingle: int = 3, seed: int = 7) -> None:
        if permutations % bands:
            raise ValueError("permutations must be a multiple of bands")
        rng = random.Random(seed)
        self.perms = [(rng.randrange(1, _PRIME), rng.randrange(0, _PRIME))
                      for _ in range(permutations)]
        self.bands = bands
        self.rows = permutations // bands
        self.shingle = shingle

    def shingles(self, text: str) -> set[int]:
        words = _WORD.findall(text.lower())
        k = self.shingle
        if len(words) < k:
            return {zlib.crc32(" ".join(words).encode()) & _PRIME}
        return {zlib.crc32(" ".join(words[i:i + k]).encode()) & _PRIME
                for i in range(len(words) - k + 1)}

    def signature(self, text: str) -> list[int]:
        hashes = self.shingles(text)
        m = _PRIME
        return [min([(a * h + b) % m for h in hashes]) for a, b in self.perms]

    def band_keys(self, sig: list[int]) -> list[str]:
        r = self.rows
        return [f"{i:02x}{zlib.crc32(repr(sig[i * r:(i + 1) * r]).encode()):08x}"
                for i in range(self.bands)]


def similarity(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


class _Index:
    """Band key → (id, signature), bounded, least recently inserted evicted first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_band: OrderedDict[str, tuple[str, list[int]]] = OrderedDict()

    def find_and_add(self, rid: str, sig: list[int], bands: list[str], threshold: float) -> str | None:
        match = None
        for key in bands:
            hit = self._by_band.get(key)
            if hit is not None and hit[0] != rid and similarity(sig, hit[1]) >= threshold:
                match = hit[0]
                break
        for key in bands:
            self._by_band[key] = (rid, sig)
        while len(self._by_band) > self.size:
            self._by_band.popitem(last=False)
        return match


_hasher = MinHasher()
_index = _Index(50_000)
_threshold = 0.8
_emit_signature = False


def setup(context: Context) -> None:
    global _hasher, _index, _threshold, _emit_signature
    s = context.settings
    _emit_signature = bool(s.get("emit_signature", False))
    _hasher = MinHasher(int(s.get("permutations", 32)), int(s.get("bands", 8)),
                        int(s.get("shingle", 3)))
    _index = _Index(int(s.get("index_size", 50_000)) * _hasher.bands)
    _threshold = float(s.get("threshold", 0.8))


def _text_and_id(record: Record) -> tuple[str, str]:
    raw = (record.value or b"").decode("utf-8", "replace")
    rid = f"{record.topic}/{record.partition}/{record.offset}"
    if raw.startswith("{"):
        try:
            obj: Any = json.loads(raw)
        except ValueError:
            return raw, rid
        if isinstance(obj, dict):
            return str(obj.get("text", "")), str(obj.get("id", rid))
    return raw, rid


def process(batch: Sequence[Record]) -> Iterator[tuple[bytes | None, bytes]]:
    for record in batch:
        text, rid = _text_and_id(record)
        sig = _hasher.signature(text)
        bands = _hasher.band_keys(sig)
        dup = _index.find_and_add(rid, sig, bands, _threshold)
        out: dict[str, Any] = {"id": rid, "bands": bands, "near_duplicate_of": dup}
        if _emit_signature:
            out["minhash"] = sig
        yield record.key, json.dumps(out, separators=(",", ":")).encode()
