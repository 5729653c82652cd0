"""The Spark backend: the same plugin, scaled out with PySpark.

    Kafka ─▶ KafkaStreamReader (Python Data Source API; one Spark task per Kafka partition
             and offset range, admission control, availableNow)
          ─▶ mapInArrow(apply plugin: same Records, same setup/teardown, same retries,
             bisection and dead letters as the local runtime)
          ─▶ KafkaSink (outputs → [output] topic, failures → [dead_letter] topic)
          ─▶ micro-batch done ─▶ GroupCommitter (StreamingQueryListener) commits the batch's
             end offsets to the consumer group, so lag tools see the job.

Imports pyspark: only loaded by ``ringmaster spark ...``.
"""
