"""The ILLEGAL_SASL_STATE answer to a request other than SaslAuthenticate after a SaslHandshake v1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oncelog.broker.dispatch import _illegal_sasl_state
from oncelog.broker.handlers import HANDLERS
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import encode_response, response_type

CASES = [(key, v) for key, h in sorted(HANDLERS.items()) for v in range(h.min_version, h.max_version + 1)]


@pytest.mark.parametrize("api_key,version", CASES)
def test_every_answer_encodes_and_carries_the_error(api_key: int, version: int) -> None:
    request = SimpleNamespace(topics=(SimpleNamespace(name="t", topic_id=None),))
    body = _illegal_sasl_state(api_key, version, request)
    if body is None:  # no top-level error code: the connection is closed unanswered
        assert "error_code" not in response_type(api_key, version).__dataclass_fields__
        return
    entity = materialize(response_type(api_key, version), body)
    assert len(encode_response(entity)) > 0
    if api_key == 3:  # Metadata: on the requested topic
        assert [(int(t.error_code), t.name) for t in entity.topics] == [(34, "t")]
    else:
        assert int(entity.error_code) == 34


def test_metadata_for_all_topics_answers_no_topic() -> None:
    entity = materialize(response_type(3, 12), _illegal_sasl_state(3, 12, SimpleNamespace(topics=None)))
    assert entity.topics == () and entity.brokers == ()
