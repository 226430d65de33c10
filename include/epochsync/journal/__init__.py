"""Safety of a target's writes: the undo journal, fault injection and the one-writer lease."""
