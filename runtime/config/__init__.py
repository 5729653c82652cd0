"""The settings: what a TOML file and ``RINGMASTER__SECTION__KEY`` overrides configure,
validated before anything touches Kafka.

    models.py     one pydantic model per section: each key's type, default, bounds and
                  description, and the checks within a section
    loading.py    the file and the environment overrides read, validated, every problem one
                  line naming the key (and the variable that set it)
    checks.py     checks across sections (exactly-once needs partition order, a share group
                  none, no output topic the daemon reads back, ...) and the values the runtime
                  reads itself (message.max.bytes, the admin endpoint's address)
    redaction.py  which keys hold secrets; settings shown with them replaced

The names other packages use are imported here, so they say ``from runtime.config import
Settings``. The librdkafka properties built from these settings are runtime/kafka/properties.py's.
May import: runtime.errors and its layer (runtime.tp, runtime.host, runtime.durations,
runtime.subscription, runtime.java_client).
"""

from runtime.config.checks import (
    check_kafka_source,
    check_plugin_importable,
    check_topic_loops,
    guarantee_problem,
    librdkafka_int,
    max_message_bytes,
    members_problem,
    parse_listen,
    share_group_problems,
)
from runtime.config.loading import ENV_PREFIX, config_keys, load_settings
from runtime.config.models import (
    BROKER_OWNED_UNDER_KIP848,
    SECURITY_PROPERTIES,
    AdminSettings,
    ControlSettings,
    DeadLetterSettings,
    KafkaSecuritySettings,
    KafkaSettings,
    LibrdkafkaValue,
    OutputSettings,
    Settings,
    SparkSettings,
    SupervisorSettings,
    WorkerSettings,
    group_protocol,
)
from runtime.config.redaction import is_secret_key, redacted
from runtime.errors import ConfigError

__all__ = [
    "BROKER_OWNED_UNDER_KIP848", "ENV_PREFIX", "SECURITY_PROPERTIES", "AdminSettings", "ConfigError",
    "ControlSettings", "DeadLetterSettings", "KafkaSecuritySettings", "KafkaSettings", "LibrdkafkaValue",
    "OutputSettings", "Settings", "SparkSettings", "SupervisorSettings", "WorkerSettings",
    "check_kafka_source", "check_plugin_importable", "check_topic_loops", "config_keys", "group_protocol",
    "guarantee_problem", "is_secret_key", "librdkafka_int", "load_settings", "max_message_bytes",
    "members_problem", "parse_listen", "redacted", "share_group_problems",
]
