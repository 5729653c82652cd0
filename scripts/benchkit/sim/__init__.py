"""A simulation of the real supervisor loop on a simulated clock: many workers on any machine.

world.py: the clock, the topic, the consumer, rings, workers and result pipes the real
Supervisor is built on; pool.py: the naive peer (multiprocessing.Pool(N)); cases.py: one case
run both ways, and the standard cases; report.py: `./scripts/bench --simulate`. What it
models and what it does not: SECTION below, which docs/scaling.md carries."""

SECTION = """## Simulation

`./scripts/bench --simulate` (seconds to minutes, no broker, the same figures on every machine;
[simulation.md](simulation.md)) runs the project's real `Supervisor.run()` loop – intake, flow
control, scheduler, results, offset trackers, the C packer, every decision – on a simulated
clock (`scripts/benchkit/sim/`). Only what the supervisor talks to is simulated: the group
consumer (a topic whose records are there at the start, or arrive at a given rate; pause and
resume as librdkafka keeps them), the rings (capacity in bytes), the result pipes and the
wait for them, and the workers: each runs its ring's frames in order, a record costing its
own time (the case's µs × (1 ± 0.3), seeded), plus 20 µs a batch. The supervisor's serial
cost is charged to the clock: *sup* µs per record fetched, 4 µs per frame written, 3 µs per
result read, 10 µs per turn of the loop; while it is busy the workers run, while it waits
the clock jumps to the next result or record. Beside it, a simulated
`multiprocessing.Pool(N)` (`imap_unordered`, chunks of 100, one parent paying the same
costs per record, chunk and result) on the same records. Reported: drain efficiency (the
ideal time, all the work spread evenly over the workers, ÷ the time taken), each worker's
busy share, the supervisor's, lane moves, latency percentiles at an offered load.

What it does not model: the CPU the broker, librdkafka's threads, the workers' producers and
the operating system take from the workers (on 2 cores, most of what separates ringmaster
from `Pool(2)`; the simulated workers have a core each); the client's prefetch and the
refetch after a resume (a paused partition simply returns nothing); rebalances, crashes,
fencing, outputs and commits' round trips; contention for memory bandwidth. Its costs are
round figures from profiles (docs/performance.md, the 16-core profile in issue 24: ~2 µs a record for
the supervisor), not measurements of the host it runs on. Read its figures as what the
scheduling decisions allow, not as a host's throughput.

Against reality: on the code before issue 24 it gave 0.94 / 0.91 / 0.96 of ideal for
`partition` / `key` / `unordered` and 0.99 for `Pool(15)` (15 workers, 32 partitions,
~100 µs, sup 1 µs), where another simulation of the same loop (issue 24's) gave 0.92 / 0.88 /
0.95 / 0.98 and the 16-core host (issue 16, before batch-level scheduling) gave `key` 0.93
and `unordered` 1.00 × `Pool(15)`; on 2 workers, 3 and 8 partitions at ~100 µs it gives the
three orderings within 1–2 % of `Pool(2)`, as the 2-core runs above do (0.93–1.02). A few of
its cases are floors in `tests/unit/test_sim_floors.py`: deterministic, so a scheduler
change that drops one fails there, on any machine.
"""
