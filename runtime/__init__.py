"""kafka-ringmaster: a supervisor that fans Kafka partitions over shared-memory rings to
worker processes running a plugin, and commits only what was fully handled.

Packages, by where their code runs (each one's docstring says what it holds; they import only
downward, in this order: pyproject.toml's import-linter contracts):

    cli/          the ``ringmaster`` command
    console/      ``ringmaster console``: the web console, in a process of its own
    spark/        the Spark backend          redrive/  dead letters sent back
    supervisor/   the daemon: the group member and its workers' supervisor
    dev/          developer tooling: brokers, certificates, Maven, produce/tail
    worker/       what runs inside each worker process
    execution/    the plugin run over records (a worker, a Spark task, the redrive)
    ops/          what an operator sees and uses around a running daemon
    kafka/        the Kafka adapter: the only package that imports confluent_kafka
    transport/    the shared-memory transport between the supervisor and its workers
    config/       the settings, validated before Kafka is touched

Modules everything may use: plugin.py (the plugin contract), testing.py (a plugin's batches
run in its author's tests), errors.py (the one error hierarchy and the exit codes), tp.py (a
topic-partition and its label), subscription.py (which topics a subscription takes in),
backoff.py, durations.py, host.py (the CPUs this process may use), java_client.py (librdkafka
properties as the Java client's).
"""

__version__ = "0.1.0"
