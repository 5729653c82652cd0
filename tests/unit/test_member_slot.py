"""runtime.ops.member_slot: a daemon's slot among the live daemons of its group on this host,
which names its workers' transactional ids (a replacement takes its dead predecessor's, and
fences what it left open; two live daemons never share one)."""

from __future__ import annotations

import subprocess
import sys
import uuid

from helpers import ROOT

from runtime.ops.member_slot import claim, member_name


def test_live_daemons_get_distinct_slots_and_a_released_slot_is_taken_again() -> None:
    group = f"g-{uuid.uuid4().hex}"
    first, second = claim(group), claim(group)
    other_group = claim(f"{group}-other")
    try:
        assert (first.index, second.index, other_group.index) == (0, 1, 0)
        first.release()
        again = claim(group)
        assert again.index == 0, "the lowest free slot: the one a replacement takes"
        again.release()
    finally:
        for s in (first, second, other_group):
            s.release()


def test_a_slot_held_by_a_process_that_was_killed_is_free_at_once() -> None:
    group = f"g-{uuid.uuid4().hex}"
    code = ("import os, signal, sys; from runtime.ops.member_slot import claim; "
            "s = claim(sys.argv[1]); print(s.index, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.run([sys.executable, "-c", code, group], capture_output=True, text=True, cwd=ROOT)
    assert child.returncode == -9 and child.stdout.strip() == "0"
    slot = claim(group)
    try:
        assert slot.index == 0, "the killed daemon's slot is its replacement's"
    finally:
        slot.release()


def test_the_member_name_is_the_host_and_the_slot() -> None:
    assert member_name("host-a", 1) == "host-a-m1"
