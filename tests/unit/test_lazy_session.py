"""``epochsync replicate`` opens its Spark session only when a stage asks it for work."""

from epochsync.spark import LazySession, is_connect


class FakeSession:
    def __init__(self):
        self.tags: list[str] = []
        self.range_calls = 0

    def addTag(self, tag):  # noqa: N802
        self.tags.append(tag)

    def removeTag(self, tag):  # noqa: N802
        self.tags.remove(tag)

    def range(self, n):
        self.range_calls += 1
        return n


def test_tagging_does_not_open_the_session_and_the_open_tags_are_replayed():
    opened = []

    def opener():
        opened.append(FakeSession())
        return opened[-1]

    lazy = LazySession(opener)
    lazy.addTag("epochsync-ingest-t-e1")
    lazy.removeTag("epochsync-ingest-t-e1")
    lazy.addTag("epochsync-merge-t-e1")
    assert opened == [] and lazy.opened is None
    assert lazy.range(3) == 3  # the first real call opens it, with the tags still on
    (session,) = opened
    assert lazy.opened is session and session.tags == ["epochsync-merge-t-e1"]
    lazy.removeTag("epochsync-merge-t-e1")
    lazy.addTag("epochsync-apply-t-e1")
    assert session.tags == ["epochsync-apply-t-e1"]
    lazy.range(1)
    assert len(opened) == 1 and session.range_calls == 2
    assert not is_connect(lazy)  # asks the session itself, not the wrapper
