"""What a redrive did (or, with ``--dry-run``, would do): counts by error type and source
topic, letters passed over by reason, records that failed again, and how the run ended.
Rendered as one line, as tables (the dry run), or as JSON. Runs in: the CLI."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from runtime.redrive.selection import Skip, Stop


class Mode(enum.Enum):
    TO_SOURCE = "to-source"
    THROUGH_PLUGIN = "through-plugin"


class Ending(enum.Enum):
    """How a run ended (the exit code follows: runtime/errors.py)."""

    END = "end"  # every partition reached its end as seen at start (or --to)
    NOTHING = "nothing"  # the group's cursor was at the end already: nothing read
    STOPPED = "stopped"  # SIGTERM/SIGINT: progress committed, run again to resume
    NO_PARTITIONS = "no-partitions"  # another member of the redrive's group holds them
    FAILED = "failed"  # an error (delivery, Kafka): progress committed up to the last acknowledged


@dataclass
class Summary:
    topic: str
    group: str
    mode: Mode
    dry_run: bool
    redriven: Counter[tuple[str, str]] = field(default_factory=Counter)  # (error type, source topic)
    skipped: Counter[Skip] = field(default_factory=Counter)
    examples: dict[Skip, str] = field(default_factory=dict)  # one detail per reason, for the table
    left: Counter[Stop] = field(default_factory=Counter)  # partitions ended at --to
    failed_again: int = 0  # --through-plugin: records dead-lettered again
    outputs: int = 0  # --through-plugin: outputs produced
    discarded: int = 0  # --through-plugin: outputs without a topic
    ending: Ending = Ending.END
    error: str | None = None
    committed: bool = True  # False: the final commit failed (the next run may redo some)

    @property
    def redriven_total(self) -> int:
        return sum(self.redriven.values())

    def _by_reason(self) -> list[tuple[Skip, int]]:
        return sorted(self.skipped.items(), key=lambda x: x[0].value)

    def skip(self, reason: Skip, detail: str = "") -> None:
        self.skipped[reason] += 1
        if detail and reason not in self.examples:
            self.examples[reason] = detail

    def line(self) -> str:
        """The one line printed at the end."""
        verb = "would redrive" if self.dry_run else "redriven"
        where = "through the plugin" if self.mode is Mode.THROUGH_PLUGIN else "to their source topics"
        parts = [f"{verb} {self.redriven_total} {where}"]
        by_type = Counter[str]()
        for (etype, _topic), n in self.redriven.items():
            by_type[etype] += n
        if by_type:
            parts[0] += " (" + ", ".join(f"{t} {n}" for t, n in sorted(by_type.items())) + ")"
        skipped = sum(self.skipped.values())
        reasons = ", ".join(f"{r.value} {n}" for r, n in self._by_reason())
        parts.append(f"{'would pass over' if self.dry_run else 'passed over'} {skipped}"
                     + (f" ({reasons})" if skipped else ""))
        if self.mode is Mode.THROUGH_PLUGIN and not self.dry_run:
            parts.append(f"failed again {self.failed_again}")
            parts.append(f"outputs {self.outputs}" + (f" ({self.discarded} discarded: no topic)"
                                                       if self.discarded else ""))
        if self.left:
            parts.append(f"left for a later run: partitions ended at --to {sum(self.left.values())}")
        parts.append({
            Ending.END: "reached the end of {topic}",
            Ending.NOTHING: "nothing to redrive in {topic}: group {group} is at its end",
            Ending.STOPPED: "stopped before the end: run again to resume (group {group})",
            Ending.NO_PARTITIONS: "no partition of {topic} was assigned: another redrive of group "
                                  "{group} holds them",
            Ending.FAILED: "stopped by an error: {error}; progress is committed, run again to resume",
        }[self.ending].format(topic=self.topic, group=self.group, error=self.error))
        if not self.committed:
            parts.append("WARNING: the final commit failed, so the next run may redrive the last "
                         "letters again")
        return "redrive: " + "; ".join(parts)

    def tables(self) -> list[Table]:
        """The dry run's tables: what would be redriven by error type and source topic, and what
        would be passed over, by reason."""
        verb = "would redrive" if self.dry_run else "redriven"
        t1 = Table(title=f"{verb} from {self.topic} ({self.mode.value}, group {self.group})")
        t1.add_column("error type")
        t1.add_column("source topic")
        t1.add_column("records", justify="right")
        for (etype, topic), n in sorted(self.redriven.items()):
            t1.add_row(etype, topic, str(n))
        t1.add_row("[b]total[/b]", "", f"[b]{self.redriven_total}[/b]")
        out = [t1]
        if self.skipped or self.left:
            t2 = Table(title="passed over (they stay in the dead-letter topic)" if not self.dry_run
                       else "would be passed over (they stay in the dead-letter topic)")
            t2.add_column("reason")
            t2.add_column("records", justify="right")
            t2.add_column("why")
            for reason, n in self._by_reason():
                detail = self.examples.get(reason)
                t2.add_row(reason.value, str(n), reason.meaning + (f" (e.g. {detail})" if detail else ""))
            for stop, n in self.left.items():
                t2.add_row(stop.value, f"{n} partition(s)", "the run ends at --to there; a later run "
                           "goes on from it")
            out.append(t2)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "group": self.group, "mode": self.mode.value, "dry_run": self.dry_run,
            "redriven": [{"error_type": e, "source_topic": t, "records": n}
                         for (e, t), n in sorted(self.redriven.items())],
            "redriven_total": self.redriven_total,
            "skipped": {r.value: n for r, n in self._by_reason()},
            "skipped_examples": {r.value: d for r, d in self.examples.items()},
            "partitions_ended_at_to": sum(self.left.values()),
            "failed_again": self.failed_again, "outputs": self.outputs, "discarded": self.discarded,
            "ending": self.ending.value, "error": self.error, "committed": self.committed,
        }
