"""Running the selected rows of a matrix a few at a time, once per session: each row's test
then judges its own observation (or re-raises what went wrong while driving it)."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

PARALLEL = int(os.environ.get("RINGMASTER_MATRIX_PARALLEL", "4"))


def observe_selected(request: pytest.FixtureRequest, test_name: str, rows: Mapping[str, Any],
                     run: Callable[[Any, str, Path], Any], bootstrap: str,
                     tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Drive the rows whose ``test_name`` tests this session selected; row id -> observation or
    the exception driving it raised."""
    selected = [item.callspec.params["fault_id"] for item in request.session.items
                if item.originalname == test_name and hasattr(item, "callspec")]
    results: dict[str, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = {pool.submit(run, rows[fid], bootstrap, tmp_path_factory.mktemp(fid)): fid
                   for fid in selected}
        for fut in concurrent.futures.as_completed(futures):
            fid = futures[fut]
            try:
                results[fid] = fut.result()
            except BaseException as exc:  # reported by that row's test
                results[fid] = exc
    return results
