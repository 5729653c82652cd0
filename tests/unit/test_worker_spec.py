"""What a worker's output producer is built with (runtime/worker/spec.py ``producer_props``)."""

from __future__ import annotations

import dataclasses

from runtime.worker.spec import WorkerSpec, producer_props

SPEC = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq",
                  {"bootstrap.servers": "x:1", "linger.ms": 5}, 2, 0.0, 0.0, 1)


def test_a_worker_asks_for_failed_deliveries_only_and_keeps_the_configured_properties() -> None:
    props = producer_props(SPEC)
    assert props["delivery.report.only.error"] is True
    assert props["linger.ms"] == 5 and "transactional.id" not in props


def test_the_configuration_can_ask_for_every_delivery_report() -> None:
    asked = {**SPEC.producer_props, "delivery.report.only.error": False}
    spec = dataclasses.replace(SPEC, producer_props=asked)
    assert producer_props(spec)["delivery.report.only.error"] is False


def test_exactly_once_adds_the_slots_transactional_id() -> None:
    spec = dataclasses.replace(SPEC, transactional_id="ringmaster-g-m-w0")
    props = producer_props(spec)
    assert props["transactional.id"] == "ringmaster-g-m-w0" and props["delivery.report.only.error"] is True
