"""The transport's packer learns the Kafka client's message type from the consumer that is
made (runtime/kafka/messages.py's bind_packer), not as a side effect of an import: a process
that only imports the adapter has an unbound packer, and a consumer binds it, once."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Each in a process of its own: the test process has consumers made by other tests.
BEFORE = """
from confluent_kafka import Message
from runtime.kafka.consumer import GroupConsumer
from runtime.kafka.share_consumer import ShareGroupConsumer
from runtime.transport import packing

assert packing._offset is packing._unbound, "importing the adapter bound the packer"
"""
GROUP = BEFORE + """
GroupConsumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"})._c.close()
assert packing._offset is Message.offset, "a group consumer was made and the packer is unbound"
packing._offset = packing._unbound
GroupConsumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"})._c.close()
assert packing._offset is packing._unbound, "bound again: a fallback to Python would be undone"
"""
SHARE = BEFORE + """
from types import SimpleNamespace

ShareGroupConsumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"},
                   client=SimpleNamespace(set_acknowledgement_commit_callback=lambda cb: None))
assert packing._offset is Message.offset, "a share consumer was made and the packer is unbound"
"""


@pytest.mark.parametrize("code", [GROUP, SHARE], ids=["group", "share"])
def test_the_consumer_that_is_made_binds_the_packer_and_an_import_does_not(code: str) -> None:
    out = subprocess.run([sys.executable, "-c", code + "print('ok')"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
