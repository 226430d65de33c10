"""Development tools: the simulator, the oracle, ground truth, embedded servers, the demo and the benchmarks.

Installed with the project, never shipped to Spark executors (only ``epochsync`` is).
"""
