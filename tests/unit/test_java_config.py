"""Java client TLS/SASL properties mapped to oncelog's client (oncelog.client.java_config): the mapping
behind ``--command-config`` and the Spark connector's ``kafka.*`` options. Pure: no broker."""

from __future__ import annotations

import pytest

from oncelog.client.config import ConfigError
from oncelog.client.java_config import from_java, parse_jaas

PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


@pytest.mark.parametrize("jaas, user, password", [
    (f'{PLAIN} required username="alice" password="alice-secret";', "alice", "alice-secret"),
    (f"{SCRAM} required username='bob' password='b=o;b pw' ;", "bob", "b=o;b pw"),
    (f"{SCRAM}  REQUIRED\n  username=carol\n  password=c4rol;", "carol", "c4rol"),  # bare values, any case flag
    (f'{PLAIN} required /* a comment */ username="d" // another\n password="x\\"y";', "d", 'x"y'),
])
def test_jaas_config_becomes_sasl_username_and_password(jaas: str, user: str, password: str) -> None:
    assert from_java({"sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": jaas}) == {
        "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": password}


@pytest.mark.parametrize("jaas, message", [
    (f'{PLAIN} required username="a" password="b"', "not terminated by a semicolon"),
    (f"{PLAIN}", "control flag not specified"),
    (f'{PLAIN} mandatory username="a";', "invalid login module control flag 'mandatory'"),
    (f"{PLAIN} required username=;", "value not specified for key 'username'"),
    (f'{PLAIN} required username="a";', "password not given"),
    ("", "login module not specified"),
    (f'{PLAIN} required username="a" password="b"; {SCRAM} required username="a" password="b";',
     "2 login modules given, expected 1"),
    ('com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;', "Krb5LoginModule is not supported"),
    (f'{SCRAM} required username="a" password="b" tokenauth=true;', "tokenauth=true"),
])
def test_bad_jaas_config(jaas: str, message: str) -> None:
    with pytest.raises(ConfigError, match="sasl.jaas.config") as err:
        from_java({"sasl.jaas.config": jaas})
    assert message in str(err.value)


def test_jaas_config_and_sasl_username_conflict() -> None:
    with pytest.raises(ConfigError, match="either sasl.jaas.config or sasl.username"):
        from_java({"sasl.jaas.config": f'{PLAIN} required username="a" password="b";', "sasl.username": "a"})


def test_parse_jaas_keeps_every_entry_and_option() -> None:
    assert parse_jaas(f'{PLAIN} optional a="1" b=2; x.Y sufficient;') == [
        (PLAIN, "optional", {"a": "1", "b": "2"}), ("x.Y", "sufficient", {})]


def test_pem_stores_map_to_librdkafka_names() -> None:
    got = from_java({"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem",
                     "ssl.keystore.type": "pem", "ssl.keystore.location": "/me.pem", "ssl.key.password": "k",
                     "ssl.endpoint.identification.algorithm": ""})
    assert got == {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/me.pem",
                   "ssl.key.password": "k", "ssl.endpoint.identification.algorithm": ""}


def test_other_keys_pass_through_unchanged() -> None:
    props = {"linger.ms": "7", "client.id": "x", "ssl.ca.location": "/ca.pem", "no.such.key": "1"}
    assert from_java(props) == props


@pytest.mark.parametrize("props, message", [
    # Kafka's default store type is JKS: a Java trust store file is refused, naming the PEM way
    ({"ssl.truststore.location": "/t.jks"}, "a JKS trust store is not supported"),
    ({"ssl.truststore.location": "/t.jks", "ssl.truststore.password": "changeit"}, "ssl.truststore.type=PEM"),
    ({"ssl.truststore.type": "PKCS12", "ssl.truststore.location": "/t.p12"}, "ssl.ca.location"),
    ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "/t.pem", "ssl.truststore.password": "x"},
     "ssl.truststore.password cannot be set with ssl.truststore.type=PEM"),
    ({"ssl.truststore.type": "BKS"}, "ssl.truststore.type: invalid value 'BKS'"),
    ({"ssl.truststore.certificates": "-----BEGIN CERTIFICATE----- ..."}, "put the CA certificates in a PEM file"),
    ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "/t.pem", "ssl.ca.location": "/c.pem"},
     "either ssl.truststore.location or ssl.ca.location"),
    ({"ssl.keystore.location": "/k.jks", "ssl.keystore.password": "x"}, "ssl.certificate.location and ssl.key.location"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/k.pem", "ssl.keystore.password": "x"},
     "the key's password is ssl.key.password"),
    ({"ssl.keystore.key": "-----BEGIN PRIVATE KEY----- ..."}, "not supported"),
    ({"ssl.truststore.password": "x"}, "ssl.truststore.location is not"),
])
def test_java_key_stores_are_refused_with_the_pem_alternative(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        from_java(props)
    assert message in str(err.value)
