"""The Spark backend: the same plugin, scaled out with PySpark.

    Kafka ─▶ KafkaStreamReader (Python Data Source API; one Spark task per Kafka partition
             and offset range, admission control, availableNow)
          ─▶ mapInArrow(apply plugin: same Records, same setup/teardown, same retries,
             bisection and dead letters as the local runtime)
          ─▶ KafkaSink (outputs → [output] topic, failures → [dead_letter] topic)
          ─▶ micro-batch done ─▶ GroupCommitter (StreamingQueryListener) commits the batch's
             end offsets to the consumer group, so lag tools see the job.

    job.py       ``ringmaster spark run`` / ``spark backfill``: the driver's side
    source.py    the Kafka source and sink (Python Data Source API)
    builtin_source.py  Spark's own Kafka source instead (spark.source = "kafka"): jars, options, rows
    apply.py     the plugin over Arrow batches in Spark's Python workers
    offsets.py   start/end offsets, their JSON forms, offset ranges
    progress.py  the same status snapshot and metrics as the local daemon, where they apply
    submit.py    the entry file for spark-submit

Imports pyspark: only loaded by ``ringmaster spark ...``. May import: runtime.execution (the
plugin's run, routing, the dead-letter format: the same retries and dead letters as a worker),
runtime.dev (Maven, for Spark's own Kafka source's jars), runtime.kafka, runtime.ops,
runtime.plugin, runtime.config, runtime.errors. Never the supervisor (Spark is the scheduler
here) nor the worker's process; runtime.cli only from submit.py, which hands over to it.
"""
