"""Running the plugin over records, the same way wherever it runs: in a worker process
(runtime/worker/), a Spark task (runtime/spark/) and the redrive (runtime/redrive/).

    run.py                one batch through the plugin: retries, bisection, copies of the records
    acked.py              outputs the broker acknowledged, not written again when records run again
    routing.py            where an output goes (its topic, or [output]'s)
    deadletter_format.py  what a dead letter carries, made to fit (the supervisor's desk too)

May import: runtime.transport (the speedups, a board's phase codes), runtime.plugin,
runtime.errors, runtime.backoff. Never a process's own package: the worker, the supervisor,
Spark and the redrive import this, not the other way round.
"""
