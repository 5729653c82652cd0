"""The ``ringmaster`` command: run, check, broker, produce, tail; the operator commands pause,
resume, reload, scale, status and top; redrive; spark.

Errors the user can fix (config, plugin, shared memory) print one line on stderr and exit
non-zero, without a traceback, before anything touches Kafka. The operator commands never
import the plugin (a broken deploy must not keep an operator from pausing the group) and
log only warnings, on stderr, so their own output comes first and alone.

    app.py              the command group: every subcommand registered on it
    daemon.py           run: the supervisor daemon, or the parent of --members N of them
    check.py            check: validate a config, start the plugin once
    daemon_commands.py  reload, scale: requests over the running daemons' control sockets
    pauses.py           pause, resume: group-wide pauses in the control topic
    status.py           status, top: the daemon's snapshot, once or live
    redrive.py          redrive: dead letters back to their source, or through the plugin
    spark_commands.py   spark run, spark backfill (also what spark-submit runs)
    broker.py           broker: a development broker (Tansu or Apache Kafka)
    devtools.py         produce, tail: test records in, a topic's records out
    console.py          console: the web console, in a process of its own
    loading.py          a command's settings, checked before Kafka is touched; the cluster's first answer
    outcome.py          how a command ends: one line and the exit status, or a bug's traceback
"""

from runtime.cli.app import main

__all__ = ["main"]
