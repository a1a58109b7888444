"""runtime/store: versioned stores on disk (ingest, versions, transposes) and atomic save
targets."""
