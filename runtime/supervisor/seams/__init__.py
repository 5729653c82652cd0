"""The seams between the supervisor's rooms and what they drive, each a Protocol of what the
rooms call on it and no more: the real objects and the tests' fakes both fit them.

    consumer.py   the group consumer
    pool.py       the worker pool and its handles; ``PluginCode``, what a worker runs

Runs in: supervisor. May import: runtime.kafka (the values the consumer returns),
runtime.transport; nothing of the supervisor's rooms.
"""
