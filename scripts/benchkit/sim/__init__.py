"""A simulation of the real supervisor loop on a simulated clock: many workers on any machine.

world.py: the clock, the topic, the consumer, rings, workers and result pipes the real
Supervisor is built on; pool.py: the naive peer (multiprocessing.Pool(N)); cases.py: one case
run both ways, and the standard cases; report.py: `./scripts/bench --simulate`. What it
models and what it does not: SECTION below, which docs/scaling.md carries."""

SECTION = """## Simulation

`./scripts/bench --simulate` (seconds to minutes, no broker, the same figures on every machine;
[simulation.md](simulation.md)) runs the project's real `Supervisor.run()` loop – intake, flow
control, scheduler, results, offset trackers, the C packer, every decision – on a simulated
clock (`scripts/benchkit/sim/`). Only what the supervisor talks to is simulated:

* the Kafka client as librdkafka behaves with the daemon's properties: one fetch in flight,
  whose response lands whole in one queue, a run of up to `max.partition.fetch.bytes` per
  partition (~330 bytes a record), in the order the request named the partitions, the next
  request sent as a response is handled while the queue is under `queued.max.messages.kbytes`;
  `consume(n)` hands out the queue's first n records, whichever partitions they are; a pause
  drops what was queued for the partition, fetched again after the resume; high watermarks as
  the responses said. Records are there at the start (a backlog) or arrive at a given rate;
* the rings (capacity in bytes), the result pipes and the wait for them;
* the workers: each runs its ring's frames in order, a record costing its own time (the case's
  µs × (1 ± 0.3), seeded), plus 20 µs a batch, plus (the "acks" cases) 0.5 ms until the broker
  acknowledges the batch's outputs (~0.45 ms measured against the embedded broker on an idle
  2-core machine, ~1 ms in a loaded run), during which a worker runs its next batch if its
  ring holds one and reports the batch only then (pipelined delivery, as the daemon's
  at-least-once workers do), or else waits.

The supervisor's serial cost is charged to the clock, from its own code measured on this
project's 2-core machine (`./scripts/bench --simulate-calibrate`: the loop run in the
simulator, its thread's CPU time counted, the simulated world's taken out): *sup* µs per record
(of which 0.2 when the record is cut: packing, registering), 8 µs per frame written, 8 per
result read, and per turn of its loop 60 µs + 2 a partition + 4 a worker (184 µs with 32
partitions and 15 workers). While it is busy the workers run; while it waits the clock jumps to
the next result or fetch response. Beside it, a simulated `multiprocessing.Pool(N)`
(`imap_unordered`, chunks of 100, one parent paying the same costs per record, chunk and result,
and a turn per 1,000 records, reading through the same client with librdkafka's defaults) on
the same records. Reported: drain efficiency (the ideal time,
all the work spread evenly over the workers, ÷ the time taken), each worker's busy share, the
supervisor's, lane moves, latency percentiles at an offered load.

What it does not model: the CPU the broker, librdkafka's threads, the workers' producers and
the operating system take from the workers (on 2 cores, most of what separates ringmaster
from `Pool(2)`; the simulated workers have a core each); rebalances, crashes, fencing, commits'
round trips; contention for memory bandwidth and caches (a lane that moves pays nothing for a
cold cache: on the 2-core machine a move cost ~1-3 ms of its worker's time, lost in the noise
of a loaded host, and lanes moved 5-10 times in runs of 220-420 batches,
`scripts/bench_lane_moves.py`, performance.md). Read its figures as what the scheduling
decisions allow, not as a host's throughput.

Against reality (issue 41): until the client was modelled, `consume()` handed out up to 500
records of every partition in turn, as soon as they existed, and each turn cost 10 µs. An
independent simulator with a queue of fetch responses put the loop below its floors, and it
was right: a `consume()` that returns a full 2,000 records leaves leftovers that the loop waited
on while workers starved (0.52 of ideal at ~10 µs a record), and in `partition` ordering the
client's runs of ~3,000 records of one partition meant the 15th partition's first record came
45,000 records in (all 15 workers busy only after ~90 ms). On the 16-core host's sweep
(scaling-16-cores.md), whose runs lasted ~0.35 s, this model gave `partition` 0.86× and 0.70×
`Pool(15)` with 32 and 16 partitions before the loop's fixes (the host: 0.89-0.92× and
0.79-0.92×, 2 runs each, a noisy machine), where the old one gave 0.95-0.96 of ideal, and gives
0.85× and 0.84× after them: what the host showed was the client's queue and short runs, not
the cost of a lane moving. A few of its cases are floors in
`tests/unit/test_sim_floors.py`: deterministic, so a scheduler change that drops one fails there,
on any machine.
"""
