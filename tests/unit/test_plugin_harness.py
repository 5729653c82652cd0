"""runtime.testing.PluginHarness: a plugin run in-process gives what the daemon would have
produced: the same outputs (routed, with the version header), the same dead letters
(formatted and made to fit), a Backoff as a deferred batch, and without a dead-letter topic a
blocked partition. The README's plugin, as the README shows it, is tested with it too."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.errors import PluginError
from runtime.execution.deadletter_format import REDRIVE_COUNT
from runtime.plugin import VERSION_HEADER, Record
from runtime.testing import PluginHarness

ROOT = Path(__file__).resolve().parents[2]

PLUGINS = {
    "h_upper": '''
        from runtime.plugin import Context, Reject

        def setup(context: Context) -> None:
            global suffix, worker
            suffix = context.settings["suffix"].encode()
            worker = context.worker_id

        def process(batch):
            for record in batch:
                if not record.value:
                    yield Reject(record, "empty value")
                    continue
                yield record.key, record.value.upper() + suffix

        def teardown():
            global torn_down
            torn_down = True
        ''',
    "h_crash": '''
        calls = []

        def process(batch):
            calls.append([r.offset for r in batch])
            out = []
            for r in batch:
                if r.value == b"boom":
                    raise ValueError("cannot parse " + repr(r.value))
                out.append(r.value)
            return out
        ''',
    "h_backoff": '''
        from runtime.plugin import Backoff

        def process(batch):
            raise Backoff(2.5, "the scoring service answers 503", scope="all")
        ''',
    "h_routes": '''
        from runtime.plugin import Output

        def process(batch):
            for r in batch:
                yield Output(r.value, key=b"k", headers=[("trace", b"t1")], topic="audit")
                yield r.value
        ''',
    "h_wrong_type": '''
        def process(batch):
            return [42 for _ in batch]
        ''',
    "h_exit": '''
        import sys

        def process(batch):
            sys.exit(3)
        ''',
    "h_big": '''
        def process(batch):
            return [r.value * 1000 for r in batch]
        ''',
    "h_bad_setup": '''
        def setup(context):
            raise RuntimeError("no model file")

        def process(batch):
            return []
        ''',
}


@pytest.fixture(autouse=True)
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, source in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in PLUGINS:
        sys.modules.pop(name, None)


def test_outputs_and_rejects_as_the_daemon_produces_them() -> None:
    with PluginHarness("h_upper", settings={"suffix": "!"}, output_topic="out", dead_letter_topic="dead",
                       topic="hello", partition=3) as plugin:
        batch = plugin.run([(b"a", b"hello"), ("b", "world"), (b"c", b"")])
        module = sys.modules["h_upper"]
        assert module.worker == "worker-0.1", "setup() got a worker's context"
    assert module.torn_down, "teardown() ran at the end"
    assert batch.status == "done"
    assert [(o.topic, o.key, o.value) for o in batch.outputs] == [("out", b"a", b"HELLO!"),
                                                                  ("out", b"b", b"WORLD!")]
    assert all(o.header(VERSION_HEADER) for o in batch.outputs), "every output says which code made it"
    [letter] = batch.dead_letters
    assert (letter.topic, letter.key, letter.value) == ("dead", b"c", b"")
    assert letter.header("ringmaster.error.type") == b"Rejected"
    assert letter.header("ringmaster.error.message") == b"empty value"
    assert (letter.header("ringmaster.source.topic"), letter.header("ringmaster.source.partition"),
            letter.header("ringmaster.source.offset")) == (b"hello", b"3", b"2")
    assert letter.header("ringmaster.worker") == b"worker-0.1"


def test_offsets_go_on_from_batch_to_batch_and_records_keep_theirs() -> None:
    with PluginHarness("h_upper", settings={"suffix": ""}, dead_letter_topic="dead") as plugin:
        plugin.run([b"x", b"y"])
        second = plugin.run([b""])
        third = plugin.run([Record("other", 7, 100, None, b"", [("h", b"v")], (1, 5))])
    assert second.dead_letters[0].header("ringmaster.source.offset") == b"2"
    letter = third.dead_letters[0]
    assert letter.header("ringmaster.source.topic") == b"other" and letter.header("h") == b"v"
    assert letter.header("ringmaster.source.offset") == b"100"


def test_a_failing_record_is_retried_bisected_and_dead_lettered_with_its_traceback() -> None:
    with PluginHarness("h_crash", output_topic="out", dead_letter_topic="dead", max_attempts=2) as plugin:
        batch = plugin.run([b"a", b"b", b"boom", b"d"])
    assert batch.status == "done"
    assert batch.values == [b"a", b"b", b"d"], "every other record keeps its output"
    [letter] = batch.dead_letters
    assert letter.value == b"boom"
    assert letter.header("ringmaster.error.type") == b"ValueError"
    assert letter.header("ringmaster.error.message") == b"cannot parse b'boom'"
    assert b"Traceback" in (letter.header("ringmaster.error.traceback") or b"")
    assert letter.header("ringmaster.attempts") == b"2"
    calls = sys.modules["h_crash"].calls
    assert calls[:2] == [[0, 1, 2, 3], [0, 1, 2, 3]], "max_attempts tries of the whole batch first"
    assert [2] in calls, "then bisection down to the record at fault"


def test_without_a_dead_letter_topic_the_partition_blocks_at_the_failing_record() -> None:
    with PluginHarness("h_crash", output_topic="out", max_attempts=1) as plugin:
        batch = plugin.run([b"a", b"boom", b"c"])
    assert batch.status == "blocked"
    assert batch.values == [b"a"], "only the records before it"
    assert batch.detail == "offset 1: ValueError: cannot parse b'boom'"
    assert batch.dead_letters == []


def test_a_backoff_defers_the_batch_and_produces_nothing() -> None:
    with PluginHarness("h_backoff", output_topic="out", dead_letter_topic="dead") as plugin:
        batch = plugin.run([b"a"])
    assert (batch.status, batch.delay_s, batch.scope) == ("deferred", 2.5, "all")
    assert "the scoring service answers 503" in batch.detail
    assert batch.outputs == [] and batch.dead_letters == []


def test_outputs_go_to_their_own_topic_or_the_output_topic_or_nowhere() -> None:
    with PluginHarness("h_routes", output_topic="out") as plugin:
        routed = plugin.run([b"v"])
    assert [(o.topic, o.value) for o in routed.outputs] == [("audit", b"v"), ("out", b"v")]
    assert routed.outputs[0].header("trace") == b"t1" and routed.outputs[0].header(VERSION_HEADER)
    with PluginHarness("h_routes") as plugin:
        unrouted = plugin.run([b"v"])
    assert [o.topic for o in unrouted.outputs] == ["audit"] and unrouted.discarded == 1


@pytest.mark.parametrize(("plugin", "error_type", "message"), [
    ("h_wrong_type", b"TypeError", b"int"),
    ("h_exit", b"SystemExit", b"plugin code called sys.exit(3)"),
])
def test_outputs_outside_the_contract_and_sys_exit_fail_the_record(plugin: str, error_type: bytes,
                                                                   message: bytes) -> None:
    with PluginHarness(plugin, output_topic="out", dead_letter_topic="dead", max_attempts=1) as h:
        batch = h.run([b"a"])
    [letter] = batch.dead_letters
    assert letter.header("ringmaster.error.type") == error_type
    assert message in (letter.header("ringmaster.error.message") or b"")


def test_an_output_larger_than_message_max_bytes_dead_letters_its_record_and_the_letter_fits() -> None:
    with PluginHarness("h_big", output_topic="out", dead_letter_topic="dead", max_attempts=1,
                       max_message_bytes=8192) as plugin:
        batch = plugin.run([b"x" * 5, b"y" * 100])
    # The first call queued x's output before y's was refused: the worker settles it (the
    # broker acknowledges it), so the bisected call does not send it again (issue 29).
    assert batch.values == [b"x" * 5000]
    [letter] = batch.dead_letters
    assert letter.value == b"y" * 100 and letter.header("ringmaster.error.type") == b"OutputRejected"
    assert b"message.max.bytes (8192)" in (letter.header("ringmaster.error.message") or b"")


def test_a_redriven_record_keeps_its_redrive_count_in_its_letter() -> None:
    with PluginHarness("h_upper", settings={"suffix": ""}, dead_letter_topic="dead") as plugin:
        headers = [(REDRIVE_COUNT, b"2"), ("ringmaster.x", b"1")]
        batch = plugin.run([Record("t", 0, 5, None, b"", headers, (1, 0))])
    [letter] = batch.dead_letters
    assert letter.header(REDRIVE_COUNT) == b"2" and letter.header("ringmaster.x") is None


def rec(topic: str, partition: int, offset: int) -> Record:
    return Record(topic, partition, offset, None, b"v", None, (1, 0))


def test_a_batch_is_one_partition_in_offset_order() -> None:
    with PluginHarness("h_upper", settings={"suffix": ""}) as plugin:
        with pytest.raises(ValueError, match="one partition's records in offset order"):
            plugin.run([rec("t", 0, 5), rec("t", 0, 5)])
        with pytest.raises(ValueError, match="one partition's records"):
            plugin.run([rec("t", 0, 5), rec("t", 1, 6)])
        with pytest.raises(ValueError, match="at least one record"):
            plugin.run([])


def test_a_setup_that_fails_says_so_as_a_worker_does() -> None:
    with pytest.raises(PluginError, match=r"'h_bad_setup' setup\(\) failed: RuntimeError: no model file"):
        PluginHarness("h_bad_setup")


def test_the_readme_plugin_section_shows_a_harness_test_that_passes(tmp_path: Path) -> None:
    """The README's plugin test, as written, against the README's upper.py."""
    import re
    readme = (ROOT / "README.md").read_text()
    blocks = dict(re.findall(r"^`([\w.-]+)`[^`\n]*:\s*\n+```python\n(.*?)^```", readme, re.S | re.M))
    assert "upper.py" in blocks and "test_upper.py" in blocks, sorted(blocks)
    (tmp_path / "upper.py").write_text(blocks["upper.py"])
    namespace: dict[str, object] = {}
    sys.modules.pop("upper", None)
    try:
        exec(compile(blocks["test_upper.py"], "test_upper.py", "exec"), namespace)
        tests = [fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
        assert tests, "the README's test file has a test"
        for fn in tests:
            fn()
    finally:
        sys.modules.pop("upper", None)
