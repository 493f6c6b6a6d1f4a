"""parse_properties reads a properties file the way java.util.Properties.load does (Kafka's broker and
tools read server.properties and --command-config files with it). The expected values were checked
against Java 17's Properties.load (values then trimmed, as Kafka's ConfigDef trims them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog.broker.config import BrokerConfig, ConfigError, parse_properties
from oncelog.cli import _command_config, main

TEXT = (
    "# a comment ending in a backslash does not continue \\\n"
    "key1=value\n"
    "   key2 value\n"
    "key3:value\n"
    "key4 = value   \n"
    "  ! another comment\n"
    "e\\=mc2=yes\n"
    "multi=one \\\n"
    "   two \\\n"
    "\t three\n"
    "motor=motor\\\n"
    "cycle\n"
    "a\\ b = c\\td\n"
    "k = =x\n"
    "tab\tx\n"
    "empty\n"
    "colon:=v\n"
    "esc=\\\\\\\\ \\z\n"
    "uni=caf\\u00e9 \\u0041\n"
    "crlf=a\r\nlone_cr=b\rform\ffeed=c\n"
    "cont_comment=x\\\n"
    "  # not a comment here\n"
    "\n"
    "end=last\\"
)

EXPECTED = {
    "key1": "value", "key2": "value", "key3": "value", "key4": "value", "e=mc2": "yes",
    "multi": "one two three", "motor": "motorcycle", "a b": "c\td", "k": "=x", "tab": "x", "empty": "",
    "colon": "=v", "esc": "\\\\ z", "uni": "café A", "crlf": "a", "lone_cr": "b", "form": "feed=c",
    "cont_comment": "x# not a comment here", "end": "last",
}


def test_java_properties_load_rules() -> None:
    assert parse_properties(TEXT) == EXPECTED


@pytest.mark.parametrize("line", ["p=\\u00e", "p=\\u00zz", "p=x\\u"])
def test_malformed_unicode_escape_is_a_config_error(line: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_properties(line)
    assert str(info.value) == "malformed \\uxxxx escape in the value of p"  # the value may be a secret


def test_malformed_unicode_escape_in_a_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_properties("a\\u12g=1")
    assert str(info.value) == "malformed \\uxxxx escape \\u12g in a properties key"


def jaas(password: str) -> str:
    return ("listeners=SASL_PLAINTEXT://127.0.0.1:9094\nsasl.enabled.mechanisms=PLAIN\n"
            "listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain."
            f'PlainLoginModule required username="u" password="{password}" user_u="{password}";\n')


@pytest.mark.parametrize("written, password", [("caf\\u00e9", "café"), ("a\\\\\\\\b", "a\\b"), ("x\\y", "xy")])
def test_broker_sasl_password_with_java_escapes(written: str, password: str) -> None:
    cfg = BrokerConfig.from_properties(parse_properties(jaas(written)))
    assert cfg.security.sasl.users == {"u": password}


@pytest.mark.parametrize("written, password", [("caf\\u00e9", "café"), ("a\\\\\\\\b", "a\\b")])
def test_command_config_sasl_password_with_java_escapes(tmp_path: Path, written: str, password: str) -> None:
    f = tmp_path / "client.properties"
    f.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                 "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                 f'username="u" password="{written}";\n', encoding="utf-8")
    conf = _command_config(str(f))
    assert (conf["sasl.username"], conf["sasl.password"]) == ("u", password)


def test_command_config_malformed_escape_is_one_line_exit_2(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "client.properties"
    f.write_text("client.id=\\u12\n", encoding="utf-8")
    code = main(["topics", "list", "--bootstrap", "127.0.0.1:9", "--command-config", str(f)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"error: --command-config {f}: malformed \\uxxxx escape in the value "
                                        "of client.id"]


def test_format_properties_round_trips() -> None:
    from oncelog.broker.config import format_properties

    props = {"a": "x\\y", "b c": "  lead", "k=:#!": "#v!", "t": "tab\there\nnl\rcr\fff", "u": "café",
             "jaas": 'M required user_bob="b=o,b pw" q="a\\"b";', "": "", "end": "trail\\"}
    text = format_properties(props)
    assert parse_properties(text) == {**props, "b c": "lead"}  # values are trimmed as Kafka trims them


@pytest.mark.parametrize("text, expected", [
    ("a=1\n\\\n\\\n# comment\n", {"a": "1"}),  # a lone backslash continued onto a comment line: a comment
    ("\\\n!x\nb=2", {"b": "2"}),
    ("\\\r\n\r\nb=2", {"b": "2"}),  # ... onto a blank line: a blank line
    ("a=1\n\\\n", {"a": "1", "": ""}),  # ... onto the very end: an empty key, as Java's reader gives
    ("a=1\n\\\r", {"a": "1", "": ""}),
    ("a=1\n\\\r\n", {"a": "1"}),
    ("a=1\n\\", {"a": "1", "": ""}),
    (":x\n \\\n  ", {"": "x"}),
    ("a\\\n  ", {"a": ""}),
    ("k=v\\\r\n", {"k": "v"}),
])
def test_java_edge_cases(text: str, expected: dict[str, str]) -> None:
    # each checked against Java 17's Properties.load, as were 8500 random texts of these characters
    assert parse_properties(text) == expected
