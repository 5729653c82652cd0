"""The consumer group's story, as this member lives it.

    rebalance.py   assign, revoke (fence, wait for the batch in progress, commit), lose
    caught_up.py   ``--until-caught-up``: when a batch run stops and whether it may exit 0
    commits.py     offsets to the group (none under exactly-once: the workers' transactions)

Runs in: supervisor (rebalance callbacks run inside ``consume()`` on its thread). May import:
the operator's rooms (pauses applied to new partitions), the data path, the workers' rooms
and the seams; never the wiring above it.
"""
