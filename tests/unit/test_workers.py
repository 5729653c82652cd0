"""The built-in plugins do real work."""

from __future__ import annotations

import json

from runtime.plugin import Context, Output, Record, Reject
from workers import enrich, fingerprint


def rec(value: bytes, offset: int = 0) -> Record:
    return Record("t", 0, offset, b"k", value, None, (0, 0))


def test_fingerprint_finds_near_duplicates_and_not_strangers() -> None:
    fingerprint.setup(Context("w", {"permutations": 64, "bands": 16, "threshold": 0.5,
                                    "emit_signature": True}))
    base = "the committee approved the new budget for public libraries after a long debate on tuesday"
    near = base.replace("tuesday", "wednesday")
    other = "a storm closed several mountain roads and schools across the northern region overnight"
    outs = [json.loads(v) for _, v in fingerprint.process([
        rec(json.dumps({"id": "a", "text": base}).encode(), 0),
        rec(json.dumps({"id": "b", "text": near}).encode(), 1),
        rec(json.dumps({"id": "c", "text": other}).encode(), 2)])]
    assert outs[0]["near_duplicate_of"] is None
    assert outs[1]["near_duplicate_of"] == "a"
    assert outs[2]["near_duplicate_of"] is None
    assert len(outs[0]["minhash"]) == 64 and len(outs[0]["bands"]) == 16


def test_minhash_estimates_jaccard() -> None:
    h = fingerprint.MinHasher(permutations=128, bands=16, shingle=1)
    a = " ".join(f"w{i}" for i in range(100))
    b = " ".join(f"w{i}" for i in range(50, 150))  # Jaccard 50/150 = 0.33
    est = fingerprint.similarity(h.signature(a), h.signature(b))
    assert 0.2 < est < 0.47


def test_enrich_valid_and_invalid() -> None:
    enrich.setup(Context("w", {}))
    good = {"order_id": "o1", "customer": "c1", "currency": "usd",
            "items": [{"sku": "A", "qty": 2, "unit_price": 10.0}], "ts": 1}
    bad = dict(good, items=[{"sku": "A", "qty": 0, "unit_price": 1}])
    out = list(enrich.process([rec(json.dumps(good).encode()), rec(json.dumps(bad).encode()),
                               rec(b"not json")]))
    assert isinstance(out[0], Output)
    body = json.loads(out[0].value or b"")
    assert body["total"] == 20.0 and body["total_eur"] == 18.4 and body["currency"] == "USD"
    assert isinstance(out[1], Reject) and "qty 0" in out[1].reason
    assert isinstance(out[2], Reject)


def test_a_workers_descendants_are_found_without_scanning_every_process() -> None:
    """pool.descendant_pids reads the kernel's per-thread children lists: the same processes
    psutil finds by reading all of /proc, grandchildren included."""
    import subprocess

    import psutil

    from runtime.supervisor.workers.pool import descendant_pids

    tree = subprocess.Popen(["bash", "-c", "sleep 30 & bash -c 'sleep 30 & wait' & wait"])
    try:
        deadline = __import__("time").monotonic() + 5
        while len(psutil.Process(tree.pid).children(recursive=True)) < 3:
            assert __import__("time").monotonic() < deadline, "the tree did not start"
        expected = sorted(c.pid for c in psutil.Process(tree.pid).children(recursive=True))
        assert sorted(descendant_pids(tree.pid)) == expected
    finally:
        for c in psutil.Process(tree.pid).children(recursive=True):
            c.kill()
        tree.kill()
        tree.wait()
