"""The Kafka adapter: the only package that imports ``confluent_kafka`` (the Spark backend
aside: runtime/spark/offsets.py and source.py read partitions and offsets for Spark's
planner with their own short-lived clients).

    consumer.py      the supervisor's group consumer: membership (rebalance callbacks) and fetching
    offset_commits.py  its commits, asynchronous and synchronous, and the broker's answers
    positions.py     where each of its partitions is read from: pauses, resumes, seeks
    producer.py      producing with acknowledgements; delivery errors: a record's fault vs an outage
    topic_reader.py  assign-only reading: a whole topic (the control topic, ``ringmaster tail``), the
                     bounds of a topic's partitions and single records (``ringmaster redrive``)
    admin.py         client property checks before anything connects; cluster metadata; topics:
                     exist? create
    client_log.py    librdkafka's own log lines and error_cb reports into the structured log
    coordinator.py   a group coordinator that is moving or loading: ask again (commits, committed offsets)
    share_consumer.py  a share group's member (KIP-932): one poll at a time, explicit acknowledgements
    transactions.py  transactional producers and their stable ids (exactly-once)
    committed_offsets.py  a worker's stable read of its partition's committed offset, with a hard
                     deadline of its own: a client stuck past it is given up (exactly-once)
    fencing.py       the ids of the worker slots a daemon does not start, fenced as it starts
    group_offsets.py where the whole group stands for a batch run: partition ends, committed offsets
    group_committed.py  the group's committed offsets through a consumer's committed(), asked
                     again while the coordinator moves (never the admin client: librdkafka#5040)
    read_ends.py     a partition's end read to the end (some brokers answer ListOffsets short)
    empty_gaps.py    whether a gap of offsets holds anything a reader is handed
    side_readers.py  what those short-lived readers share: their properties, their answer's thread
    watermarks.py    the ends of paused partitions (ListOffsets, off the loop): lag keeps growing
    messages.py      a consumed message's topic, partition, offset and headers, as types say them
    properties.py    the librdkafka properties of every client, built from the settings

It translates the client and nothing more: batching and packing are the transport's.
May import: runtime.transport (to bind the message type), runtime.config, runtime.errors.
"""
