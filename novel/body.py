"""The commit body as the domain sees it: the wire contract's one schema (`messages.body`),
re-exported here so the pure core and its users name it where they work with it."""

from novelbus.messages.body import CanonChange, CanonKind, CommitArgs, CommitBody, SceneCompletion

__all__ = ["CanonChange", "CanonKind", "CommitArgs", "CommitBody", "SceneCompletion"]
