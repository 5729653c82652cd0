"""Which keys hold secrets, and settings shown with their secrets replaced (what ``ringmaster
check`` prints, and what the runtime logs of client properties). Runs in: the CLI and the
supervisor.
"""

from __future__ import annotations

import re
from typing import Any

# Keys whose values are secrets, in librdkafka properties (ssl.key.password, ssl.key.pem, ssl_key,
# ssl.keystore.password, sasl.password, sasl.oauthbearer.config, ...client.secret,
# ...assertion.private.key.passphrase/.pem), Java-style and schema-registry properties
# (sasl.jaas.config, ssl.keystore.key, basic.auth.user.info), Spark/Hadoop conf (fs.s3a.access.key,
# fs.azure.account.key.*) and plugin settings (api_key, auth_token, private_key, ...).
_SECRET_KEY = re.compile(
    r"password|passwd|passphrase|secret|token|credential|jaas|oauthbearer\.config|user\.info"
    r"|(api|private|access|account|keystore)[._-]?key|^ssl[._]key$|\.pem$", re.I)
# ... except where the value only says where a secret is (a path, a URL) or is a public id or a
# count: ssl.key.location, sasl.oauthbearer.assertion.private.key.file, ...token.endpoint.url,
# ...client.credentials.client.id, a plugin's tokenizer or max_tokens.
_NOT_SECRET = re.compile(r"[._-](location|file|path|url|client[._-]id)$|tokeni[sz]|(max|min|num)[._-]?tokens",
                         re.I)


def is_secret_key(key: str) -> bool:
    """Whether a key (a librdkafka/Spark property or a plugin setting) holds a secret."""
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET.search(key)


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """Settings as plain data (``effective_settings``, runtime/kafka/properties.py), with every
    secret value replaced: what ``ringmaster check`` prints."""

    def scrub(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: ("***" if is_secret_key(str(k)) else scrub(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [scrub(v) for v in node]
        return node

    scrubbed: dict[str, Any] = scrub(data)  # a dict in, a dict out
    return scrubbed
