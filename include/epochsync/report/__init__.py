"""Where each replica is and how it got there: ``status``, ``report`` and ``changes``."""
