"""kafka-ringmaster: a supervisor that fans Kafka partitions over shared-memory rings to
worker processes running a plugin, and commits only what was fully handled."""

__version__ = "0.1.0"
