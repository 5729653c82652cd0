"""The worker side: what runs inside each worker process.

    process.py           the worker process: its spawn target, start-up, the loop (ring → fence
                         check → runner → result pipe), teardown; the check probe's entry
    transactional.py     exactly-once: the batch runner inside one transaction per batch
    batch_runner.py      one batch through the plugin, its outputs and dead letters delivered
    fence.py             the fence check: a frame runs only at its partition's current epoch
    decoding.py          a frame's columns into Records (the twin of the supervisor's packer)
    lineage.py           dies with its supervisor; what its plugin forks dies with it
    signal_mask.py       the signals a worker ignores (the supervisor holds them around a spawn)
    spec.py              WorkerSpec: what the supervisor tells a worker it starts
    refusals.py          exactly-once: outputs the cluster refused inside a transaction, refused
                         by the runner before the batch's next transaction produces them again
    (the batch through the plugin, its outputs' routing, its dead letters: runtime/execution/,
    shared with Spark and the redrive)

May import: runtime.execution, runtime.ops (logging), runtime.kafka (its producer),
runtime.transport (its side of the ring and board), runtime.plugin, runtime.config,
runtime.errors. Never the supervisor: a worker knows nothing of the group. Inside, each
module imports only those listed below it (pyproject.toml's import-linter contracts).
"""
