"""SQL backends: schema, worker registry, segment store (SQLAlchemy Core)."""
