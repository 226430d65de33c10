"""Airflow glue: the EpochTimetable, the DAG factory and the task callables.

Imported by ``dags/`` and ``plugins/`` at parse time, so nothing here imports
pyspark, boto3 or pandas at module level (ruff's TID253 enforces it in the DAG
folders; these modules follow the same rule by hand).
"""
