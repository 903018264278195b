"""Work notices: what external schedulers (and the driver itself) publish to get a novel moving."""

from novelbus.messages.base import Message


class WorkNotice(Message, tag="work.notice", frozen=True):
    novel_id: str
    notice_id: str
    reason: str = "schedule"


WorkMessage = WorkNotice
