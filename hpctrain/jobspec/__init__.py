"""The YAML job spec: models, loading, cluster profiles."""
