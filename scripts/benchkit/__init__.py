"""Benchmark harness for scripts/bench: the same records and the same work function run
through a plain consumer loop, multiprocessing.Pool, sentry-arroyo and ringmaster."""
