"""Running the selected rows of a matrix a few at a time, once per session: each row's test
then judges its own observation (or re-raises what went wrong while driving it)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

PARALLEL = int(os.environ.get("RINGMASTER_MATRIX_PARALLEL", "4"))
# A JSON file to append each row's wall time to ({"matrix", "row", "seconds", "ok"} a line):
# what sizes the matrices for CI (docs/brokers.md).
TIMES = os.environ.get("RINGMASTER_MATRIX_TIMES")


def observe_selected(request: pytest.FixtureRequest, test_name: str, rows: Mapping[str, Any],
                     run: Callable[[Any, str, Path], Any], bootstrap: str,
                     tmp_path_factory: pytest.TempPathFactory,
                     cost: Callable[[Any], int] = lambda row: 0) -> dict[str, Any]:
    """Drive the rows whose ``test_name`` tests this session selected; row id -> observation or
    the exception driving it raised. Costlier rows (``cost``) start first, so that the last
    few to finish are short ones: the wall time is then near the rows' total / PARALLEL."""
    selected = [item.callspec.params["fault_id"] for item in request.session.items
                if item.originalname == test_name and hasattr(item, "callspec")]
    selected.sort(key=lambda fid: -cost(rows[fid]))
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}

    def timed(fid: str) -> Any:
        started = time.monotonic()
        try:
            return run(rows[fid], bootstrap, tmp_path_factory.mktemp(fid))
        finally:
            seconds[fid] = time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = {pool.submit(timed, fid): fid for fid in selected}
        for fut in concurrent.futures.as_completed(futures):
            fid = futures[fut]
            try:
                results[fid] = fut.result()
            except BaseException as exc:  # reported by that row's test
                results[fid] = exc
    if TIMES:
        with open(TIMES, "a") as out:
            for fid in selected:
                out.write(json.dumps({"matrix": test_name, "row": fid, "seconds": round(seconds[fid], 2),
                                      "ok": not isinstance(results[fid], BaseException)}) + "\n")
    return results
