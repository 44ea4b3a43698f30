"""The release spec: its YAML reading, JSON Schema, field declarations and checks."""
