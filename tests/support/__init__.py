"""Builders the tests share: simulated histories and their ground truth, an Airflow stack, a headless browser.

Importable as ``support.<module>`` (``pythonpath = ["tests"]`` in ``pyproject.toml``): no test imports another test.
"""
