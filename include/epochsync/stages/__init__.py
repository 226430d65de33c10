"""The pipeline's stages in the order the epoch DAG runs them: ingest, merge, translate, apply, verify, commit."""
