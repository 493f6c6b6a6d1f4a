"""Consumer groups (classic protocol) and committed offsets.

* :mod:`.state`: groups and members (data);
* :mod:`.coordinator`: the sans-IO group coordinator (rules, timers via ``tick``);
* :mod:`.offsets`: the durable store of committed offsets (plain, and transactional ones
  pending until their transaction's marker) and group metadata.
"""

from oncelog.broker.group.coordinator import GroupConfig, GroupCoordinator, append_error, write_error
from oncelog.broker.group.offsets import OffsetAndMetadata, OffsetStore, TopicPartition
from oncelog.broker.group.state import Group, GroupState, Member

__all__ = [
    "Group",
    "GroupConfig",
    "GroupCoordinator",
    "GroupState",
    "Member",
    "OffsetAndMetadata",
    "OffsetStore",
    "TopicPartition",
    "append_error",
    "write_error",
]
