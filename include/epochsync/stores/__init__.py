"""Object stores: connections to S3 endpoints."""
