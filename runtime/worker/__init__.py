"""The worker side: what runs inside each worker process.

    main.py              the worker's loop: ring → fence check → plugin → deliver → result pipe
    fence.py             the fence check: a frame runs only at its partition's current epoch
    (the batch through the plugin, its outputs' routing, its dead letters: runtime/execution/,
    shared with Spark and the redrive)

May import: runtime.execution, runtime.ops (logging), runtime.kafka (its producer),
runtime.transport (its side of the ring and board), runtime.plugin, runtime.config,
runtime.errors. Never the supervisor: a worker knows nothing of the group.
"""
