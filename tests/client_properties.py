"""The client.properties a Kafka user passes to Kafka's tools (``--command-config``), for the CLI tests in
tests/unit and tests/integration: Java client names, ``sasl.jaas.config`` on continuation lines, a PEM
trust store."""

from __future__ import annotations

from pathlib import Path


def sasl_ssl_scram_properties(path: Path, ca: Path, password: str = "alice-secret", extra: str = "") -> Path:
    """Writes ``path``: SASL_SSL with SCRAM-SHA-512 as user alice, the CA in ``ca``, then the lines ``extra``."""
    path.write_text(f"""# SASL_SSL with SCRAM, for Kafka's tools
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
    username="alice" \\
    password="{password}";
ssl.truststore.type=PEM
ssl.truststore.location={ca}
{extra}""")
    return path
