"""The worker side: what runs inside each worker process (and, for execution.py, inside
Spark's Python workers).

    main.py              the worker's loop: ring → fence check → plugin → deliver → result pipe
    fence.py             the fence check: a frame runs only at its partition's current epoch
    execution.py         one batch through the plugin: retries, bisection (shared with Spark)
    deadletter_format.py what a dead letter carries, made to fit (shared with the supervisor)
    routing.py           where an output goes (its topic, or [output]'s), shared with Spark and redrive

May import: runtime.ops (logging), runtime.kafka (its producer), runtime.transport (its side
of the ring and board), runtime.plugin, runtime.config, runtime.errors. Never the
supervisor: a worker knows nothing of the group.
"""
