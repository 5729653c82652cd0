"""The one error hierarchy. Every message says what is wrong and what to do about it."""

from __future__ import annotations


class RingmasterError(Exception):
    """Base of every error the runtime raises on purpose."""

    exit_code = 1


class ConfigError(RingmasterError):
    """The configuration file or an environment override is invalid."""

    exit_code = 2


class PluginError(RingmasterError):
    """The plugin module cannot be imported or does not honour the contract."""

    exit_code = 3


class SharedMemoryError(RingmasterError):
    """Shared memory cannot be created (no space in /dev/shm, permissions...)."""

    exit_code = 4


class KafkaError(RingmasterError):
    """The Kafka client reported a fatal error."""

    exit_code = 5


class WorkerCrashLoop(RingmasterError):
    """Workers die before doing any work, again and again: stop instead of spinning."""

    exit_code = 6


class FrameError(RingmasterError):
    """A frame on a ring or a result pipe could not be decoded."""


class RingFull(RingmasterError):
    """Backpressure: the ring has no room for this frame now (not a failure)."""


class FrameTooLarge(RingmasterError):
    """A single frame can never fit in the ring, whatever the reader does."""
