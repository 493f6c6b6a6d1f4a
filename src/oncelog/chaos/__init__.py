"""The transactional-copy chaos suite (``oncelog chaos``), after Kafka's ``transactions_test.py``.

:mod:`oncelog.chaos.copier` is one consume-transform-produce copier process
(confluent-kafka or kafka-python); :mod:`oncelog.chaos.runner` seeds the
input, runs the copiers, injects a seeded schedule of faults (broker and
copier bounces, hard and clean, and fault-proxy bursts) and audits the copy
with :mod:`oncelog.verify`. See docs/chaos.md.
"""
